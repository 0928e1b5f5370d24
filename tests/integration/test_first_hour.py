"""The first hour of a new user: start the stack once, and every script and command finds it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from metricbus.producers import Run
from metricbus.schemas import Settings, decode_events, default_codec

from .conftest import cli, free_port, read_topic

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

SCRIPT = """
import metricbus
run = metricbus.init(project="first-hour", name="my-first-run", config={"lr": 0.01})
for step in range(20):
    run.log({"Train/Loss": float("nan") if step == 10 else 1.0 / (step + 1)}, step=step)
print("finished:", run.finish(), run.run_id)
"""


def clean_env(runtime: Path) -> dict[str, str]:
    """A new shell's environment: no METRICBUS_* but the runtime dir this test isolates."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICBUS_")}
    env["METRICBUS_RUNTIME_DIR"] = str(runtime)
    return env


def metricbus(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "metricbus", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_a_plain_script_and_every_command_find_the_stack_up_started_and_a_dead_one_is_ignored(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    runtime, data = tmp_path / "runtime", tmp_path / "my-data"
    env = clean_env(runtime)
    port, web = free_port(), free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "metricbus", "up", "--port", str(port), "--dashboard-port", str(web),
         "--data-dir", str(data)],  # global options after the command
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        drain = threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")), daemon=True)
        drain.start()  # up's terminal, read while the test goes on
        wait_for(lambda: "metricbus is up" in "".join(lines), 120, "up to start: " + "".join(lines))
        (stack_file,) = runtime.glob("*.json")
        assert json.loads(stack_file.read_text())["local_port"] == port

        script = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert script.returncode == 0, script.stderr
        run_id = script.stdout.split()[-1]
        assert "finished: True" in script.stdout
        said = [line for line in script.stderr.splitlines() if line.startswith("metricbus: run")]
        assert len(said) == 1 and f"at 127.0.0.1:{port}" in said[0] and str(data) in said[0], script.stderr
        url = re.search(r"view it at (\S+)", said[0]).group(1)
        assert url == f"http://127.0.0.1:{web}/runs/{run_id}"

        def archived():
            out = metricbus("runs", "--json", env=env)
            rows = json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []
            return [r for r in rows if r["run_id"] == run_id and r["finished"]]

        (row,) = wait_for(archived, 60, "the run in the archive of the stack's data dir")
        assert row["name"] == "my-first-run" and row["last_step"] == 19
        assert (data / "archive").is_dir() and not (Path.home() / ".metricbus" / "spool" / run_id).exists()
        table = metricbus("runs", env=env)
        assert "my-first-run" in table.stdout and "using the stack of `metricbus up`" in table.stderr
        status = metricbus("status", "--json", env=env)  # answered by the stack's own dashboard
        assert run_id in status.stdout, status.stdout + status.stderr
        assert json.loads(status.stdout)["source"] == f"the dashboard at http://127.0.0.1:{web}/"
        sampled = metricbus("status", "--json", "--sample", "--window", "0.5", env=env)
        assert run_id in sampled.stdout and "source" not in json.loads(sampled.stdout)
        health = metricbus("health", "my-first-run", env=env)  # by its name
        assert health.returncode == 0 and f"run {run_id}: health" in health.stdout, health.stderr
        assert f"(as the dashboard at http://127.0.0.1:{web}/ judged it)" in health.stdout  # warm there
        judged = json.loads(metricbus("health", run_id, "--json", env=env).stdout)
        assert judged["source"] == f"the dashboard at http://127.0.0.1:{web}/"
        pipeline = next(p for p in judged["parts"] if p["name"] == "pipeline")
        assert pipeline["evidence"] == [] and pipeline["deducted"] == 0  # its dead letters were read: none

        # the NaN loss's alert, on up's own terminal, with the run's name
        wait_for(
            lambda: any("metricbus alert: [FIRING] critical nan_loss: run my-first-run" in x for x in lines),
            60,
            "the alert on up's terminal: " + "".join(lines),
        )
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            missing: list[str] = []
            page.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
            page.goto(url)
            expect(page.get_by_text("my-first-run").first).to_be_visible(timeout=30_000)
            expect(page).to_have_title("my-first-run · metricbus")  # the run's name, a favicon inline
            page.screenshot(path=str(tmp_path / "run-page.png"))
            assert not missing, missing
            browser.close()
    finally:
        up.send_signal(signal.SIGKILL)  # a stack that dies without cleaning up: its file stays
        up.wait(30)
    assert list(runtime.glob("*.json")), "the killed stack's file is left behind"
    after = metricbus("runs", "--json", env=env)
    assert "is not running any more" in after.stderr and not list(runtime.glob("*.json")), after.stderr
    assert "using the stack" not in after.stderr
    # with the stack gone, its runs are still listed from its archive
    listed = json.loads(metricbus("runs", "--json", "--data-dir", str(data), env=env).stdout)
    assert [r["run_id"] for r in listed] == [run_id] and listed[0]["finished"]


def test_finish_with_the_broker_refusing_returns_long_before_its_timeout_and_sync_delivers_everything(
    settings, tmp_path
):
    refusing = Settings(
        bootstrap=f"127.0.0.1:{free_port()}", data_dir=settings.data_dir, topic_prefix=settings.topic_prefix
    )
    run = Run("p", name="offline-by-accident", settings=refusing, system_metrics=False)
    for step in range(200):
        run.log({"Train/Loss": float(step)}, step=step)
    started = time.monotonic()
    assert run.finish() is False  # its timeout: 10 s
    # it gives up after 0.5 s of refused connections (REFUSED_GIVE_UP_S); 3 s leaves a loaded
    # machine room while still telling it from waiting out the timeout
    assert time.monotonic() - started < 3.0
    out = subprocess.run(cli(settings, "sync"), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    codec = default_codec()
    events = [
        e for r in read_topic(settings, settings.topics.events, 1) for e in decode_events(codec, r.value)
    ]
    mine = [e for e in events if e.run_id == run.run_id]
    assert sorted(e.seq for e in mine) == list(range(len(mine))) and len(mine) == 202  # start, 200, finish


def test_a_consumer_started_before_the_broker_waits_for_it_then_consumes(settings, tmp_path):
    port = free_port()
    later = Settings(local_port=port, data_dir=settings.data_dir, topic_prefix=settings.topic_prefix)
    env = {**os.environ, **later.to_env()}
    log = tmp_path / "sink.log"
    with open(log, "wb") as out:
        sink = subprocess.Popen(
            [sys.executable, "-m", "metricbus", "sink", "parquet", "--flush-interval", "0.3"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    broker = None
    try:
        wait_for(lambda: "waiting for it" in log.read_text(), 30, "the sink to say it waits for the broker")
        assert sink.poll() is None
        from metricbus.schemas import ensure_topics
        from metricbus.stack import EmbeddedBroker

        broker = EmbeddedBroker(port, log_path=tmp_path / "broker.log").start()
        ensure_topics(later)
        run = Run("p", name="late-broker", settings=later, system_metrics=False)
        for step in range(10):
            run.log({"x": float(step)}, step=step)
        assert run.finish(timeout=30)
        from metricbus.sinks import run_extent

        wait_for(
            lambda: (run_extent(later.archive_dir, run.run_id) or {}).get("events") == 12, 60, "the archive"
        )
    finally:
        sink.terminate()
        sink.wait(30)
        if broker is not None:
            broker.stop()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert text.count("waiting for it") == 1, text
