from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common.credentials import KEY_ID_HEADER, SIGNATURE_HEADER, TenantKey, key_for, sign, signed_headers, verify
from services.admission.core import check_identity
from gpusched_core.rates import RateLimit, take
from tests.builders import T0

KEYS = {"a1": TenantKey("a1", "team-a", b"s" * 32), "op": TenantKey("op", "*", b"o" * 32)}


def test_a_correct_signature_authenticates_the_keys_tenant():
    assert verify(KEYS, signed_headers(KEYS["a1"], b"body"), b"body").tenant == "team-a"


@pytest.mark.parametrize(("headers", "reason"), [
    pytest.param({}, "missing tenant credential", id="missing"),
    pytest.param({KEY_ID_HEADER: "zz", SIGNATURE_HEADER: "00"}, "unknown credential key 'zz'", id="unknown-key"),
    pytest.param({KEY_ID_HEADER: "a1", SIGNATURE_HEADER: sign(b"wrong", b"body")}, "does not verify", id="forged"),
    pytest.param(signed_headers(KEYS["a1"], b"other body"), "does not verify", id="signed-another-body"),
])
def test_bad_credentials_are_refused_with_a_reason(headers, reason):
    verdict = verify(KEYS, headers, b"body")
    assert verdict.tenant is None and reason in verdict.reason


def test_secrets_do_not_show_in_reprs():
    assert "sss" not in repr(KEYS["a1"])


def test_clients_sign_with_their_own_key_else_an_operator_key():
    assert key_for(KEYS, "team-a").key_id == "a1"
    assert key_for(KEYS, "team-z").key_id == "op"
    assert key_for({}, "team-a") is None


@pytest.mark.parametrize(("spec_tenant", "credential", "reasons"), [
    ("team-a", "team-a", ()),
    ("team-b", "*", ()),
    ("team-b", "team-a", ("tenant 'team-b' does not match the credential's tenant 'team-a'",)),
])
def test_identity(spec_tenant, credential, reasons):
    assert check_identity(spec_tenant, credential, None) == reasons


def test_a_burst_is_allowed_then_the_rate_applies():
    limit = RateLimit(per_s=2, burst=3)
    bucket = None
    results = []
    for _ in range(4):
        allowed, bucket = take(bucket, limit, T0)
        results.append(allowed)
    assert results == [True, True, True, False]
    assert take(bucket, limit, T0 + timedelta(seconds=0.5))[0] is True


@given(st.lists(st.floats(0, 5), max_size=40))
def test_never_more_than_burst_plus_rate_times_elapsed(gaps):
    limit = RateLimit(per_s=3, burst=5)
    bucket, now, allowed = None, T0, 0
    for gap in gaps:
        now += timedelta(seconds=gap)
        ok, bucket = take(bucket, limit, now)
        allowed += ok
    assert allowed <= limit.burst + limit.per_s * sum(gaps) + 1e-9


@pytest.mark.parametrize("secrets_text, says", [
    ({"a": "replace-with-32-random-bytes-base64"}, "placeholder"),
    ({"a": "CHANGE-ME-CHANGE-ME-CHANGE-ME"}, "placeholder"),
    ({"a": "a" * 40}, "placeholder"),
    ({"a": "kq3JXr8vWp2LmN5tY7bC9dF1", "b": "kq3JXr8vWp2LmN5tY7bC9dF1"}, "share one secret"),
])
def test_a_keys_file_with_placeholder_or_shared_secrets_is_refused(tmp_path, secrets_text, says):
    import yaml

    from gpusched_common.credentials import load_keys

    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": {k: {"tenant": k, "secret": v} for k, v in secrets_text.items()}}))
    with pytest.raises(ValueError, match=says):
        load_keys(path)


def test_the_example_keys_file_cannot_be_used_as_it_is():
    from pathlib import Path

    from gpusched_common.credentials import load_keys

    with pytest.raises(ValueError, match="placeholder"):
        load_keys(Path(__file__).parents[2] / "deploy" / "tenant-keys.example.yaml")


def test_a_generated_secret_that_happens_to_read_like_a_placeholder_is_drawn_again(monkeypatch):
    # one random secret in about 13,000 contains "todo" or "xxxx"; a stack written with it could not start (CI, stop 32)
    from gpusched_common import credentials

    draws = iter(["Ab3_kTodo9xQ-Lm2Rt5vWz8pNc1Ye4Hs7Ju0Fg6Di", "Ab3_kTq9xQ-Lm2Rt5vWz8pNc1Ye4Hs7Ju0Fg6Di2k"])
    monkeypatch.setattr(credentials.secrets, "token_urlsafe", lambda n: next(draws))
    assert credentials.new_secret() == "Ab3_kTq9xQ-Lm2Rt5vWz8pNc1Ye4Hs7Ju0Fg6Di2k"
