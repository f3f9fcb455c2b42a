"""The dashboard's session rules: the CSRF token is bound to the session's token, cookies carry the
attributes browsers need to keep them from scripts and other sites, and sign-in redirects stay on /ui."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.dashboard import session


@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=200),
       st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=200))
def test_a_csrf_token_matches_only_its_own_session(one, other):
    assert session.csrf_matches(one, session.csrf_token(one))
    if one != other:
        assert not session.csrf_matches(one, session.csrf_token(other))
    assert not session.csrf_matches(one, None) and not session.csrf_matches(one, "")


def test_the_cookie_is_httponly_strict_and_secure_only_where_asked():
    plain = session.cookie_header("gst_abc", secure=False, max_age_s=600)
    assert plain == "gpusched_session=gst_abc; Max-Age=600; Path=/; HttpOnly; SameSite=Strict"
    assert session.cookie_header("gst_abc", secure=True, max_age_s=600).endswith("; Secure")
    assert "Max-Age=0" in session.cleared_cookie_header(secure=False)


@pytest.mark.parametrize(("token", "refused"), [
    ("gst_0123_abc", None), ("a.b.c", None), ("", "no token given"), ("x" * 9000, "at most 8192"),
    ("has space", "printable ASCII"), ("semi;colon", "printable ASCII"), ('quo"te', "printable ASCII"),
    ("caf\u00e9", "printable ASCII"), ("line\nbreak", "printable ASCII"),
])
def test_only_text_that_can_be_a_bearer_token_goes_into_a_cookie(token, refused):
    problem = session.token_shape_problem(token)
    assert (problem is None) if refused is None else (refused in problem)


@pytest.mark.parametrize(("origin", "referer", "scheme", "host", "same"), [
    ("http://gw:8080", None, "http", "gw:8080", True),
    ("http://GW:8080", None, "http", "gw:8080", True),
    ("https://gw:8080", None, "http", "gw:8080", False),  # another scheme is another origin
    ("http://evil.example", None, "http", "gw:8080", False),
    ("null", None, "http", "gw:8080", False),  # a sandboxed frame or a file
    (None, "http://gw:8080/ui/jobs", "http", "gw:8080", True),
    (None, "http://evil.example/x", "http", "gw:8080", False),
    (None, None, "http", "gw:8080", True),  # no browser page: the CSRF token still has to be right
    ("http://gw:8080", None, "http", None, False),
])
def test_same_origin(origin, referer, scheme, host, same):
    assert session.same_origin(origin, referer, scheme, host) is same


@pytest.mark.parametrize(("asked", "went"), [
    ("/ui/jobs?state=Running", "/ui/jobs?state=Running"), (None, "/ui/"), ("https://evil.example/", "/ui/"),
    ("//evil.example/ui/", "/ui/"), ("/v1/jobs", "/ui/"), ("/ui/\\evil", "/ui/"), ("/ui/x?u=http://e", "/ui/"),
])
def test_after_sign_in_only_dashboard_paths(asked, went):
    assert session.safe_next(asked) == went
