"""Job time limits (pure): durations as people write them, the tenancy's default and maximum (inherited,
checked), the spec's own bounds, the default given at admission, a pod's activeDeadlineSeconds, and the
reason a stopped job ends with."""

from __future__ import annotations

import pytest

from gpusched_common import events as ev
from gpusched_core.agent.stops import stop_error
from gpusched_core.durations import format_duration, parse_duration
from gpusched_core.podspec import PodSpecError, spec_from_pod_yaml
from gpusched_core.quota import TenancyError, load_tenancy
from gpusched_core.submission import AdmissionLimits, check_against_tenancy, check_spec, with_default_time_limit
from tests.builders import a_job

TENANCY = load_tenancy("""
version: 1
tenants:
  - name: acme
    default_time_limit: 2h
    max_time_limit: 1d
    children:
      - name: team-a
        quota: {H100-80GB: {nominal: 8}}
      - name: team-b
        max_time_limit: 30m
        default_time_limit: 10m
        quota: {H100-80GB: {nominal: 8}}
  - name: free
    quota: {H100-80GB: {nominal: 8}}
""")


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("7d", 604800),
                                               ("1h30m", 5400), ("3600", 3600), (45, 45), (2.5, 2.5)])
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "2x", "h", "1.5h", True, 0])
def test_bad_durations_say_what_is_wrong(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(7200, "2h"), (5400, "1h30m"), (45, "45s"), (90061, "1d1h1m1s")])
def test_durations_format(seconds, text):
    assert format_duration(seconds) == text


def test_tenancy_time_limits_are_inherited_and_overridden():
    limits = {name: (t.time_limits.default_s, t.time_limits.max_s) for name, t in TENANCY.tenants.items()}
    assert limits == {"acme": (7200, 86400), "team-a": (7200, 86400), "team-b": (600, 1800), "free": (None, None)}


def test_tenancy_time_limits_are_checked():
    with pytest.raises(TenancyError) as bad:
        load_tenancy("""
version: 1
tenants:
  - name: t
    default_time_limit: 2h
    max_time_limit: 1h
    quota: {H100-80GB: {nominal: 1}}
  - name: u
    max_time_limit: soon
    quota: {H100-80GB: {nominal: 1}}
""")
    assert any("default_time_limit 2h exceeds max_time_limit 1h" in p for p in bad.value.problems)
    assert any("(u): max_time_limit: a duration is" in p for p in bad.value.problems)


def test_a_limit_beyond_the_tenant_s_maximum_is_rejected_with_the_reason():
    long = a_job("j").tenant("team-b").spec().model_copy(update={"time_limit_s": 3600.0})
    assert check_against_tenancy("j", long, TENANCY) == ("time limit 1h exceeds tenant team-b's maximum of 30m",)
    ok = long.model_copy(update={"time_limit_s": 1800.0})
    assert check_against_tenancy("j", ok, TENANCY) == ()


@pytest.mark.parametrize("limit", [0.0, -1.0, 400 * 86400.0])
def test_a_limit_out_of_bounds_is_rejected(limit):
    spec = a_job("j").spec().model_copy(update={"time_limit_s": limit})
    assert any(r.startswith("time_limit_s") for r in check_spec(spec, AdmissionLimits()))


def test_the_tenant_s_default_is_given_to_a_job_that_names_none():
    spec = a_job("j").tenant("team-b").spec()
    assert with_default_time_limit(spec, TENANCY).time_limit_s == 600
    assert with_default_time_limit(spec.model_copy(update={"time_limit_s": 60.0}), TENANCY).time_limit_s == 60
    assert with_default_time_limit(a_job("j").tenant("free").spec(), TENANCY).time_limit_s is None
    assert with_default_time_limit(spec, None).time_limit_s is None


def test_a_pod_s_active_deadline_is_its_time_limit():
    pod = """
kind: Pod
metadata: {name: p, namespace: team-a}
spec:
  activeDeadlineSeconds: 900
  containers: [{name: c, command: [sleep, "1000"], resources: {limits: {nvidia.com/gpu: 1}}}]
"""
    assert spec_from_pod_yaml(pod).time_limit_s == 900
    with pytest.raises(PodSpecError, match="activeDeadlineSeconds"):
        spec_from_pod_yaml(pod.replace("900", "soon"))


def test_a_job_stopped_at_its_limit_says_so():
    assert stop_error(ev.ExitReason.TIME_LIMIT, node_id="n1", gpu_indices=(0,), lease_epoch=1, unhealthy_reasons={},
                      time_limit_s=7200) == "time limit 2h reached"
