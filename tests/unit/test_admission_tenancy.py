"""Admission against the tenancy in force: rejected at once, with every reason, rather than waiting forever."""

from __future__ import annotations

import pytest

from services.admission.core import check_against_tenancy
from gpusched_core.quota import load_tenancy
from tests.builders import a_job

TENANCY = load_tenancy("""
version: 1
revision: 3
flavors: [A100-80GB]
units: {mig_slices_per_gpu: {A100-80GB: 7}}
priority_classes: {production: 100, batch: 10}
default_priority_class: batch
tenants:
  - name: acme
    children:
      - name: team-a
        priority_classes: [production, batch]
        quota: {A100-80GB: {nominal: 8}}
      - name: team-b
        priority_classes: [batch]
        quota: {A100-80GB: {nominal: 8}}
""")


@pytest.mark.parametrize(("job", "reasons"), [
    pytest.param(a_job("j").tenant("team-a").priority(100), (), id="allowed-class"),
    pytest.param(a_job("j").tenant("team-b"), (), id="default-class"),
    pytest.param(a_job("j").tenant("team-b").mig("3g.40gb").model("A100-80GB"), (), id="a-mig-slice"),
    pytest.param(a_job("j").tenant("team-b").priority(100),
                 ("priority class 'production' is not allowed for tenant team-b (allowed: batch)",), id="class"),
    pytest.param(a_job("j").tenant("team-z"), ("tenant team-z is not in the tenancy file",), id="unknown-tenant"),
    pytest.param(a_job("j").tenant("acme"), ("tenant acme is not in the tenancy file",), id="an-organisation"),
    pytest.param(a_job("j").tenant("team-b").priority(100).model("H100-80GB"),
                 ("priority class 'production' is not allowed for tenant team-b (allowed: batch)",
                  "GPU model H100-80GB has no quota in the tenancy (flavors: A100-80GB)"), id="every-reason"),
    pytest.param(a_job("j").tenant("team-a").priority_class("production"), (), id="class-by-name"),
    pytest.param(a_job("j").tenant("team-b").priority_class("production"),
                 ("priority class 'production' is not allowed for tenant team-b (allowed: batch)",), id="name-not-allowed"),
    pytest.param(a_job("j").tenant("team-a").priority_class("system-critical"),
                 ("priority class 'system-critical' does not exist (the tenancy has: batch, production)",),
                 id="unknown-class-name"),
])
def test_the_tenancy_refuses_what_a_tenant_may_never_run(job, reasons):
    assert check_against_tenancy("j", job.spec(), TENANCY) == reasons


def test_a_priority_class_by_name_becomes_its_value():
    from gpusched_core.submission import with_priority_class
    spec = a_job("j").tenant("team-a").priority_class("production").spec()
    assert with_priority_class(spec, TENANCY).priority == 100
