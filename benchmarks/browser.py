"""A real browser for the pages' tests and benchmark: Debian's chromium driven by its chromedriver
through Selenium.

Selenium rather than Playwright: Selenium drives the browser the distribution installs through the
driver built with it (chromium-driver), and is told exactly which binaries to use, so it never
downloads a browser or a driver (Selenium Manager is not asked when both paths are given);
Playwright's Python package expects browsers of its own build. Headless "new" mode is the full
browser without a window: the same layout, fonts, CSP enforcement and colour schemes.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

APT_HINT = "apt-get install chromium chromium-driver"


def binaries() -> Optional[tuple[str, str]]:
    """(browser, driver) paths, from NMT_CHROMIUM / NMT_CHROMEDRIVER or the PATH; None when absent."""
    browser = os.environ.get("NMT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("NMT_CHROMEDRIVER") or shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def start_chromium(downloads: Optional[Path] = None, width: int = 1280, height: int = 900,
                   insecure_certs: bool = False):
    """A headless Chromium session; `downloads`: where files the page saves land (no prompt);
    `insecure_certs`: accept a certificate no system CA signed (a test's own CA).
    The browser's console is kept (driver.get_log("browser")) so tests can read its errors."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = binaries()
    if found is None:
        raise RuntimeError(f"chromium and chromedriver are not installed ({APT_HINT})")
    browser, driver = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking",
                     f"--window-size={width},{height}", "--lang=en-US"):
        options.add_argument(argument)  # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.accept_insecure_certs = insecure_certs
    if downloads is not None:
        options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                                  "download.prompt_for_download": False})
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    if downloads is not None:
        session.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    return session


def color_scheme(session, scheme: str) -> None:
    """Emulate the system's light or dark setting (prefers-color-scheme)."""
    session.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": scheme}]})


def viewport(session, width: int, height: int, mobile: bool = False) -> None:
    """The page's viewport as a phone's (mobile: touch layout rules, device scale 2) or a desktop's."""
    session.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 2 if mobile else 1,
                             "mobile": mobile})
