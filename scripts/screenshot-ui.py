"""Take the README's screenshot of the status page: a simulated job with a slow GPU and a hang,
replayed into a throwaway service, shown in headless Chromium. Needs chromium + chromium-driver.

    .venv/bin/python scripts/screenshot-ui.py docs/images/status-page.png
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

from failslow.service.settings import DetectionSettings, Settings  # noqa: E402
from tests.live import live_service  # noqa: E402

CLI = [sys.executable, "-m", "failslow.cli"]


def main(out: str) -> int:
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "job.jsonl"
        subprocess.run(
            [*CLI, "simulate", "--job", "llama-70b-run7", "--tp", "4", "--pp", "2", "--dp", "4",
             "--gpus-per-host", "8", "--steps", "400", "--seed", "4", "--quiet",
             "--fault", "slow_gpu:rank=13,start=120,end=260,factor=1.6",
             "--fault", "hang:rank=21,start=360", "--out", str(data)],
            check=True,
        )  # fmt: skip
        settings = Settings(
            database_url=f"sqlite:///{d}/x.db", detection=DetectionSettings(interval_s=0.1)
        )
        with live_service(settings) as url:
            subprocess.run([*CLI, "replay", str(data), "--service", url, "--quiet"], check=True)
            time.sleep(2)
            opts = webdriver.ChromeOptions()
            for arg in ("--headless=new", "--no-sandbox", "--window-size=1400,1500"):
                opts.add_argument(arg)
            driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
            try:
                driver.get(f"{url}/ui?job=llama-70b-run7")
                time.sleep(3)
                driver.save_screenshot(out)
            finally:
                driver.quit()
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "status-page.png"))
