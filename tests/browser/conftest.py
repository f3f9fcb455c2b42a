"""The browser suite (``make test-browser``): the dashboard in a real headless Chromium (Debian's
``chromium`` and ``chromium-driver``, driven by Selenium) against the whole local stack. Each test fails on
any JavaScript error the page logged; screenshots go to ``bench-results/screenshots/`` (ignored by git)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import local_stack, stack_settings  # noqa: F401 - the stack fixtures, one per module

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "bench-results" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("no chromium / chromedriver (apt-get install chromium chromium-driver): the browser suite "
                    "needs a real browser")
    from selenium import webdriver  # noqa: PLC0415 - only this suite needs it
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1440,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser) -> Iterator[object]:
    """The module's browser, checked after each test for JavaScript errors (an uncaught exception, an
    unhandled rejection, a console.error): a failed request the page answered (a 401 before sign-in, a 404
    it shows) is the network's entry, not an error of the page."""
    browser.get_log("browser")  # what earlier tests left
    yield browser
    errors = [entry for entry in browser.get_log("browser")
              if entry["level"] == "SEVERE" and entry.get("source") != "network"]
    assert not errors, errors


def screenshot(driver, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
