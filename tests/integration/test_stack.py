import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from .conftest import free_port

pytestmark = pytest.mark.integration


def metricbus(*args, data_dir):
    return [sys.executable, "-m", "metricbus", "--data-dir", str(data_dir), *args]


def wait_line(proc, text, timeout=30.0):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"{text!r} not printed; got {seen}")


def stop_up(proc, clean=False):
    """SIGTERM `up` and wait; with ``clean``, it must exit 0. Killed if it does not exit."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(30)
        assert not clean or code == 0, code
    finally:
        if proc.poll() is None:
            proc.kill()


def start_up(tmp_path, *args):
    """`metricbus up` on a free port; returns (process, port, the lines it printed)."""
    port = free_port()
    env = {**os.environ, "METRICBUS_LOCAL_PORT": str(port)}
    if "--dashboard-port" not in args and "--no-dashboard" not in args:
        # a port of its own: two `up`s starting at once (parallel tests) both found 8765 free,
        # and the second's dashboard could not bind it
        args = (*args, "--dashboard-port", str(free_port()))
    proc = subprocess.Popen(
        metricbus("up", *args, data_dir=tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    return proc, port, wait_line(proc, "metricbus is up")


def test_up_starts_broker_and_consumers_and_sigterm_stops_every_child(tmp_path):
    from metricbus.stream_jobs import DEFAULT_RULES

    (tmp_path / "stream.yaml").write_text("metric_stats: [recent_mean, p99]\n")
    proc, port, lines = start_up(
        tmp_path, "--rules", str(DEFAULT_RULES), "--config", str(tmp_path / "stream.yaml")
    )
    try:
        assert any(f"127.0.0.1:{port}" in line for line in lines)
        assert any("sink-parquet" in line for line in lines) and any(
            "stream-worker" in line for line in lines
        )
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "tansu" in names and "sink parquet" in names and "worker" in names
        (worker,) = [c.cmdline() for c in children if "worker" in c.cmdline()]
        assert worker[-4:] == ["--rules", str(DEFAULT_RULES), "--config", str(tmp_path / "stream.yaml")]
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - t0 < 15
        gone, alive = psutil.wait_procs(children, timeout=5)
        assert alive == [], [c.cmdline() for c in alive]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_children_die_with_a_killed_supervisor(tmp_path):
    proc, _, _ = start_up(tmp_path)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()  # no chance to clean up: PDEATHSIG must take the children down
    proc.wait(5)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], [c.cmdline() for c in alive]


def test_a_taken_port_is_a_clear_error_naming_the_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            metricbus("broker", "--port", str(port), data_dir=tmp_path),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "--port" in result.stderr


def test_demo_trains_and_reads_every_event_back_from_the_archive(tmp_path):
    env = {**os.environ, "METRICBUS_LOCAL_PORT": str(free_port())}
    result = subprocess.run(
        metricbus("demo", "--updates", "3", data_dir=tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "all acknowledged by Kafka: True" in out
    held = next(line for line in out.splitlines() if line.startswith("archive holds"))
    n, total = held.split()[2].split("/")
    assert n == total and int(total) > 5
    for metric in (
        "Train/PolicyLoss",
        "Train/Entropy",
        "Train/ApproxKL",
        "Train/ClipFraction",
        "Train/GradNorm",
        "Train/LearningRate",
        "Performance/Rollout_StepsPerSec",
        "Train/Loss",
        "episode/success",
    ):
        assert metric in out, metric
    # every CartPole episode with its outcome, and the stream's per-termination series
    assert "episodes by how they ended" in out and "pole_fell" in out
    # the policy drawn at the first and last update: in the archive (all of which the demo waited
    # for), its bytes in the media store, and the first in TensorBoard (the last may not have been
    # read by the live sink before the demo stopped its stack)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from metricbus.schemas import MEDIA, MediaStore, Settings
    from metricbus.sinks import read_events

    settings = Settings(data_dir=tmp_path)
    (run_dir,) = (tmp_path / "tensorboard" / "demo-cartpole").iterdir()
    run_id = (run_dir / ".metricbus-run").read_text()  # the TensorBoard sink's owner file
    media = [e.body for e in read_events(settings.archive_dir, run_id) if e.kind == MEDIA]
    assert [(b["name"], b["step"]) for b in media] == [("policy/push_right", 0), ("policy/push_right", 2)]
    assert all(MediaStore.of(settings).get(b["ref"], b["size"]) for b in media)
    acc = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    acc.Reload()
    assert acc.Images("policy/push_right")[0].step == 0


def test_up_restarts_a_killed_broker_says_so_and_the_archive_loses_nothing(tmp_path):
    """Issue 13 point 5: the memory-only broker dies mid-run; everything logged reaches the archive once."""
    from metricbus.producers import Run
    from metricbus.schemas import Settings
    from metricbus.sinks import read_table

    # what this test reads is the archive: the other sinks and the dashboard are left out
    proc, port, _ = start_up(tmp_path, "--no-dashboard", "--no-tensorboard", "--no-wandb")
    try:
        settings = Settings(bootstrap=f"127.0.0.1:{port}", data_dir=tmp_path)
        run = Run("chaos", settings=settings, system_metrics=False)
        for step in range(300):
            run.log({"x": float(step)}, step=step)
        assert run._publisher.flush(20)  # acknowledged: some of it not yet read by the sink
        (tansu,) = [
            c for c in psutil.Process(proc.pid).children(recursive=True) if "tansu" in " ".join(c.cmdline())
        ]
        tansu.kill()
        for step in range(300, 600):
            run.log({"x": float(step)}, step=step)
            time.sleep(0.005)
        lines = wait_line(proc, "the embedded broker exited", timeout=30)
        assert run.finish(timeout=60)
        deadline = time.monotonic() + 90
        steps: list = []
        while time.monotonic() < deadline:
            try:
                table = read_table(settings.archive_dir, run.run_id)
                steps = sorted(
                    s for n, s in zip(table["name"].to_pylist(), table["step"].to_pylist()) if n == "x"
                )
            except (FileNotFoundError, ValueError, KeyError):
                steps = []
            if len(steps) >= 600:
                break
            time.sleep(1)
        assert steps == list(range(600))  # every step once: nothing lost, duplicates dropped
        assert any("memory-only" in line for line in lines + [proc.stdout.readline()])
    finally:
        stop_up(proc)


def test_up_serves_the_dashboard_status_and_every_process_counters(tmp_path):
    """Issue 9: `up` runs the dashboard; its /api/status sees the run, /metrics every child's counters."""
    import json
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from metricbus.producers import Run
    from metricbus.schemas import Settings

    web = free_port()
    proc, port, lines = start_up(tmp_path, "--dashboard-port", str(web))
    try:
        assert any(f"http://127.0.0.1:{web}/" in line for line in lines)
        settings = Settings(bootstrap=f"127.0.0.1:{port}", data_dir=tmp_path)
        run = Run("ops", name="under-up", settings=settings, system_metrics=False)
        for step in range(20):
            run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
        assert run.finish(timeout=30)
        deadline = time.monotonic() + 60
        written: dict = {}
        rows: list = []
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/status", timeout=5) as r:  # noqa: S310
                rows = [x for x in json.load(r)["runs"] if x["run_id"] == run.run_id]
            with urllib.request.urlopen(f"http://127.0.0.1:{web}/metrics", timeout=5) as r:  # noqa: S310
                families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
            found = families.get("metricbus_consumer_written")
            written = {
                s.labels["group"]: s.value
                for s in (found.samples if found else [])
                if s.name.endswith("_total")
            }
            found = families.get("metricbus_worker_events")
            derived_from = sum(s.value for s in (found.samples if found else []) if s.name.endswith("_total"))
            if (
                rows
                and rows[0]["state"] == "finished"
                and written.get("metricbus.sink.parquet", 0) >= 22
                and derived_from >= 22
            ):
                break
            time.sleep(1)
        assert rows and rows[0]["last_step"] == 19 and rows[0]["state"] == "finished"
        # RunStarted + 20 Metrics + RunFinished, written by the Parquet sink process, counted by it
        assert written.get("metricbus.sink.parquet", 0) >= 22, written
        assert derived_from >= 22  # the stream worker's counter, from its own process
        forgotten = families["metricbus_worker_forgotten_runs"].samples  # within max_partition_series
        assert [s.value for s in forgotten if s.name.endswith("_total")] == [0.0]
    finally:
        stop_up(proc, clean=True)
    log = (tmp_path / "logs" / "dashboard.log").read_text()
    assert "Traceback" not in log


def test_up_with_two_workers_and_two_instances_of_each_sink_shares_the_partitions(tmp_path):
    """Issue 11: `up --workers 2 --sink-instances 2`: every child in its group gets partitions, and
    every event of several runs reaches the archive once, with what the workers derived."""
    from metricbus.producers import Run
    from metricbus.schemas import METRICS, Settings
    from metricbus.sinks import read_events

    proc, port, lines = start_up(
        tmp_path, "--workers", "2", "--sink-instances", "2", "--no-dashboard", "--no-wandb"
    )
    try:
        assert any("stream-worker-2" in line for line in lines) and any(
            "sink-parquet-2" in line for line in lines
        )
        settings = Settings(bootstrap=f"127.0.0.1:{port}", data_dir=tmp_path)
        runs = [Run("scale", name=f"r{i}", settings=settings, system_metrics=False) for i in range(8)]
        for step in range(30):
            for run in runs:
                run.log({"Train/Loss": 1.0 / (step + 1)}, step=step, epoch=step // 10)
        for run in runs:
            assert run.finish(timeout=30)
        logs = tmp_path / "logs"
        deadline = time.monotonic() + 90
        done: dict = {}
        while time.monotonic() < deadline and len(done) < len(runs):
            for run in runs:
                try:
                    events = read_events(settings.archive_dir, run.run_id, derived=True)
                except (FileNotFoundError, ValueError):
                    continue
                derived = [e for e in events if e.producer_id == "metricbus.stream"]
                if any(
                    "Epoch/AvgLoss" in e.body.get("scalars", {}) and e.body["epoch"] == 2 for e in derived
                ):
                    done[run.run_id] = events
            time.sleep(1)
        assert len(done) == len(runs)
        for run in runs:
            logged = [e for e in done[run.run_id] if e.producer_id == run.producer_id]
            assert [e.seq for e in logged] == list(range(32))  # RunStarted, 30 steps, RunFinished; once
            assert sorted(e.body["step"] for e in logged if e.kind == METRICS) == list(range(30))
        for name in ("stream-worker", "stream-worker-2"):
            assert "state rebuilt" in (logs / f"{name}.log").read_text(), name  # each got partitions
        for name in ("sink-parquet", "sink-parquet-2", "sink-tensorboard", "sink-tensorboard-2"):
            assert 'assigned ["TopicPartition' in (logs / f"{name}.log").read_text(), name
    finally:
        stop_up(proc, clean=True)


def test_up_restarts_a_broker_over_its_memory_bound_and_nothing_is_lost_or_derived_twice(tmp_path):
    """Issue 14: the memory-only broker keeps every record; past METRICBUS_BROKER_MAX_MB, once every
    group has read everything, `up` restarts it. The archive and the worker's series go on whole."""
    from metricbus.producers import Run
    from metricbus.schemas import DERIVED_PRODUCER, Settings
    from metricbus.sinks import read_events
    from metricbus.stream_jobs import derive_all

    port = free_port()
    env = {**os.environ, "METRICBUS_LOCAL_PORT": str(port), "METRICBUS_BROKER_MAX_MB": "30"}
    proc = subprocess.Popen(
        metricbus("up", "--no-dashboard", "--no-wandb", data_dir=tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        wait_line(proc, "metricbus is up")
        settings = Settings(bootstrap=f"127.0.0.1:{port}", data_dir=tmp_path)
        run = Run("memory", settings=settings, system_metrics=False, max_block_s=5.0)
        # 32 kB an event: the broker's memory grows fast (random doubles: the producer's zstd
        # batches cannot shrink them much), the archive stays small
        import numpy as np

        big = np.random.default_rng(14).random((700, 4_000)).tolist()

        def log(n: int, step: int) -> int:
            for _ in range(n):
                run.log({"Train/Loss": 1.0 / (step + 1), "big": big[step]}, step=step, epoch=step // 100)
                step += 1
            assert run._publisher.flush(60)
            return step

        step = 0
        for _ in range(3):  # ~20 MB produced on a broker that starts at ~20 MB: over the bound
            step = log(200, step)
        # a restart put off (the consumers still need too much of what it holds) is retried a
        # minute later: said only once it goes ahead
        lines = wait_line(proc, "restarting it to free that memory", timeout=240)
        step = log(100, step)  # logged after the restart
        assert run.finish(timeout=60)
        deadline = time.monotonic() + 180
        logged: list = []
        derived: list = []
        while time.monotonic() < deadline:
            try:
                events = read_events(settings.archive_dir, run.run_id, derived=True)
            except (FileNotFoundError, ValueError, KeyError):
                events = []
            logged = [
                e for e in events if e.producer_id != DERIVED_PRODUCER and e.kind == "metricbus.Metrics"
            ]
            derived = [e for e in events if e.producer_id == DERIVED_PRODUCER]
            if len(logged) >= step and any("final/" in n for e in derived for n in e.body.get("scalars", {})):
                break
            time.sleep(2)
        assert sorted(e.body["step"] for e in logged) == list(range(step))  # every step once
        (done,) = [
            line for line in wait_line(proc, "planned broker restart 1 done") if "restart 1 done" in line
        ]
        # every group resumed on the new broker where it was (none read the carry again), the
        # worker's checkpoints moved with it. When the consumers had read everything, nothing
        # is carried and no group has a position to resume at: each reads the empty new topics
        # from the start
        count = re.search(r"(\d+) records carried", done)
        assert count is not None, done
        carried = int(count.group(1))
        resumed = "metricbus.sink.parquet" in done and "metricbus.stream" in done
        assert resumed if carried else "where they were: none" in done, done
        got = {
            (n, e.body["step"]): v
            for e in derived
            for n, v in e.body.get("scalars", {}).items()
            if n.startswith("Epoch/")
        }
        ordered = sorted((e for e in events if e.producer_id != DERIVED_PRODUCER), key=lambda e: e.seq)
        want = {
            (p.name, p.step): p.value
            for p in derive_all([(e.kind, e.body, e.ts_ms) for e in ordered])
            if p.name.startswith("Epoch/")
        }
        assert got == want  # the worker's epochs across the restart equal an uninterrupted derivation
        assert len({e.seq for e in derived}) == len(derived)  # no derived event twice
        assert any("memory-only" in line or "METRICBUS_BROKER_MAX_MB" in line for line in lines)
    finally:
        stop_up(proc)


def test_two_ups_in_a_row_on_one_data_dir_serve_the_dashboard_at_the_same_url(tmp_path):
    """The links a run printed still work after a restart: the data dir keeps the dashboard's port."""
    (tmp_path / "dashboard.port").write_text(f"{free_port()}\n")  # chosen by an earlier `up`
    urls = []
    for _ in range(2):
        proc, _, lines = start_up(tmp_path, "--dashboard-port", "0", "--no-tensorboard", "--no-wandb")
        try:
            (url,) = [line.split()[1] for line in lines if line.startswith("dashboard    http")]
            urls.append(url)
        finally:
            stop_up(proc, clean=True)
    assert urls[0] == urls[1] == f"http://127.0.0.1:{(tmp_path / 'dashboard.port').read_text().strip()}/"


def test_ports_that_clash_or_are_taken_are_refused_before_anything_starts_in_one_line(tmp_path):
    port = free_port()
    same = subprocess.run(
        metricbus("up", "--port", str(port), "--dashboard-port", str(port), data_dir=tmp_path),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert same.returncode == 2 and same.stdout == ""  # nothing started, nothing described
    assert same.stderr.count("\n") == 1
    assert (
        f"--port {port} is the embedded broker's and --dashboard-port {port} the dashboard's" in same.stderr
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        result = subprocess.run(
            metricbus("up", "--port", str(busy), "--no-dashboard", data_dir=tmp_path),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert f"port {busy} is in use: the embedded broker needs a free port (--port P" in result.stderr


def test_up_publishes_what_runs_spooled_while_no_stack_ran(tmp_path):
    """A script run before `up` kept its events in the spool; `up` delivers them, saying so."""
    from metricbus.producers import Run
    from metricbus.schemas import Settings
    from metricbus.sinks import tidy

    offline = Settings(data_dir=tmp_path, bootstrap=f"127.0.0.1:{free_port()}")  # nothing listens
    run = Run("early", name="before-up", settings=offline, system_metrics=False)
    for step in range(300):
        run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
    assert not run.finish(timeout=2)  # kept in the spool, said
    proc, _, lines = start_up(tmp_path, "--no-dashboard", "--no-tensorboard", "--no-wandb")
    try:
        said = wait_line(proc, "published", timeout=60)
        assert any("1 run(s) logged while no stack ran wait in" in line for line in lines + said)
        assert any("published 302 events of 1 run(s)" in line for line in said), said
        deadline = time.monotonic() + 60
        while True:  # the archive sink writes it: nothing else was run
            rows = (
                tidy(tmp_path / "archive", run.run_id, derived=False)
                if (tmp_path / "archive").exists()
                else None
            )
            if rows is not None and rows.num_rows == 300:
                break
            assert time.monotonic() < deadline, "the spooled run never reached the archive"
            time.sleep(0.5)
        assert rows["value"].to_pylist() == [1.0 / (s + 1) for s in range(300)]
    finally:
        stop_up(proc, clean=True)
