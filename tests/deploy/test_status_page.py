"""The status page (/ui) in a real headless Chromium (Debian's chromium + chromium-driver, driven
by Selenium): it loads without console errors, shows the jobs, the heatmap, the step-time chart
and the injected hang's incident, and an approve click on the proposed isolate action changes
the action's state in the service; the hang's host shows as failed among the fleet's hardware."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from failslow.service.fleet.settings import FleetSettings
from failslow.service.settings import DetectionSettings, Settings
from tests.live import live_service, wait_for

CLI = [sys.executable, "-m", "failslow.cli"]
DRIVER = shutil.which("chromedriver")
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        DRIVER is None or BROWSER is None,
        reason="chromium / chromium-driver not installed (Debian: apt-get install chromium "
        "chromium-driver)",
    ),
]
JOB = "ui-job"


def _browser():  # type: ignore[no-untyped-def]
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(BROWSER)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                "--disable-dev-shm-usage"):  # fmt: skip
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(str(DRIVER)), options=opts)


def _wait(predicate, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    got = wait_for(predicate, timeout=timeout, interval=0.25)
    assert got, "timed out"
    return got


def test_status_page_shows_the_hang_and_approves_an_action(db_url: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    settings = Settings(database_url=db_url, detection=DetectionSettings(interval_s=0.1),
                        fleet=FleetSettings(flush_interval_s=0.5))  # fmt: skip
    data = tmp_path / "job.jsonl"
    subprocess.run(
        [*CLI, "simulate", "--job", JOB, "--tp", "2", "--pp", "1", "--dp", "4",
         "--gpus-per-host", "2", "--steps", "150", "--seed", "2", "--quiet",
         "--fault", "slow_gpu:rank=3,start=40,end=80,factor=2.0",
         "--fault", "hang:rank=5,start=120", "--out", str(data)],
        check=True, timeout=300,
    )  # fmt: skip
    with live_service(settings) as url:
        subprocess.run([*CLI, "replay", str(data), "--service", url, "--quiet"], check=True)
        # the policy proposes isolating the hang's root host (manual approval by default)
        proposed = _wait(
            lambda: [
                a
                for a in httpx.get(f"{url}/v1/jobs/{JOB}/actions").json()
                if a["state"] == "proposed" and a["kind"] == "isolate"
            ]
        )[0]
        driver = _browser()
        try:
            driver.get(f"{url}/ui?job={JOB}")
            _wait(lambda: driver.find_elements(By.CSS_SELECTOR, f'tr.job[data-job="{JOB}"]'))
            hang = _wait(lambda: driver.find_elements(By.CSS_SELECTOR, '.inc[data-kind="hang"]'))
            assert "rank 5" in hang[0].text
            assert driver.find_elements(By.CSS_SELECTOR, '.inc[data-kind="slow_gpu"]')
            assert driver.find_elements(By.CSS_SELECTOR, "#chart polyline")
            assert driver.find_elements(By.CSS_SELECTOR, "#chart line.incident-mark")
            width = driver.execute_script("return document.getElementById('heatmap').width")
            height = driver.execute_script("return document.getElementById('heatmap').height")
            assert width > 5 and height == 8  # buckets x ranks
            assert "8 ranks on 4 hosts" in driver.find_element(By.ID, "jobmeta").text
            # the hang's host failed hard: the fleet's hardware says so (refreshed every 10 s)
            failed = _wait(lambda: driver.find_elements(
                By.CSS_SELECTOR, 'tr.part[data-state="failed"]'), timeout=40)  # fmt: skip
            assert failed[0].text.startswith("host ")
            button = _wait(
                lambda: driver.find_elements(
                    By.CSS_SELECTOR, f'tr[data-id="{proposed["id"]}"] button.approve'
                )
            )[0]
            button.click()
            after = _wait(
                lambda: (
                    (httpx.get(f"{url}/v1/actions/{proposed['id']}").json()["state"] != "proposed")
                    and httpx.get(f"{url}/v1/actions/{proposed['id']}").json()
                )
            )
            assert after["state"] in ("approved", "executing", "succeeded")
            assert after["decided_by"] == "local:127.0.0.1"  # the token's, not the body's
            _wait(
                lambda: [
                    e
                    for e in driver.find_elements(
                        By.CSS_SELECTOR, f'tr[data-id="{proposed["id"]}"] .action-state'
                    )
                    if e.text != "proposed"
                ]
            )
            # the page asks for the history every 2 s; unchanged, it is answered 304 (headers
            # only) and the browser uses the body it has: transferred < body
            sizes = driver.execute_script(
                "return performance.getEntriesByType('resource')"
                ".filter(e => e.name.includes('/history'))"
                ".map(e => [e.transferSize, e.encodedBodySize]);"
            )
            assert len(sizes) >= 2 and any(0 < t < b for t, b in sizes[1:]), sizes
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors
        finally:
            driver.quit()
