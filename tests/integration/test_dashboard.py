"""The dashboard in a real browser (Debian's chromium through Playwright), its API and /metrics (issue 9)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from metricbus.ops._board import MAX_POINTS
from metricbus.producers import Run

from .conftest import CHROMIUM, cli, free_port, get

pytestmark = pytest.mark.integration


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_a_live_run_in_the_browser_gains_points_and_shows_a_nan_alert(
    settings, worker, dashboard, sink, tmp_path
):
    from playwright.sync_api import expect, sync_playwright

    run_started_s = time.time()
    config = {"lr": 0.001, "beta": float("nan")}  # NaN in a config made the run page's JSON a 500
    run = Run("ops", name="browser-run", settings=settings, system_metrics=False, config=config)
    for step in range(5):
        run.log({"Train/Loss": 1.0 / (step + 1), "Train/Reward": 0.1 * step}, step=step)
    assert run._publisher.flush(20)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(dashboard + "/")
            link = page.locator(f"#runs a[href='/runs/{run.run_id}']")
            expect(link).to_be_visible(timeout=20_000)
            expect(page.locator("#runs")).to_contain_text("browser-run")
            link.click()
            page.wait_for_url(f"**/runs/{run.run_id}")
            chart = page.locator("[data-series='Train/Loss']")
            expect(chart).to_have_attribute("data-points", "5", timeout=20_000)
            expect(chart.locator("canvas")).to_be_visible()
            expect(page.locator("#config")).to_contain_text('"lr": 0.001')
            expect(page.locator("#config")).to_contain_text('"beta": "NaN"')
            run.config.update({"lr": 0.0005, "warmup": 10})  # a config update reaches the page too
            expect(page.locator("#config")).to_contain_text('"warmup": 10', timeout=20_000)
            expect(page.locator("#config")).to_contain_text('"lr": 0.0005')

            for step in range(5, 12):  # logged while the page is open: no reload
                run.log({"Train/Loss": 1.0 / (step + 1), "Train/Reward": 0.1 * step}, step=step)
                time.sleep(0.05)
            assert run._publisher.flush(20)
            expect(chart).to_have_attribute("data-points", "12", timeout=20_000)
            # the x axis: the step (above), minutes since the run started, the wall clock
            page.select_option("#xaxis", "relative")
            expect(page.locator("body")).to_have_attribute("data-xaxis", "relative")
            assert chart.get_attribute("data-points") == "12"
            assert 0 <= float(chart.get_attribute("data-xmin")) < float(chart.get_attribute("data-xmax")) < 2
            page.select_option("#xaxis", "wall")
            expect(page.locator("body")).to_have_attribute("data-xaxis", "wall")
            assert abs(float(chart.get_attribute("data-xmin")) - run_started_s) < 5
            assert page.url.endswith("#x=wall")
            page.reload()  # the choice is kept in the address
            expect(chart).to_have_attribute("data-points", "12", timeout=20_000)
            assert page.locator("#xaxis").input_value() == "wall"
            page.select_option("#xaxis", "step")
            assert chart.get_attribute("data-xmax") == "11"

            run.log({"Train/Loss": math.nan, "Train/Reward": 1.2}, step=12)
            assert run._publisher.flush(20)
            t0 = time.monotonic()
            alert = page.locator("#run-alerts tr", has_text="nan_loss")
            expect(alert).to_contain_text("firing", timeout=20_000)
            seconds = time.monotonic() - t0
            assert seconds < 15, seconds
            # health from the archive (a Parquet sink runs beside the dashboard), refreshed on the page
            sink()
            expect(page.locator("#health-score")).to_have_text(re.compile(r"^\d+/100$"), timeout=40_000)
            expect(page.locator("#health-parts")).to_contain_text("validity", timeout=20_000)
            expect(page.locator("#health-parts")).to_contain_text(
                "Train/Loss: 1 of 13 values NaN", timeout=40_000
            )
            page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
            # a page left open holds at most the server's points per series (MAX_POINTS)
            for step in range(13, 13 + MAX_POINTS):
                run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
            assert run._publisher.flush(20)
            expect(chart).to_have_attribute("data-xmax", str(12 + MAX_POINTS), timeout=30_000)
            assert chart.get_attribute("data-points") == str(MAX_POINTS)
            from metricbus.sinks._catchup import add_runs

            add_runs(settings, f"{settings.topic_prefix}sink.wandb", {run.run_id: False})
            page.goto(dashboard + "/pipeline")
            expect(page.locator("#groups")).to_contain_text(f"{settings.topic_prefix}stream", timeout=30_000)
            expect(page.locator("#catchup")).to_contain_text(
                f"{settings.topic_prefix}sink.wandb", timeout=30_000
            )
            expect(page.locator("#catchup")).to_contain_text(run.run_id)
            page.goto(dashboard + "/alerts")
            expect(page.locator("#alerts")).to_contain_text(run.run_id, timeout=20_000)
        finally:
            browser.close()
    shot = tmp_path / "run.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("METRICBUS_SCREENSHOTS"):
        shutil.copy(shot, Path(os.environ["METRICBUS_SCREENSHOTS"]) / "dashboard-run.png")
    run.finish(timeout=20)


def test_api_refuses_unknown_runs_and_paths_outside_and_serves_metrics(settings, worker, dashboard):
    from prometheus_client.parser import text_string_to_metric_families

    run = Run("ops", name="api-run", settings=settings, system_metrics=False)
    logged_ms = time.time_ns() // 1_000_000
    run.log({"Train/Loss": 0.5}, step=0)
    assert run.finish(timeout=20)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        code, body = get(f"{dashboard}/api/runs/{run.run_id}")
        if code == 200:
            break
        time.sleep(0.3)
    detail = json.loads(body)
    [[step, value, ts_ms]] = detail["series"]["Train/Loss"]  # a point: step, value, event time
    assert (step, value) == (0, 0.5) and detail["state"] == "finished"
    assert 0 <= ts_ms - logged_ms < 1000

    assert get(f"{dashboard}/runs/no-such-run")[0] == 404
    assert get(f"{dashboard}/api/runs/no-such-run")[0] == 404
    assert get(f"{dashboard}/api/runs/..%2F..%2Fetc")[0] == 404
    assert get(f"{dashboard}/static/../../../etc/passwd")[0] == 404
    assert get(f"{dashboard}/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd")[0] == 404
    assert get(f"{dashboard}/healthz") == (200, b'{"ok":true}')

    families: dict = {}
    deadline = time.monotonic() + 30
    stream_group = f"{settings.topic_prefix}stream"
    while time.monotonic() < deadline:  # the first consumer-group sample lands within seconds
        code, body = get(f"{dashboard}/metrics")
        assert code == 200
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        lag = families.get("metricbus_consumer_lag_records")
        if lag and any(s.labels["group"] == stream_group for s in lag.samples):
            break
        time.sleep(0.5)
    status = [s for s in families["metricbus_consumer_status"].samples if s.labels["group"] == stream_group]
    assert sorted(s.labels["status"] for s in status) == ["ERR", "OK", "SLOW", "STALL", "STOP", "WARN"]
    assert sum(s.value for s in status) == 1.0
    runs = {s.labels["state"]: s.value for s in families["metricbus_runs"].samples}
    assert runs.get("finished", 0) >= 1


def test_a_browser_that_never_reads_holds_nothing_up(settings, dashboard):
    host, port = dashboard.removeprefix("http://").split(":")
    stuck = socket.create_connection((host, int(port)))
    stuck.sendall(b"GET /api/stream HTTP/1.1\r\nHost: x\r\n\r\n")  # and never read a byte
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    try:
        run = Run("ops", name="while-stuck", settings=settings, system_metrics=False)
        for step in range(200):
            run.log({"x": float(step)}, step=step)
        assert run.finish(timeout=20)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            code, body = get(f"{dashboard}/api/status", timeout=5)
            rows = [r for r in json.loads(body)["runs"] if r["run_id"] == run.run_id]
            if rows and rows[0]["last_step"] == 199:
                break
            time.sleep(0.3)
        assert rows and rows[0]["last_step"] == 199 and rows[0]["state"] == "finished"
    finally:
        stuck.close()


def test_binding_beyond_loopback_needs_a_token(settings, tmp_path):
    result = subprocess.run(
        cli(settings, "dashboard", "--host", "0.0.0.0", "--port", str(free_port())),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "--token" in result.stderr


def test_a_token_guards_every_page_but_health(settings, tmp_path):
    port = free_port()
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.Popen(
        cli(settings, "dashboard", "--port", str(port), "--token", "s3cret"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if get(f"{base}/healthz", 2)[0] == 200:  # health needs no token: probes carry none
                    break
            except OSError:
                time.sleep(0.2)
        assert get(f"{base}/healthz")[0] == 200
        assert get(f"{base}/api/status")[0] == 401
        assert get(f"{base}/")[0] == 401
        assert get(f"{base}/api/status", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert get(f"{base}/api/status", headers={"Authorization": "Bearer s3cret"})[0] == 200
        with urllib.request.urlopen(f"{base}/?token=s3cret", timeout=10) as first:  # noqa: S310
            cookie = first.headers["set-cookie"].split(";")[0]
        assert cookie == "metricbus_token=s3cret"
        assert get(f"{base}/api/status", headers={"Cookie": cookie})[0] == 200  # the cookie carries it on
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_with_kafka_down_the_pipeline_page_says_so_at_once_and_shows_the_waiting_spools(tmp_path):
    """Ops open the dashboard while the broker is down: the page said nothing for the ~25 s
    kafka-python takes to give up bootstrapping, and again at each sample; now it names the
    address and the reason within seconds, lists the runs whose events wait in their spools,
    and the log says it once, not every reconnect."""
    from playwright.sync_api import expect, sync_playwright

    from metricbus.schemas import Settings

    down = Settings(bootstrap=f"127.0.0.1:{free_port()}", topic_prefix="down.", data_dir=tmp_path / "data")
    run = Run("ops", settings=down, system_metrics=False)
    run.log({"Train/Loss": 0.5}, step=0)
    assert not run.finish(timeout=1)  # nowhere to deliver: its events wait in its spool
    port = free_port()
    log_path = tmp_path / "dashboard.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cli(down, "dashboard", "--port", str(port)),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **down.to_env()},
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if get(f"{base}/healthz", 2)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.2)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                try:
                    page = browser.new_page()
                    page.goto(base + "/pipeline")
                    said = f"no broker answers at {down.bootstrap_servers}"
                    expect(page.locator("main")).to_contain_text(said, timeout=10_000)
                    expect(page.locator("#spools")).to_contain_text(run.run_id)
                finally:
                    browser.close()
            status, body = get(f"{base}/readyz")
            assert status == 503 and said in json.loads(body)["problems"][-1]
            time.sleep(5)  # two more reconnects of the run board
        finally:
            proc.terminate()
            code = proc.wait(20)
    text = log_path.read_text()
    assert code == 0 and "Traceback" not in text, text
    assert text.count("run board:") == 1, text


def archive_earlier_run(
    archive,
    run_id: str,
    name: str,
    steps: int = 40,
    nan_at: int | None = None,
    scale: float = 1.0,
    config: dict | None = None,
) -> None:
    """A run an earlier stack archived: logged and derived rows, none of it on today's topics;
    its loss ``scale / (step + 1)``, NaN at step ``nan_at``."""
    from metricbus.schemas import (
        DERIVED_PRODUCER,
        METRICS,
        RUN_FINISHED,
        RUN_STARTED,
        Event,
        default_codec,
        run_started,
    )
    from metricbus.sinks import ParquetArchive

    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(archive)
    sink.open()
    body = {"epoch": None, "rank": 0, "samples": {}}
    events = [
        Event(
            run_id,
            "p",
            0,
            1_700_000_000_000,
            RUN_STARTED,
            run_started("earlier", name, {"lr": 0.1} if config is None else config),
            fp,
        )
    ]
    events += [
        Event(
            run_id,
            "p",
            i + 1,
            1_700_000_001_000 + i,
            METRICS,
            {**body, "step": i, "scalars": {"Train/Loss": float("nan") if i == nan_at else scale / (i + 1)}},
            fp,
        )
        for i in range(steps)
    ]
    final = {**body, "step": steps - 1, "scalars": {"final/score": 7.0}}  # one value: the summary table
    events.append(Event(run_id, "p", steps + 1, 1_700_000_008_000, METRICS, final, fp))
    finished = {"status": "finished", "summary": {"best_loss": 0.025}}
    events.append(Event(run_id, "p", steps + 2, 1_700_000_009_000, RUN_FINISHED, finished, fp))
    events += [
        Event(
            run_id,
            DERIVED_PRODUCER,
            i,
            1_700_000_001_000 + i,
            METRICS,
            {**body, "step": i, "scalars": {"Train/Loss_ema": 0.5}},
            fp,
        )
        for i in range(steps)
    ]
    sink.write(events)
    sink.flush()
    sink.close()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_runs_of_an_earlier_stack_are_listed_and_drawn_from_the_archive(settings, dashboard, tmp_path):
    """The embedded broker forgets at a restart; the archive does not, and neither does the board."""
    from playwright.sync_api import expect, sync_playwright

    archive_earlier_run(settings.archive_dir, "20261101-000000-earlier1", "from-last-week", nan_at=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # listed within a refresh of the archive's runs
        runs = json.loads(get(f"{dashboard}/api/status")[1])["runs"]
        if runs:
            break
        time.sleep(0.5)
    (row,) = runs
    assert (row["run_id"], row["name"], row["state"], row["last_step"], row["archived"]) == (
        "20261101-000000-earlier1", "from-last-week", "finished", 39, True,
    )  # fmt: skip
    code, body = get(f"{dashboard}/api/runs/20261101-000000-earlier1")
    detail = json.loads(body)
    assert code == 200 and detail["archived"] and len(detail["series"]["Train/Loss"]) == 40
    assert detail["series"]["Train/Loss_ema"][0][:2] == [0, 0.5] and detail["config"] == {"lr": 0.1}
    # the alerts topic forgot it too: the stack's rules over the archived events give its alerts;
    # the loss was finite again for its last 9 steps, so the NaN alert resolved by the run's end
    (alert,) = detail["alerts"]
    assert (alert["rule"], alert["state"], alert["fired_step"], alert["value"]) == (
        "nan_loss",
        "resolved",
        30,
        "nan",
    )
    assert alert["evidence"].startswith("loss is NaN or infinite") and alert["resolved_step"] == 39
    # the Alerts page lists it too, from the archive (what an `up` restart leaves)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = [
            a for a in json.loads(get(f"{dashboard}/api/status")[1])["alerts"] if a["run_id"] == row["run_id"]
        ]
        if listed:
            break
        time.sleep(0.5)
    assert [(a["rule"], a["fired_step"], a["resolved_step"]) for a in listed] == [("nan_loss", 30, 39)]
    code, page = get(f"{dashboard}/runs/not-a-run-anywhere")
    assert code == 404 and b"not in the archive" in page and b'href="/static/app.css"' in page
    code, report = get(f"{dashboard}/runs/20261101-000000-earlier1/report", timeout=60)
    assert (
        code == 200 and b"20261101-000000-earlier1" in report and b"uPlot" in report
    )  # metricbus report's page

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{dashboard}/")
        expect(page.locator("#runs")).to_contain_text("from-last-week", timeout=30_000)
        page.goto(f"{dashboard}/runs/20261101-000000-earlier1")
        expect(page.locator('.chart[data-series="Train/Loss"]')).to_have_attribute(
            "data-points", "40", timeout=30_000
        )
        expect(page.locator("#archived-note")).to_be_visible()
        expect(page.locator("#run-alerts")).to_contain_text("nan_loss")
        expect(page.locator("#summary-table")).to_contain_text("final/score")
        expect(page.locator("#summary-table")).to_contain_text("best_loss")
        assert "7" in page.locator("#summary-table tr", has_text="final/score").inner_text().split()
        expect(page.locator('.chart[data-series="final/score"]')).to_have_count(0)  # no chart of a dot
        expect(page.locator("#links a")).to_have_attribute("href", "/runs/20261101-000000-earlier1/report")
        expect(page).to_have_title("from-last-week · metricbus")
        page.screenshot(path=str(tmp_path / "archived-run.png"), full_page=False)
        page.goto(f"{dashboard}/alerts")
        alert_row = page.locator("#alerts tr", has_text="20261101-000000-earlier1")
        expect(alert_row).to_contain_text("nan_loss", timeout=30_000)
        cells = alert_row.locator("td").all_inner_texts()
        assert cells[5].split()[0] == "30" and cells[6] == "nan"  # fired at step, value
        assert "loss is NaN or infinite" in cells[7]  # the evidence
        assert cells[8].startswith("step 39: back within limits for the run's last 9 evaluations")
        page.screenshot(path=str(tmp_path / "alerts-after-restart.png"), full_page=False)
        page.goto(f"{dashboard}/runs/not-a-run-anywhere")
        expect(page.get_by_role("link", name="All runs")).to_be_visible()
        browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_two_runs_ticked_on_the_runs_page_are_overlaid_on_one_chart(settings, dashboard, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    ids = {"20261101-000000-overlay1": 1.0, "20261101-000000-overlay2": 2.0}
    accelerate = {"split_batches": False, "dispatch_batches": None, "even_batches": True}  # as HF's
    configs = [
        {"lr": 0.1, "seed": 1, "accelerator_config": accelerate, "output_dir": "/x" * 40},
        {"lr": 0.2, "seed": 1},
    ]
    for (run_id, scale), config in zip(ids.items(), configs, strict=True):
        archive_earlier_run(settings.archive_dir, run_id, f"loss-x{scale:g}", scale=scale, config=config)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{dashboard}/")
        for run_id in ids:
            tick = page.locator(f'#runs input[data-run="{run_id}"]')
            expect(tick).to_be_visible(timeout=60_000)
            tick.check()
        # the default columns: the plain config value that differs (lr), not one both share (seed)
        # nor one only a run of another framework has (an object, a long path); the last loss
        heads = page.locator("#runs thead th").all_inner_texts()
        assert "lr" in heads and "last Train/Loss" in heads, heads
        assert not {"seed", "accelerator_config", "output_dir"} & set(heads), heads
        expect(page.locator("#overlay")).not_to_have_class(re.compile("disabled"))
        page.locator("#overlay").click()
        page.wait_for_url("**/experiments#*")
        page.locator("#metric").select_option("Train/Loss")
        chart = page.locator("#group-chart")
        expect(chart).to_have_attribute("data-groups", "2", timeout=30_000)
        drawn = page.evaluate("window.mbExperiment")
        lines = {tuple(b["runs"]): b["mean"] for b in drawn["bands"]}
        assert set(lines) == {(run_id,) for run_id in ids}
        for run_id, scale in ids.items():  # each run's own archived values, one line each
            assert lines[(run_id,)] == pytest.approx([scale / (i + 1) for i in range(40)])
        page.screenshot(path=str(tmp_path / "runs-overlaid.png"), full_page=False)
        browser.close()


def _sb3_tags(directory: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of every scalar in a directory's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
@pytest.mark.frameworks
def test_an_sb3_run_page_shows_reward_and_loss_first_smoothed_and_never_scrolls_sideways(
    settings, worker, dashboard, sink, tmp_path
):
    """A real SB3 PPO run: what a person sees first, and TensorBoard equal to SB3's own writer."""
    pytest.importorskip("stable_baselines3", reason="SB3 is an optional extra; `make test` installs it")
    from playwright.sync_api import expect, sync_playwright
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure

    from metricbus.sb3 import MetricbusCallback

    sink(kind="tensorboard")
    sink()  # the archive, for the run's health
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.set_logger(configure(str(tmp_path / "sb3"), ["tensorboard"]))  # SB3's own TensorBoard files
    callback = MetricbusCallback(project="sb3-page", settings=settings, system_metrics=False)
    model.learn(total_timesteps=2048, callback=callback)
    run = callback.run
    assert run is not None and run.status == "finished"

    # every tag SB3's own writer wrote is in the sink's run directory with the same steps and values
    theirs = _sb3_tags(tmp_path / "sb3")
    deadline = time.monotonic() + 60
    ours: dict = {}
    while time.monotonic() < deadline:
        dirs = list((settings.data_dir / "tensorboard").glob(f"*/*{run.run_id}"))
        ours = _sb3_tags(dirs[0]) if dirs else {}
        if all(len(ours.get(t, {})) >= len(v) for t, v in theirs.items()):
            break
        time.sleep(1.0)
    assert len(theirs) >= 10
    for tag, points in theirs.items():
        assert ours[tag] == pytest.approx(points, rel=1e-6), tag
    # no smoothing of SB3's counters and schedules (SB3 itself keeps time/* and n_updates out of
    # TensorBoard; the sink writes them as logged)
    counters = ("time/iterations", "time/time_elapsed", "time/total_timesteps", "train/n_updates")
    schedules = ("train/learning_rate", "train/clip_range")
    assert not [
        t for t in ours if t.startswith(counters + schedules) and t.endswith(("_ema", "_recent_mean"))
    ]
    (tmp_path / "tags.json").write_text(json.dumps(sorted(ours)))

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{dashboard}/runs/{run.run_id}")
            first = page.locator("#charts > details").first
            expect(first).to_have_attribute("data-section", "Reward and loss", timeout=30_000)
            for name in ("rollout/ep_rew_mean", "train/loss"):
                chart = page.locator(f'.chart[data-series="{name}"]')
                expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9]"), timeout=30_000)
                # drawn with the page's own smoothing over the faint raw series, not the server's
                # one-point _ema / _recent_mean (logged once per rollout, they were stray dots)
                shown = page.evaluate(f"window.mbCharts[{json.dumps(name)}].plot.series.map((s) => s.show)")
                assert shown == [True, True, True], shown
                assert page.locator(f'.chart[data-series="{name}_ema"]').count() == 0
                box = chart.bounding_box()
                assert box is not None and box["y"] + box["height"] <= 900, (name, box)  # the first screen
            expect(page.locator("#tensorboard-cmd")).to_contain_text("tensorboard --logdir", timeout=30_000)
            expect(page.locator("#health-score")).to_have_text(re.compile(r"^\d+/100$"), timeout=60_000)
            expect(page.locator("#firing")).to_contain_text("none")
            width = page.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            assert width[0] <= width[1], width  # no sideways scroll at 1280 px
            page.screenshot(path=str(tmp_path / "sb3-run.png"), full_page=False)
            # what is charted: every series SB3 logged that varies, a chart each; its constants a
            # table row; what the worker derived in closed sections after them
            series = page.evaluate("window.mbRun.series")
            derived = set(page.evaluate("window.mbRun.derived"))
            charted = set(page.evaluate("Object.keys(window.mbCharts)"))
            constants = set(page.locator("#constants-table tbody td:first-child").all_inner_texts())
            summary = page.locator("#summary-table tbody td:first-child").all_inner_texts()
            for name in series:
                if name in derived or name.startswith("final/"):
                    continue
                assert name in charted or name in constants, name  # nothing logged is hidden
                assert name in summary, name  # and its last value leads the summary
            assert {"train/learning_rate", "train/clip_range"} <= constants  # constant schedules
            first_screen = len([n for n in charted if n not in derived])
            (tmp_path / "chart-count.json").write_text(
                json.dumps({"series": len(series), "logged_charts": first_screen, "charts": len(charted)})
            )
            for closed in page.locator("#charts > details:not([open])").all():
                assert closed.get_attribute("data-section").startswith("Derived: ")
            # sections collapse and open again
            section = page.locator('#charts > details[data-section="train"]')
            chart = section.locator('.chart[data-series="train/entropy_loss"]')
            expect(chart).to_be_visible()
            section.locator("summary").click()
            expect(chart).to_be_hidden()
            section.locator("summary").click()
            expect(chart).to_be_visible()
        finally:
            browser.close()
    if os.environ.get("METRICBUS_SCREENSHOTS"):
        shutil.copy(
            tmp_path / "sb3-run.png", Path(os.environ["METRICBUS_SCREENSHOTS"]) / "dashboard-sb3-run.png"
        )
        shutil.copy(
            tmp_path / "chart-count.json", Path(os.environ["METRICBUS_SCREENSHOTS"]) / "sb3-chart-count.json"
        )
        shutil.copy(
            tmp_path / "tags.json", Path(os.environ["METRICBUS_SCREENSHOTS"]) / "sb3-tensorboard-tags.json"
        )


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_every_chart_reads_out_the_value_under_the_pointer_with_honest_axes_log_smoothing_and_downloads(
    settings, worker, dashboard, sink, tmp_path
):
    """The values a person reads off the run page: readouts, tick labels, log scale, smoothing, CSV, PNG."""
    from playwright.sync_api import expect, sync_playwright

    from metricbus.sinks import tidy

    sink()  # the archive: what the CSV download reads
    run = Run("charts", name="readable", settings=settings, system_metrics=False)
    logged = {}
    for step in range(200):
        values = {
            "train/learning_rate": 3e-4 * (1 - step / 2000),  # a schedule near 3e-4: 3e-4 .. 2.7e-4
            "train/approx_kl": 0.005 + 0.0025 * math.sin(step / 10),  # 0.0025 .. 0.0075
            "train/advantage": math.sin(step / 7),  # crosses 0: no log scale
            "train/loss": 2.0 * math.exp(-step / 50) + 0.01,  # falls over two decades: a log scale helps
            "train/clip_range": 0.2,  # a constant: a table row, not a chart
        }
        logged[step] = values
        run.log(values, step=step, epoch=step // 50)
    assert run.finish(timeout=30)
    deadline = time.monotonic() + 60  # archived first: the page's health and CSV read the archive
    while tidy(settings.archive_dir, run.run_id, names=["train/approx_kl"]).num_rows < 200:
        assert time.monotonic() < deadline, "the archive sink never wrote the run"
        time.sleep(0.5)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page.goto(f"{dashboard}/runs/{run.run_id}")
            for name in ("train/learning_rate", "train/approx_kl", "train/advantage", "train/loss"):
                expect(page.locator(f'.chart[data-series="{name}"]')).to_have_attribute(
                    "data-points", "200", timeout=30_000
                )
            expect(page.locator("#constants-table")).to_contain_text("train/clip_range")
            assert page.locator('.chart[data-series="train/clip_range"]').count() == 0

            # tick labels read off the chart's own axis: distinct, and no tick that is not 0 says "0"
            for name in ("train/learning_rate", "train/approx_kl"):
                ticks = page.evaluate(
                    f"(() => {{ const u = window.mbCharts[{json.dumps(name)}].plot;"
                    " return [u.axes[1]._splits, u.axes[1]._values]; })()"
                )
                splits, labels = ticks
                assert len(labels) >= 2 and len(set(labels)) == len(labels), (name, labels)
                for value, label in zip(splits, labels, strict=True):
                    assert value == 0 or float(label) != 0, (name, labels)
                    assert float(label) == pytest.approx(value, rel=0.05), (name, labels)
            lr_labels = page.evaluate("window.mbCharts['train/learning_rate'].plot.axes[1]._values")
            assert all("e-4" in label for label in lr_labels), lr_labels

            # hovering one chart shows, in every chart of the run, its value at that step; once
            # what loads above the charts has loaded (the health waits for the archive), so that
            # nothing moves the chart from under the pointer (Playwright's hover checks the target)
            expect(page.locator("#health-score")).to_be_visible(timeout=60_000)
            expect(page.locator("#firing")).not_to_contain_text("loading")
            over = page.locator('.chart[data-series="train/approx_kl"] .u-over')
            over.scroll_into_view_if_needed()
            size = over.bounding_box()
            over.hover(position={"x": size["width"] * 0.5, "y": size["height"] * 0.5})
            box = over.bounding_box()
            readouts = page.locator("#charts > details[open] .chart .readout:not([hidden])")
            expect(readouts).to_have_count(4)  # the run's own four; the derived sections are closed
            for name in ("train/learning_rate", "train/approx_kl", "train/advantage", "train/loss"):
                text = page.locator(f'.chart[data-series="{name}"] .readout').inner_text()
                step = int(re.match(r"step (\d+)", text).group(1))
                shown = float(re.search(r"value (\S+)", text).group(1))
                assert shown == pytest.approx(logged[step][name], rel=1e-3, abs=1e-12), (name, text)
            page.screenshot(
                path=str(tmp_path / "readouts.png"),
                clip={**box, "y": box["y"] - 300, "height": 560, "x": 0, "width": 1400},
            )

            # a log scale where the values allow one; refused, with its reason, where they cross 0
            log_button = page.locator('.chart[data-series="train/loss"] .tool.log')
            log_button.click()
            assert page.evaluate("window.mbCharts['train/loss'].plot.scales.y.distr") == 3
            refused = page.locator('.chart[data-series="train/advantage"] .tool.log')
            expect(refused).to_be_disabled()
            assert "0 or below" in refused.get_attribute("title")

            # smoothing: TensorBoard's debiased EMA over the raw points, at the slider's weight
            page.locator("#run-smoothing").fill("0.9")
            smoothed = page.evaluate("window.mbCharts['train/advantage'].plot.data[2]")
            raw = [logged[s]["train/advantage"] for s in range(200)]
            last, expected = 0.0, []
            for n, v in enumerate(raw, 1):
                last = last * 0.9 + 0.1 * v
                expected.append(last / (1 - 0.9**n))
            assert smoothed == pytest.approx(expected, rel=1e-9, abs=1e-12)
            assert "smooth=0.9" in page.url  # kept in the address

            # downloads: the series' every archived point as CSV; the chart as a PNG
            with page.expect_download() as got:
                page.locator('.chart[data-series="train/approx_kl"] .tool.csv').click()
            rows = got.value.path().read_text().splitlines()
            archived = tidy(settings.archive_dir, run.run_id, names=["train/approx_kl"])
            assert rows[0] == "step,wall_time,value" and len(rows) == 201
            assert [float(r.split(",")[2]) for r in rows[1:]] == archived["value"].to_pylist()
            assert [int(r.split(",")[0]) for r in rows[1:]] == list(range(200))
            with page.expect_download() as got:
                page.locator('.chart[data-series="train/approx_kl"] .tool.png').click()
            image = got.value.path().read_bytes()
            assert image[:8] == b"\x89PNG\r\n\x1a\n" and len(image) > 2000
            assert got.value.suggested_filename == "train_approx_kl.png"
        finally:
            browser.close()
    if os.environ.get("METRICBUS_SCREENSHOTS"):
        shutil.copy(
            tmp_path / "readouts.png", Path(os.environ["METRICBUS_SCREENSHOTS"]) / "dashboard-readouts.png"
        )
