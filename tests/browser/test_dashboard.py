"""The dashboard in a real headless Chromium against the whole local stack (every service a process, a
real broker and PostgreSQL): a tenant's user signs in and sees only its tenant's jobs; an operator sees
every node; a job submitted from the CLI appears in the open job list and goes Running without a reload;
it is cancelled from its page (with confirmation); a preempted job's page says why; an operator replays
the history under two policies from the History page's What-if panel. Each page is screenshotted into
bench-results/screenshots/."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from gpusched.config import read_config
from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from gpusched_common import tokens
from gpusched_common.db import connect
from tests.browser.conftest import screenshot
from tests.builders import a_job
from tests.e2e.test_pipeline import job_view
from tests.e2e.test_preemption import LOW_PRIORITY_JOB, wait_for_status

STACK_ENV = {"GPUSCHED_PREEMPTION_GRACE_S": "5", "GPUSCHED_PREEMPTION_MIN_RUNTIME_S": "0"}
WAIT_S = 60


async def token_for(local_stack, role: str, tenant: str | None) -> str:
    conn = await connect(local_stack.database_url)
    try:
        text, _ = await tokens.issue(conn, role=role, tenant=tenant, name=f"{role}-{tenant or 'all'}-browser",
                                     expires_at=None, created_by="test", now=datetime.now(UTC))
    finally:
        await conn.close()
    return text


def operator_token(local_stack) -> str:
    return read_config(Path(local_stack.config_path))["token"]


def sign_in(driver, gateway: str, token: str, then: str = "/ui/") -> None:
    driver.delete_all_cookies()
    driver.get(f"{gateway}/ui/signin?next={then}")
    field = driver.find_element(By.ID, "token")
    field.send_keys(token)
    driver.find_element(By.ID, "signin-submit").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: "/ui/signin" not in d.current_url)
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element(By.ID, "identity").text.strip())


def rows(driver) -> dict[str, str]:
    """The job rows drawn now, id -> state (read in one script: the virtualised list redraws rows)."""
    return driver.execute_script(
        "const out = {}; for (const r of document.querySelectorAll('[data-job]'))"
        " out[r.dataset.job] = r.dataset.state; return out;")


def until(driver, check, what: str, timeout_s: float = WAIT_S):
    """Wait for ``check``; a timeout says what was awaited, where the browser was and what it showed."""
    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.2,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                             ).until(lambda d: check(d))
    except TimeoutException:
        shown = driver.execute_script("return (document.getElementById('view') || document.body).innerText")
        raise AssertionError(f"{what}: not so after {timeout_s}s at {driver.current_url}; the page shows:\n"
                             f"{(shown or '')[:1500]}\nJavaScript errors: {driver.errors()[-10:]}") from None


async def test_a_tenant_s_user_signs_in_and_sees_only_its_tenant_s_jobs(local_stack, stack_settings, page):
    async with Client(stack_settings) as client:
        ours = [await client.submit(a_job("x").tenant("research").gpus(1).name("ours").command("true").spec())
                for _ in range(3)]
        theirs = await client.submit(a_job("x").tenant("inference").gpus(1).name("theirs").command("true").spec())
    await wait_until_finished(local_stack.database_url, [*ours, theirs], timeout_s=WAIT_S, interval_s=0.2)

    page.get(f"{local_stack.gateway}/ui/jobs")  # not signed in: sent to sign in, then back
    until(page, lambda d: "/ui/signin" in d.current_url, "an anonymous page is sent to the sign-in page")
    screenshot(page, "signin")
    sign_in(page, local_stack.gateway, await token_for(local_stack, "user", "research"), "/ui/jobs")
    until(page, lambda d: set(ours) <= set(rows(d)), "the tenant's jobs are listed")
    listed = rows(page)
    assert theirs not in listed and all(listed[j] == "Succeeded" for j in ours), listed
    conn = await connect(local_stack.database_url)
    try:
        research = {r["job_id"] for r in await conn.fetch("SELECT job_id FROM jobs WHERE tenant = 'research'")}
    finally:
        await conn.close()
    assert set(listed) <= research, set(listed) - research  # nothing of another tenant, whatever was loaded
    assert not page.find_element(By.ID, "nav-cluster").is_displayed()  # a user may not read nodes
    screenshot(page, "jobs-tenant-user")
    page.get(f"{local_stack.gateway}/ui/jobs/{theirs}")  # another tenant's job: the API's 404, shown
    until(page, lambda d: "not" in d.find_element(By.ID, "view").text.lower(), "the page says the job is not found")
    assert "theirs" not in page.find_element(By.ID, "view").text


async def test_an_operator_sees_every_node_and_gpu(local_stack, page):
    sign_in(page, local_stack.gateway, operator_token(local_stack), "/ui/cluster")
    until(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, "[data-node]")) == 2, "both nodes are drawn")
    until(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".gpu-cell")) == 16, "every GPU is a cell")
    nodes = {n.get_attribute("data-node") for n in page.find_elements(By.CSS_SELECTOR, "[data-node]")}
    conn = await connect(local_stack.database_url)
    try:
        assert nodes == {r["node_id"] for r in await conn.fetch("SELECT node_id FROM nodes")}
    finally:
        await conn.close()
    screenshot(page, "cluster")


async def test_a_job_submitted_from_the_cli_appears_and_goes_running_without_a_reload(local_stack, page):
    sign_in(page, local_stack.gateway, operator_token(local_stack), "/ui/jobs")
    until(page, lambda d: rows(d), "the job list is drawn")
    page.execute_script("window.__sameDocument = 'still here';")
    env = {**os.environ, "GPUSCHED_SERVER": local_stack.gateway, "GPUSCHED_TOKEN": operator_token(local_stack)}
    submitted = subprocess.run(
        [sys.executable, "-m", "gpusched_cli.main", "submit", "--tenant", "research", "--gpus", "1",
         "--gpu-model", "H100-80GB", "--name", "from-the-cli", "--json", "--", "sleep", "120"],
        capture_output=True, text=True, env=env, timeout=60, check=True)
    import json  # noqa: PLC0415
    job_id = json.loads(submitted.stdout)["job_id"]
    until(page, lambda d: job_id in rows(d), "the new job appears in the open list")
    until(page, lambda d: rows(d).get(job_id) == "Running", "the job goes Running in the open list")
    assert page.execute_script("return window.__sameDocument") == "still here"  # no reload happened
    screenshot(page, "jobs-live")

    page.find_element(By.CSS_SELECTOR, f"[data-job='{job_id}'] a").click()  # its page, then cancel it
    until(page, lambda d: d.find_element(By.ID, "job-state").text.strip() == "Running", "the job page shows Running")
    assert page.execute_script("return window.__sameDocument") == "still here"  # in-app navigation
    page.find_element(By.ID, "action-cancel").click()
    until(page, lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is not None, "asked to confirm")
    page.find_element(By.ID, "confirm-yes").click()
    until(page, lambda d: d.find_element(By.ID, "job-state").text.strip() == "Cancelled", "the page shows Cancelled")
    assert (await job_view(local_stack.database_url, job_id))["status"] == "Cancelled"
    screenshot(page, "job-cancelled")


async def test_a_running_job_s_page_tails_its_log_live(local_stack, stack_settings, page):
    script = "echo first-line-of-the-job; sleep 4; echo a-later-line; sleep 1"
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("x").tenant("research").gpus(1).name("talker").command("sh", "-c", script).spec())
    sign_in(page, local_stack.gateway, operator_token(local_stack), f"/ui/jobs/{job_id}")
    until(page, lambda d: "first-line-of-the-job" in d.find_element(By.ID, "log").text, "the log shows the job's output")
    assert "a-later-line" not in page.find_element(By.ID, "log").text  # then it comes, without a reload
    until(page, lambda d: "a-later-line" in d.find_element(By.ID, "log").text, "a later line is appended")
    screenshot(page, "job-log")
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=WAIT_S, interval_s=0.3)


async def test_a_preempted_job_s_page_says_why(local_stack, stack_settings, page):
    low = a_job("x").tenant("research").gpus(2).model("H100-80GB").priority(0).command("sh", "-c", LOW_PRIORITY_JOB)
    async with Client(stack_settings) as client:
        lows = [await client.submit(low.name(f"low-{i}").spec()) for i in range(4)]
        await wait_for_status(local_stack.database_url, lows, "Running")
        await asyncio.sleep(0.6)
        high = await client.submit(a_job("x").tenant("inference").gpus(4).model("H100-80GB").priority(100)
                                   .name("urgent").command("sleep", "1").spec())
    await wait_until_finished(local_stack.database_url, [high], timeout_s=90, interval_s=0.3)
    victims = [j for j in lows if "JobPreempted" in [e["type"] for e in (await job_view(local_stack.database_url, j))["events"]]]
    assert victims, "no low-priority job was preempted"
    sign_in(page, local_stack.gateway, operator_token(local_stack), f"/ui/jobs/{victims[0]}")
    reason = until(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".preempted-reason"), "the preemption is shown")
    assert high in " ".join(r.text for r in reason), [r.text for r in reason]
    screenshot(page, "job-preempted")
    await wait_until_finished(local_stack.database_url, lows, timeout_s=90, interval_s=0.5)


async def test_the_queues_and_history_pages_draw_from_the_gateway_s_data(local_stack, page):
    sign_in(page, local_stack.gateway, operator_token(local_stack), "/ui/queues")
    until(page, lambda d: "research" in d.find_element(By.ID, "view").text, "the tenants' quota is drawn")
    screenshot(page, "queues")
    page.find_element(By.ID, "nav-history").click()
    until(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#view svg"), "the history charts are drawn")
    screenshot(page, "history")
    page.find_element(By.ID, "nav-cluster").click()
    until(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".gpu-cell"), "back on the cluster page")
    page.find_element(By.ID, "signout").click()
    until(page, lambda d: "/ui/signin" in d.current_url, "signed out")
    page.get(f"{local_stack.gateway}/ui/jobs")
    until(page, lambda d: "/ui/signin" in d.current_url, "the cookie is gone: signed out for good")


def whatif_tables(driver) -> dict[str, list[str]]:
    """The runs and the tenants the What-if panel's tables show (read in one script)."""
    return driver.execute_script(
        "const out = {runs: [], tenants: []};"
        " for (const r of document.querySelectorAll('#whatif-runs tbody tr')) out.runs.push(r.dataset.run);"
        " for (const r of document.querySelectorAll('#whatif-tenants tbody tr')) out.tenants.push(r.dataset.tenant);"
        " return out;")


async def test_an_operator_replays_the_history_under_two_policies_from_the_history_page(local_stack, page):
    sign_in(page, local_stack.gateway, operator_token(local_stack), "/ui/history")
    until(page, lambda d: d.find_element(By.ID, "whatif-form").is_displayed(), "the what-if form is drawn")
    Select(page.find_element(By.ID, "whatif-window")).select_by_value("1d")
    for policy in ("ours", "fgd", "bestfit", "random"):
        box = page.find_element(By.ID, f"whatif-policy-{policy}")
        if box.is_selected() != (policy in ("ours", "bestfit")):
            box.click()
    page.find_element(By.ID, "whatif-run").click()
    shown = until(page, lambda d: (t := whatif_tables(d))["runs"] and t, "the what-if's tables are drawn", 120)
    assert sorted(shown["runs"]) == ["bestfit", "ours"], shown
    assert {"research", "inference"} <= set(shown["tenants"]), shown  # the tenants of the jobs run above
    assert "jobs replayed since" in page.find_element(By.ID, "whatif-status").text
    screenshot(page, "history-whatif")
