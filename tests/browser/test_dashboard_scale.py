"""The dashboard at the size the issue names, in the real browsers: 1,000 nodes x 8 GPUs and 10,000 jobs
served by the real gateway process over real PostgreSQL. The nodes are registered through placement's
own handler; the jobs are rows of the jobs read model (what the list reads), written in one statement, and
a third of the GPUs hold allocations. The pages must draw every node and load every job while keeping only
the visible rows in the document (virtualised lists), and the last node and job must be reachable by
scrolling and by search. No timing is asserted (a shared machine); the screenshots are kept."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from gpusched_common import events as ev
from gpusched_common import tokens
from gpusched_common.db import connect
from gpusched_common.infra.processes import free_port, spawn, stop_pid, wait_for_port
from gpusched_core import placement as engine
from services.placement.handlers import process
from tests.browser.conftest import screenshot
from tests.browser.test_dashboard import rows, sign_in, until

ROOT = Path(__file__).resolve().parents[2]
NODES, GPUS, JOBS = 1000, 8, 10_000
MAX_ROWS_IN_DOM = 200  # a viewport's rows and their overscan, whatever the list's length


@pytest.fixture(scope="module")
async def big_gateway(pg_server: str, tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import fresh_database  # noqa: PLC0415

    database_url = await fresh_database(pg_server, "gpusched_dash_scale")
    now = datetime.now(UTC)
    conn = await connect(database_url)
    try:
        policy = engine.make_policy("bestfit")
        for n in range(NODES):
            await process(conn, ev.NodeRegistered(
                node_id=f"node-{n:04d}", hostname=f"gpu-{n:04d}", cpu_milli=128_000, memory_mib=1_048_576,
                nvml_backend="simulated", lease_epoch=1,
                gpus=[ev.GpuInventory(index=i, uuid=f"GPU-{n:04d}-{i}", model="H100-80GB" if n % 2 else "A100-80GB",
                                      memory_mib=81559) for i in range(GPUS)]), now, policy)
        await conn.execute(
            "INSERT INTO jobs (job_id, tenant, status, version, gpus, gpu_model, priority, reasons, submitted_at,"
            " submitted_by, name, updated_at)"
            " SELECT format('job-%s', lpad(i::text, 5, '0')), (ARRAY['research','inference','platform','ml-eval'])[1 + i % 4],"
            " (ARRAY['Succeeded','Running','Queued','Failed','Cancelled'])[1 + i % 5], 3, 1 + i % 8, 'H100-80GB', i % 3,"
            " '[]'::jsonb, $1::timestamptz - make_interval(secs => i), 'token:seed:load', format('load-%s', i), $1"
            " FROM generate_series(0, $2 - 1) AS i", now, JOBS)
        await conn.execute(
            "INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at)"
            " SELECT node_id, gpu_index, format('job-%s', lpad(((row_number() OVER ()) * 5 + 1)::text, 5, '0')), $1"
            " FROM gpus WHERE (gpu_index + length(node_id)) % 3 = 0 AND gpu_index % 3 = 0", now)
        token, _ = await tokens.issue(conn, role="operator", tenant=None, name="scale-operator", expires_at=None,
                                      created_by="test", now=now)
    finally:
        await conn.close()
    home = tmp_path_factory.mktemp("gateway")
    port = free_port()
    env = {**os.environ, "GPUSCHED_DATABASE_URL": database_url, "GPUSCHED_GATEWAY_PORT": str(port),
           "GPUSCHED_GATEWAY_READ_RATE_PER_S": "1000", "GPUSCHED_GATEWAY_READ_BURST": "5000"}
    pid = spawn("gateway", [sys.executable, "-m", "services.gateway"], home, env, cwd=ROOT)
    try:
        wait_for_port(port, pid=pid, log=home / "gateway.log")
        yield f"http://127.0.0.1:{port}", token
    finally:
        stop_pid(pid)


def in_dom(driver, selector: str) -> int:
    return driver.execute_script(f"return document.querySelectorAll({selector!r}).length")


def scroll_to_end(driver) -> None:
    driver.execute_script("for (const v of document.querySelectorAll('.vlist')) v.scrollTop = v.scrollHeight;")


async def test_a_thousand_nodes_draw_as_a_virtualised_grid(big_gateway, page):
    gateway, token = big_gateway
    sign_in(page, gateway, token, "/ui/cluster")
    until(page, lambda d: "1,000" in d.find_element(By.ID, "node-count").text, "every node is counted", 120)
    assert 0 < in_dom(page, "[data-node]") <= MAX_ROWS_IN_DOM
    assert in_dom(page, ".gpu-cell") <= MAX_ROWS_IN_DOM * GPUS
    assert in_dom(page, ".gpu-cell[data-state='idle']") > 0  # the allocations are drawn (no telemetry: idle)
    screenshot(page, "cluster-1000-nodes")
    assert not page.find_elements(By.CSS_SELECTOR, "[data-node='node-0999']")  # not drawn until scrolled to
    scroll_to_end(page)
    until(page, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-node='node-0999']"), "the last node is reachable")
    page.find_element(By.ID, "node-filter").send_keys("node-0500")
    until(page, lambda d: in_dom(d, "[data-node]") == 1, "a filter leaves one node")


async def test_ten_thousand_jobs_load_into_a_virtualised_list(big_gateway, page):
    gateway, token = big_gateway
    sign_in(page, gateway, token, "/ui/jobs")
    until(page, lambda d: rows(d), "the first page is drawn", 120)
    while page.find_elements(By.CSS_SELECTOR, "#load-more:not([hidden])"):
        before = page.find_element(By.ID, "job-count").text
        page.find_element(By.ID, "load-more").click()
        until(page, lambda d: d.find_element(By.ID, "job-count").text != before, "another page loads", 120)
    assert "10,000" in page.find_element(By.ID, "job-count").text, page.find_element(By.ID, "job-count").text
    assert 0 < in_dom(page, "[data-job]") <= MAX_ROWS_IN_DOM
    assert "job-00000" in rows(page)  # newest first: job i was submitted i seconds ago
    scroll_to_end(page)
    until(page, lambda d: "job-09999" in rows(d) and "job-00000" not in rows(d), "the oldest job is at the end")
    screenshot(page, "jobs-10000")
