"""One adversarial run through `metricbus up` into every sink and alert consumer, read back
with each sink's users' own tool; then the same with every sink kill -9'ed mid-run; then
replays, twice into the same place.

Asserted for each sink: every logged and every derived scalar (the per-label series of
labelled episodes among them) exactly once, at the same
step, with the same value (float32 for TensorBoard, as it stores them); one W&B run per
metricbus run, in the run's own project; every alert printed once by the console consumer.
A new sink joins the suite with one line in READERS.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import metricbus
from metricbus.schemas import aggregate_points, decode_aggregates, default_codec
from metricbus.sinks import read_table
from metricbus.sinks.alerts import format_alert
from metricbus.sinks.tensorboard import tag

from .conftest import cli, free_port, read_topic

pytestmark = pytest.mark.integration

PROJECT = "conformance"
STEPS = 90
NAMES = {  # logged scalar -> value at step s
    "Train/Loss": lambda s: math.nan if s == 40 else math.inf if s == 41 else 1.0 / (s + 1),
    "Train/AvgReward": lambda s: 0.4 + 0.004 * s,
    "big/offset": lambda s: 1e9 + 1e-3 * s,
    "métrique/ü🙂": lambda s: float(s % 5),
    "unsafe name/a:b*c?": lambda s: -float(s),
    "huge/range": lambda s: 1e300 if s % 2 else -1e300,  # squares, sums and spreads past float's range
}


def _key(value: float, f32: bool) -> str:
    value = float(value) + 0.0  # W&B's JSON writes 1.0 as 1, and -0.0 as 0 (equal values)
    if f32:
        with np.errstate(over="ignore"):  # past float32's range: inf, as TensorBoard keeps it
            value = float(np.float32(value))
    return "nan" if math.isnan(value) else repr(value)


def train(settings, stop_at: dict[int, callable] | None = None) -> tuple[str, Counter]:
    """The adversarial run; returns its id and the logged scalars as (name, step, value)."""
    run = metricbus.init(
        project=PROJECT,
        name="adversarial",
        config={"lr": 3e-4, "note": "ü"},
        settings=settings,
        system_metrics=False,
    )
    logged: Counter = Counter()
    for s in range(STEPS):
        scalars = {name: f(s) for name, f in NAMES.items()}
        samples = {
            "Train/Reward": [0.1 * (s % 7), 0.2, math.nan],
            "rewards/format": [1.0, math.inf, 0.0, 0.5] + ([1e308, -1e308] if s == 60 else []),
        }
        run.log({**scalars, **samples}, step=s, epoch=s // 30)
        logged.update((n, s, v) for n, v in scalars.items())
        if s == 50:  # a step that goes backwards
            run.log({"late/backwards": 7.0}, step=3)
            logged[("late/backwards", 3, 7.0)] += 1
        if s % 30 == 10:
            run.log_histogram("weights/layer0", np.linspace(-1, 1, 50) * (s + 1), step=s)
        if s % 3 == 1:  # a labelled episode, hostile labels included: by_<key>/<value>/... derived
            task = ("logo a/ü", "../etc", "plain")[s % 9 // 3]
            run.log_episode(
                0.01 * s, length=s, success=s % 2 == 0, reason="timeout", labels={"task": task}, step=s
            )
            episode = {
                "episode/reward": 0.01 * s,
                "episode/length": float(s),
                "episode/success": float(s % 2 == 0),
            }
            logged.update((n, s, v) for n, v in episode.items())
        if stop_at and s in stop_at:
            stop_at[s]()
        time.sleep(0.04)
    run.log_table("eval/samples", ["prompt", "score"], [["a", 0.5], ["b", None]], step=STEPS)
    assert run.finish(timeout=30)
    return run.run_id, logged


def expected_derived(settings, run_id: str, timeout: float = 90.0) -> Counter:
    """What the worker published for the run, once it closed the run: (name, step, value)."""
    codec = default_codec()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen: dict[int, dict] = {}
        closed = False
        for record in read_topic(settings, settings.topics.aggregates, 1, timeout=10):
            if record.key != run_id.encode():
                continue
            _, raw = codec.decode(record.value)
            derived = decode_aggregates(codec, record.value)
            decoded = sum(len(e.body.get("scalars", {})) for e in derived.events)
            assert decoded == len(aggregate_points(raw)), "two points of one name at one step in one record"
            closed = closed or derived.closes_run
            for e in derived.events:
                seen[e.seq] = e.body
        if closed:
            assert sorted(seen) == list(range(len(seen))), "derived seqs must run 0..n-1 with no gap"
            return Counter(
                (name, body["step"], value)
                for body in seen.values()
                for name, value in body.get("scalars", {}).items()
            )
        time.sleep(1.0)
    raise AssertionError(f"the worker never closed run {run_id}")


# -- each sink read back with its users' tool -----------------------------------------------


def read_parquet(root: Path, run_id: str) -> Counter:
    import duckdb

    files = [str(p) for p in Path(root).glob("project=*/run=*/*.parquet")]
    if not files:
        return Counter()
    table = read_table(root, run_id)  # the files a compaction replaced are left out, as users get them
    con = duckdb.connect()
    con.register("t", table)
    rows = con.execute(
        "SELECT name, step, value FROM t WHERE kind = 'metricbus.Metrics' AND samples IS NULL"
    ).fetchall()
    return Counter((n, s, v) for n, s, v in rows)


def read_tensorboard(root: Path, run_id: str) -> Counter:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: Counter = Counter()
    for directory in Path(root).glob(f"*/*{run_id}"):
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
        acc.Reload()
        for t in acc.Tags()["scalars"]:
            out.update((t, e.step, e.value) for e in acc.Scalars(t))
    return out


def read_wandb(root: Path, run_id: str) -> Counter:
    from tests.wandb_reader import read_run, run_files

    if not run_files(root, run_id):
        return Counter()
    run = read_run(root, run_id, every_opening=True)
    if not run["projects"]:  # a run file opened this instant holds no run record yet: read again
        raise ValueError(f"a W&B file of {run_id} without its run record yet")
    assert run["projects"] == {PROJECT}, run["projects"]
    out: Counter = Counter()
    for row in run["history"]:
        step = row["metricbus/step"]
        for name, value in _flatten(row):
            if not name.startswith(("metricbus/", "_")) and not isinstance(value, dict):
                out[(name, step, value)] += 1
    return out


def _flatten(row: dict, prefix: str = ""):
    for k, v in row.items():
        if isinstance(v, dict) and "_type" not in v:
            yield from _flatten(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", v


#: sink -> (reader, output under the data dir, how its tool stores values). One line per sink.
READERS = {
    "parquet": (read_parquet, "archive", False),
    "tensorboard": (read_tensorboard, "tensorboard", True),
    "wandb": (read_wandb, "wandb", False),
}


def as_sink_sees(points: Counter, sink: str) -> Counter:
    f32 = READERS[sink][2]
    name = tag if sink == "tensorboard" else (lambda n: n)
    return Counter({(name(n), s, _key(v, f32)): c for (n, s, v), c in points.items()})


def normalised(found: Counter, f32: bool) -> Counter:
    return Counter({(n, s, _key(v, f32)): c for (n, s, v), c in found.items()})


def compare(
    sink: str,
    root: Path,
    run_id: str,
    expected: Counter,
    timeout: float = 60.0,
) -> dict:
    """Poll the sink's output until it equals ``expected`` (or time out); report the counts."""
    reader, _, f32 = READERS[sink]
    want = as_sink_sees(expected, sink)
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = normalised(reader(root, run_id), f32)
        except (OSError, ValueError, EOFError):  # a file being written: read again
            found = Counter()
        if found == want or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    report = {
        "expected": sum(want.values()),
        "found": sum(min(c, want[k]) for k, c in found.items()),
        "duplicated": sum(max(0, c - want[k]) for k, c in found.items() if k in want),
        "unexpected": sum(c for k, c in found.items() if k not in want),
    }
    print(f"{sink}: {report}")
    detail = (sink, report, list((want - found).items())[:5], list((found - want).items())[:5])
    assert found == want, detail
    return report


# -- the stack ------------------------------------------------------------------------------


class Up:
    """`metricbus up` against the session's broker, as a user starts it."""

    def __init__(self, settings) -> None:
        env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
        env.pop("WANDB_API_KEY", None)
        self.out = Path(settings.data_dir) / "up.out"
        self.proc = subprocess.Popen(
            cli(settings, "up", "--dashboard-port", str(free_port())),  # 8765 may be another test's
            stdout=open(self.out, "wb"),
            stderr=subprocess.STDOUT,
            env=env,  # noqa: SIM115
        )
        self.wait_for("metricbus is up", 90)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.text():
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.2)

    def pid(self, child: str) -> int:
        return int(re.findall(rf"^{child}\s+pid (\d+)", self.text(), re.M)[0])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(60) == 0, self.text()


def console_lines(settings, run_id: str) -> Counter:
    log = Path(settings.data_dir) / "logs" / "alerts-console.log"
    return Counter(line for line in log.read_text().splitlines() if line.startswith("[") and run_id in line)


def expected_alerts(settings, run_id: str) -> Counter:
    codec = default_codec()
    records = read_topic(settings, settings.topics.alerts, 1, timeout=10)
    return Counter(format_alert(codec.decode(r.value)[1]) for r in records if r.key == run_id.encode())


def check_every_sink(settings, run_id: str, logged: Counter) -> dict:
    derived = expected_derived(settings, run_id)
    assert any(n == "Epoch/AvgLoss" for n, _, _ in derived) and any(
        n.startswith("final/") for n, _, _ in derived
    )
    names = {n for n, _, _ in derived}
    assert {"by_task/logo_a__/episode/success_recent_mean", "by_task/.._etc/share"} <= names, sorted(names)
    expected = logged + derived
    reports = {}
    for sink, (_, where, _) in READERS.items():
        root = Path(settings.data_dir) / where
        reports[sink] = compare(sink, root, run_id, expected)
    alerts = expected_alerts(settings, run_id)
    assert any("nonfinite" in line or "NaN" in line for line in alerts), alerts
    deadline = time.monotonic() + 30
    while console_lines(settings, run_id) != alerts and time.monotonic() < deadline:
        time.sleep(0.5)
    assert console_lines(settings, run_id) == alerts  # each alert printed once
    return reports


def no_restarts_or_tracebacks(settings, up: Up) -> None:
    assert "exited with code" not in up.text(), up.text()
    for log in (Path(settings.data_dir) / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(errors="replace"), (log, log.read_text()[-3000:])


def test_every_sink_holds_every_point_once_live_and_after_two_replays(settings, tmp_path):
    up = Up(settings)
    try:
        run_id, logged = train(settings)
        reports = check_every_sink(settings, run_id, logged)
    finally:
        up.stop()
    no_restarts_or_tracebacks(settings, up)
    assert "Traceback" not in up.text()

    derived = expected_derived(settings, run_id)
    for sink in READERS:
        out = tmp_path / f"replay-{sink}"
        for attempt in range(2):  # the second replay into the same place must change nothing
            done = subprocess.run(
                cli(settings, "replay", "--run", run_id, "--to", sink, "--out", str(out)),
                capture_output=True,
                text=True,
                env={**os.environ, "WANDB_MODE": "offline"},
            )
            assert done.returncode == 0, done.stderr
            assert ("already there" in done.stdout) == (attempt == 1), done.stdout
            reader_root = out
            compare(sink, reader_root, run_id, logged + derived, timeout=5)
    print("live:", reports)


def test_every_sink_holds_every_point_once_after_each_is_killed_mid_run(settings):
    up = Up(settings)

    def kill(child: str):
        def do() -> None:
            os.kill(up.pid(child), signal.SIGKILL)

        return do

    try:
        kills = {20: kill("sink-parquet"), 35: kill("sink-tensorboard"), 50: kill("sink-wandb")}
        run_id, logged = train(settings, kills)
        # Every sink exactly once: Parquet and TensorBoard by their ledgers (TensorBoard cuts
        # what a killed process appended after its last save), W&B by reading its own run file.
        reports = check_every_sink(settings, run_id, logged)
        for child in ("sink-parquet", "sink-tensorboard", "sink-wandb"):
            assert f"{child} exited with code -9" in up.text(), up.text()
    finally:
        up.stop()
    print("after kill -9:", reports)
