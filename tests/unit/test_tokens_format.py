"""API tokens without a database: their format, their hash, durations, and the role/tenant binding rule."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest

from gpusched_common import tokens
from gpusched_core.access.principal import Role


def test_a_new_token_is_gst_id_secret_and_its_id_parses_back():
    token_id, text = tokens.new_token()
    prefix, rest = text[:4], text[4:]
    assert prefix == "gst_" and rest.startswith(f"{token_id}_")
    assert len(token_id) == 16 and int(token_id, 16) >= 0
    assert len(rest) - len(token_id) - 1 == 43  # 32 random bytes, urlsafe base64 without padding
    assert tokens.parse_token(text) == token_id


def test_two_tokens_share_neither_id_nor_secret():
    (id1, t1), (id2, t2) = tokens.new_token(), tokens.new_token()
    assert id1 != id2 and t1[21:] != t2[21:]


def test_the_hash_is_the_sha256_hex_of_the_whole_token():
    _, text = tokens.new_token()
    assert tokens.token_hash(text) == hashlib.sha256(text.encode()).hexdigest()
    assert len(tokens.token_hash(text)) == 64 and text not in tokens.token_hash(text)


@pytest.mark.parametrize("text", [
    "", "gst_", "gst_0123456789abcdef", "gst_0123456789abcdef_", "xyz_0123456789abcdef_" + "a" * 43,
    "gst_0123456789ABCDEF_" + "a" * 43, "gst_0123456789abcde_" + "a" * 43, "gst_0123456789abcdef_" + "a" * 42,
    "gst_0123456789abcdef_" + "a" * 44, "gst_0123456789abcdef_" + "a" * 42 + "=", " gst_0123456789abcdef_" + "a" * 43,
    "Bearer gst_0123456789abcdef_" + "a" * 43, "gst_0123456789abcdef_" + "a" * 10_000,
], ids=lambda t: repr(t[:40]))
def test_a_malformed_token_has_no_id(text):
    assert tokens.parse_token(text) is None


def test_a_secret_may_hold_the_urlsafe_separators():
    assert tokens.parse_token("gst_0123456789abcdef_" + "_-" * 21 + "a") == "0123456789abcdef"


@pytest.mark.parametrize(("text", "expected"), [
    ("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), ("90m", timedelta(minutes=90)),
    ("1d", timedelta(days=1)), (" 7d ", timedelta(days=7)),
])
def test_durations_parse(text, expected):
    assert tokens.parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "0d", "-1d", "1.5h", "30s", "30 d", "1w", "30D", "1e3d"])
def test_a_bad_duration_says_what_a_good_one_looks_like(text):
    with pytest.raises(ValueError, match=r"positive whole number of m, h or d \(e\.g\. 90m, 12h, 30d\)"):
        tokens.parse_duration(text)


@pytest.mark.parametrize(("role", "tenant"), [
    ("user", "research"), ("tenant-admin", "research"), ("viewer", None), ("operator", None)])
def test_each_role_takes_a_tenant_exactly_when_it_is_a_tenant_s_role(role, tenant):
    assert tokens.checked_role(role, tenant, "ci") == Role(role)


@pytest.mark.parametrize(("role", "tenant", "name", "message"), [
    ("admin", "research", None, "unknown role 'admin'; one of user, tenant-admin, viewer, operator"),
    ("user", None, None, "role user is bound to a tenant"),
    ("tenant-admin", None, None, "role tenant-admin is bound to a tenant"),
    ("viewer", "research", None, "role viewer is cluster-wide and takes no tenant, got 'research'"),
    ("operator", "research", None, "role operator is cluster-wide"),
    ("user", "bad tenant", None, "invalid tenant id 'bad tenant'"),
    ("user", "", None, "invalid tenant id ''"),
    ("operator", None, "-ci", "invalid token name '-ci'"),
    ("operator", None, "a/b", "invalid token name 'a/b'"),
], ids=lambda v: str(v))
def test_a_bad_request_is_a_value_error_that_says_why(role, tenant, name, message):
    with pytest.raises(ValueError, match=message):
        tokens.checked_role(role, tenant, name)


def test_a_refusal_says_why_and_never_carries_the_token():
    refusal = tokens.TokenRefusal(tokens.RefusalReason.EXPIRED)
    assert str(refusal) == "API token refused: expired"
    assert set(vars(refusal)) == {"reason"}


def test_the_subject_names_the_token_s_id_and_name():
    assert tokens.subject_of("0123456789abcdef", "ci") == "token:0123456789abcdef:ci"
    assert tokens.subject_of("0123456789abcdef", None) == "token:0123456789abcdef"
