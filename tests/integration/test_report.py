"""`metricbus report`: a self-contained HTML file, rendered in Debian's chromium and looked at."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest

from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started
from metricbus.sinks import ParquetArchive

from .conftest import cli

pytestmark = pytest.mark.integration
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FP = default_codec().newest("EventBatch").fingerprint
HOSTILE = "</script><script>alert(1)</script>"


def archive_run(archive, run, lr, level, t0=1_700_000_000_000):
    events = [Event(run, "p", 0, t0, RUN_STARTED, run_started("proj", f"name-{run}", {"lr": lr}), FP)]
    derived = []
    for step in range(60):
        scalars = {
            "Train/Loss": math.nan if step == 30 else level + 1.0 / (step + 1) + 0.01 * math.sin(step),
            "Train/AvgReward": step / 60,
            "Train/PolicyLoss": 0.1,
            "Train/Entropy": 1.0 - step / 100,
            "lr/group0": lr * (1 - step / 60),
            "grad/total_norm": 1.0 + (step % 5),
            HOSTILE: 1.0,
        }
        samples = {"Train/Reward": [step / 60 - 0.1, step / 60 + 0.1]}
        body = {"step": step, "epoch": step // 20, "rank": 0, "scalars": scalars, "samples": samples}
        events.append(Event(run, "p", step + 1, t0 + step * 1000, METRICS, body, FP))
        task = ("logo_a", "logo_b")[step % 2]
        episode = {
            "episode/reward": step / 60 if task == "logo_a" else 0.2,
            "episode/success": float(task == "logo_a"),
        }
        labels = {"task": task}
        events.append(
            Event(
                run,
                "p",
                100 + step,
                t0 + step * 1000,
                METRICS,
                {
                    "step": step,
                    "epoch": step // 20,
                    "rank": 0,
                    "scalars": episode,
                    "samples": {},
                    "labels": labels,
                },
                FP,
            )
        )
        point = {"Train/Loss_recent_mean": scalars["Train/Loss"]}
        point[f"by_task/{task}/episode/success_recent_mean"] = episode["episode/success"]
        point[f"by_task/{task}/share"] = 0.5
        if step % 20 == 19:
            point["Epoch/AvgReward"] = (step - 9.5) / 60
        derived.append(
            Event(
                run,
                "metricbus.stream",
                step,
                t0 + step * 1000,
                METRICS,
                {"step": step, "epoch": step // 20, "rank": 0, "scalars": point, "samples": {}},
                FP,
            )
        )
    events.append(Event(run, "p", 161, t0 + 61_000, RUN_FINISHED, {"status": "finished", "summary": {}}, FP))
    archive.write(events + derived)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_the_report_renders_offline_with_charts_tables_and_the_comparison(settings, tmp_path):
    from playwright.sync_api import sync_playwright

    archive = ParquetArchive(settings.archive_dir)
    archive.open()
    archive_run(archive, "run-a", 0.1, 1.0)
    archive_run(archive, "run-b", 0.01, 1.5, t0=1_700_003_600_000)  # an hour later
    archive.flush()
    out = tmp_path / "report.html"
    done = subprocess.run(
        cli(settings, "report", "run-a", "--compare", "run-b", "--out", str(out)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            requests, dialogs = [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(out.as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=10_000)
            assert requests == [out.as_uri()]  # nothing fetched: self-contained
            assert dialogs == []  # a hostile metric name stays text
            assert "name-run-a" in page.title()
            assert page.locator("#score").inner_text().endswith("/100")
            headings = page.locator("h2").all_inner_texts()
            for section in (
                "Health",
                "Learning curves",
                "Loss parts",
                "Learning-rate schedule",
                "Epochs",
                "Comparison",
                "Alert timeline",
                "Alerts",
                "Per label",
                "Per-label breakdown",
            ):
                assert section in headings, section
            loss = page.locator(".chart[data-series='Train/Loss']")
            assert loss.get_attribute("data-points") == "60"
            assert "Train/Loss_recent_mean" in loss.inner_text() and "Train/Loss (run-b)" in loss.inner_text()
            painted = page.evaluate(
                """() => [...document.querySelectorAll('.chart canvas')].map((c) => {
                    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })"""
            )
            assert len(painted) >= 5 and min(painted) > 200  # every chart drew lines
            assert page.locator("#epochs tbody tr").count() == 3
            assert page.locator("#grad tbody tr").count() == 3
            assert page.locator("#rewards tbody tr").count() == 3
            comparison = page.locator("#comparison").inner_text()
            assert "Train/Loss" in comparison and "worse" in comparison
            assert "lr" in page.locator("#config-diff").inner_text()
            assert HOSTILE in page.locator(".chart h3").all_inner_texts()
            # the default rules over the archived events: the NaN loss at step 30
            alerts = page.locator("#alerts").inner_text()
            assert "step 30 firing nan_loss [critical] Train/Loss" in alerts, alerts
            timeline = page.locator(".chart[data-series='firing (1) / resolved (0), by rule']")
            assert "nan_loss (Train/Loss)" in timeline.inner_text()
            labels = page.locator("#labels tbody tr").all_inner_texts()
            assert len(labels) == 2 and labels[0].startswith("task=logo_a\t30")
            success = page.locator(".chart[data-series='task: success rate']")
            assert "logo_a" in success.inner_text() and "logo_b" in success.inner_text()
            # the x axis: time since each run started lines the runs up; wall clock shows them apart
            page.select_option("#xaxis", "relative")
            assert page.locator("body").get_attribute("data-xaxis") == "relative"
            assert loss.get_attribute("data-points") == "60"
            assert float(loss.get_attribute("data-xmin")) == 0.0
            assert float(loss.get_attribute("data-xmax")) == 59 / 60  # step 59, 59 s after the start
            page.select_option("#xaxis", "wall")
            assert loss.get_attribute("data-points") == "120"
            assert float(loss.get_attribute("data-xmin")) == 1_700_000_000.0
            assert float(loss.get_attribute("data-xmax")) == 1_700_003_659.0
            page.goto(out.as_uri() + "#x=relative")  # the choice is kept in the address
            page.reload()
            page.wait_for_selector("body[data-ready='1']", timeout=10_000)
            assert page.locator("body").get_attribute("data-xaxis") == "relative"
            assert page.locator("#xaxis").input_value() == "relative"
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
        finally:
            browser.close()
