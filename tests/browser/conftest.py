"""The browser suite (``make test-browser``): the dashboard in real headless browsers against the whole
local stack: Chromium (Debian's ``chromium`` and ``chromium-driver``) and Firefox (Debian's ``firefox-esr``
with ``geckodriver``, which ``.ci/run`` builds with cargo from crates.io: Debian has no package of it), each
driven by Selenium. Each test fails on any JavaScript error the page reported (Chromium's console log;
Firefox's over WebDriver BiDi); screenshots go to ``bench-results/screenshots/`` (ignored by git)."""

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
FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")
GECKODRIVER = shutil.which("geckodriver") or next(
    (str(p) for p in (Path.home() / ".cargo" / "bin" / "geckodriver",) if p.exists()), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module", params=["chromium", "firefox"])
def browser(request: pytest.FixtureRequest) -> Iterator[object]:
    """One browser per module and kind; ``errors()`` drains the JavaScript errors it reported."""
    from selenium import webdriver  # noqa: PLC0415 - only this suite needs it

    if request.param == "chromium":
        if CHROMIUM is None or DRIVER is None:
            pytest.skip("no chromium / chromedriver (apt-get install chromium chromium-driver)")
        from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1440,1000", "--disable-extensions", "--no-first-run"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        driver.errors = lambda: [e for e in driver.get_log("browser")  # a failed request the page answered
                                 if e["level"] == "SEVERE" and e.get("source") != "network"]  # (a 401, a 404) is not one
    else:
        if FIREFOX is None or GECKODRIVER is None:
            pytest.skip("no firefox-esr / geckodriver (apt-get install firefox-esr; cargo install geckodriver)")
        from selenium.webdriver.firefox.service import Service as FirefoxService  # noqa: PLC0415

        options = webdriver.FirefoxOptions()
        options.binary_location = FIREFOX
        options.add_argument("-headless")
        options.enable_bidi = True
        driver = webdriver.Firefox(service=FirefoxService(GECKODRIVER), options=options)
        driver.set_window_size(1440, 1000)
        seen: list[object] = []
        driver.script.add_javascript_error_handler(seen.append)
        driver.script.add_console_message_handler(lambda m: seen.append(m) if getattr(m, "level", "") == "error" else None)

        def drain() -> list[object]:
            out = list(seen)
            seen.clear()
            return out
        driver.errors = drain
    driver.kind = request.param
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser) -> Iterator[object]:
    """The module's browser, checked after each test for JavaScript errors (an uncaught exception, an
    unhandled rejection, a console.error)."""
    browser.errors()  # what earlier tests left
    yield browser
    errors = browser.errors()
    assert not errors, errors


def screenshot(driver, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}-{driver.kind}.png"
    driver.save_screenshot(str(path))
    return path
