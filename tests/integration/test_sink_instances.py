"""`up --sink-instances 2` while instances come and go (issue 53).

Two instances of every sink and alert deliverer share each group's partitions. In each group one
instance writes slower than the group's session timeout (every write and every flush of its
destination takes SLOW_S seconds longer: ``slow_writes/sitecustomize.py``) and the other is
killed -9 mid-run (``up`` starts it again). Every logged step must then be once in every sink's
own files (the archive, TensorBoard's event reader, W&B's run records), every alert once on the
console, and ``status`` must never call a live group STOP.
"""

from __future__ import annotations

import collections
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from .conftest import free_port, log_in_rounds, spread_run_ids
from .test_stack import metricbus, stop_up, wait_line

pytestmark = pytest.mark.integration

PARTITIONS = 4  # `up`'s default: two runs on each
RUNS = 8
STEPS = 60
KILL_AT = 40  # the NaN losses (step 20) are delivered and committed by then
SLOW_S = 7.0  # past the 6 s session timeout
STOP_AFTER_S = 12.0  # `status` calls a group STOP whose oldest waiting record is older than this
KINDS = {  # an instance's command line -> its sink
    "parquet": ("sink", "parquet"),
    "tensorboard": ("sink", "tensorboard"),
    "wandb": ("sink", "wandb"),
    "alerts": ("alerts", "--console"),
}


def values(run: int, step: int) -> dict[str, float]:
    loss = math.nan if (run % 3 == 0 and step == 20) else 1.0 / (step + 1) + run
    return {"Train/Loss": loss, "Train/AvgReward": ((step * (run + 1)) % 10) / 10}


def test_two_instances_of_every_sink_one_slow_one_killed_keep_every_step_once(tmp_path):
    from metricbus.producers import Run
    from metricbus.schemas import Settings

    slow = tmp_path / "slow"
    slow.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "METRICBUS_LOCAL_PORT": str(port),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent / "slow_writes"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "METRICBUS_TEST_SLOW_DIR": str(slow),
        "METRICBUS_TEST_SLOW_S": str(SLOW_S),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }
    env.pop("WANDB_API_KEY", None)  # W&B offline: nothing leaves the machine
    proc = subprocess.Popen(
        metricbus("up", "--sink-instances", "2", "--no-dashboard", data_dir=tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    settings = Settings(bootstrap=f"127.0.0.1:{port}", data_dir=tmp_path)
    statuses = Statuses(settings)
    try:
        wait_line(proc, "metricbus is up", timeout=60)
        settled(tmp_path / "logs")  # both instances of each sink joined: no rebalance to come
        ids = spread_run_ids(PARTITIONS, RUNS // PARTITIONS)
        runs = [Run("scale", run_id=r, settings=settings, system_metrics=False) for r in ids]
        slowed = wait_elected(slow)
        statuses.start()
        killed: dict[str, int] = {}

        def at_step(step: int) -> None:
            if step == KILL_AT:
                alerts_delivered(settings, tmp_path, timeout=90)  # the NaN alerts' commits are in
                for kind in ("parquet", "tensorboard", "wandb"):
                    kept_its_partitions_through_a_slow_write(tmp_path / "logs", kind)
                killed.update(kill_the_others(proc.pid, slowed))

        log_in_rounds(runs, STEPS, values, at_step)
        assert set(killed) == set(KINDS)

        every_step_once_in_the_archive(settings, ids)
        every_step_once_in_tensorboard(tmp_path / "tensorboard", ids)
        every_step_once_in_wandb(tmp_path / "wandb", ids)
        printed, expected = alerts_delivered(settings, tmp_path, timeout=120)
        assert printed == expected  # each alert once over both consoles
        assert any(line.startswith("[FIRING]") for line in expected)  # the NaN losses fired
    finally:
        statuses.stop()
        stop_up(proc)
    assert statuses.seen, "status never answered"
    stopped = [g for snap in statuses.seen for g in snap["groups"] if g["status"] == "STOP"]
    assert not stopped, stopped  # a group whose consumers live is never STOP, however slow


def wait_elected(where: Path, timeout: float = 60.0) -> dict[str, int]:
    """The pid of the slowed instance of each sink (each writes its pid once it is elected)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {k: (where / k).read_text() for k in KINDS if (where / k).exists()}
        if len(pids) == len(KINDS) and all(pids.values()):
            return {k: int(v) for k, v in pids.items()}
        time.sleep(0.2)
    raise AssertionError(f"not every sink has a slowed instance: {sorted(p.name for p in where.iterdir())}")


def kept_its_partitions_through_a_slow_write(logs: Path, kind: str, timeout: float = 60.0) -> None:
    """The slowed instance of ``kind`` wrote once past its session timeout, and its group did
    not move a partition meanwhile: no instance of it was assigned any from the write's start
    until 5 s after its end (a session that expired would have been noticed by then)."""
    mark = "metricbus test: slowed:"

    def texts() -> dict[str, list[str]]:
        return {log.name: log.read_text().splitlines() for log in logs.glob(f"sink-{kind}*.log")}

    def slowed() -> list[str]:
        return next((t for t in texts().values() if any(f"{mark} this instance" in x for x in t)), [])

    wait(lambda: any(f"{mark} a write took" in line for line in slowed()), timeout, f"{kind}: a slow write")
    begun = next(at(line) for line in slowed() if f"{mark} a write begins" in line)
    done = next(at(line) for line in slowed() if f"{mark} a write took" in line)
    time.sleep(max(0.0, done + 5.0 - time.time()))
    moved = [x for t in texts().values() for x in t if " assigned [" in x and begun <= at(x) <= done + 5.0]
    assert not moved, moved


def at(line: str) -> float:
    """When a log line was written (epoch seconds), from its leading local time."""
    import datetime

    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def settled(logs: Path, timeout: float = 90.0) -> None:
    """Every instance of every sink has its partitions, and no assignment came for 3 s."""

    def counts() -> dict[str, int]:
        return {log.name: log.read_text().count(" assigned [") for log in logs.glob("sink-*.log")}

    deadline = time.monotonic() + timeout
    before = counts()
    while time.monotonic() < deadline:
        time.sleep(3.0)
        now = counts()
        if len(now) == 2 * (len(KINDS) - 1) and all(now.values()) and now == before:
            return
        before = now
    raise AssertionError(f"the sinks' groups never settled: {before}")


def kill_the_others(up_pid: int, slowed: dict[str, int]) -> dict[str, int]:
    """kill -9 the instance of each sink that is not the slowed one; their pids by sink."""
    killed = {}
    for child in psutil.Process(up_pid).children(recursive=True):
        argv = child.cmdline()
        for kind, words in KINDS.items():
            at = [i for i in range(len(argv)) if tuple(argv[i : i + len(words)]) == words]
            if at and child.pid != slowed[kind]:
                child.send_signal(signal.SIGKILL)
                killed[kind] = child.pid
    return killed


def every_step_once_in_the_archive(settings, ids, timeout: float = 120.0) -> None:
    from metricbus.schemas import RUN_FINISHED
    from metricbus.sinks import read_events

    def complete(r: str) -> bool:
        try:
            return any(e.kind == RUN_FINISHED for e in read_events(settings.archive_dir, r))
        except (FileNotFoundError, ValueError):
            return False

    def logs() -> str:
        return log_tails(settings.data_dir / "logs", "sink-parquet*.log")

    wait(lambda: all(map(complete, ids)), timeout, "every run in the archive", logs)
    for r in ids:
        seqs = [e.seq for e in read_events(settings.archive_dir, r)]
        assert seqs == list(range(STEPS + 2)), r  # RunStarted, every step, RunFinished: each once


def every_step_once_in_tensorboard(logdir: Path, ids, timeout: float = 120.0) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def steps() -> dict[str, list[int]]:
        out = {}
        for r in ids:
            for run_dir in logdir.glob(f"scale/*{r}"):
                acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
                acc.Reload()
                if "Train/AvgReward" in acc.Tags()["scalars"]:
                    out[r] = [s.step for s in acc.Scalars("Train/AvgReward")]
        return out

    def logs() -> str:
        return log_tails(logdir.parent / "logs", "sink-tensorboard*.log")

    wait(lambda: all(len(v) >= STEPS for v in steps().values()) and len(steps()) == RUNS, timeout, "TB", logs)
    seen = steps()
    for r in ids:
        assert sorted(seen[r]) == list(range(STEPS)), r  # every step once, in one directory


def every_step_once_in_wandb(logdir: Path, ids, timeout: float = 180.0) -> None:
    from tests.wandb_reader import read_run, run_files

    def steps() -> dict[str, list[int]]:
        out = {}
        for r in ids:
            try:
                history = read_run(logdir, r, every_opening=True)["history"] if run_files(logdir, r) else []
            except (OSError, ValueError, EOFError):  # a file being written: read again
                continue
            out[r] = [row["metricbus/step"] for row in history if "Train/AvgReward" in flat(row)]
        return out

    def missing() -> str:
        seen = steps()
        lacks = {r: sorted(set(range(STEPS)) - set(seen.get(r, []))) for r in ids}
        return f"steps missing by run: {lacks}\n" + log_tails(logdir.parent / "logs", "sink-wandb*.log")

    wait(
        lambda: len(s := steps()) == RUNS and all(len(v) >= STEPS for v in s.values()),
        timeout,
        "W&B",
        missing,
    )
    seen = steps()
    for r in ids:
        assert sorted(seen[r]) == list(range(STEPS)), r  # every step once, over its openings


def flat(row: dict, head: str = "") -> set[str]:
    """The keys of a W&B history row, nested ones joined by '/'."""
    out = set()
    for k, v in row.items():
        out |= flat(v, f"{head}{k}/") if isinstance(v, dict) else {f"{head}{k}"}
    return out


def alerts_delivered(
    settings, data_dir: Path, timeout: float
) -> tuple[collections.Counter, collections.Counter]:
    """Wait until both consoles printed every alert of the topic; (printed, expected) lines."""
    expected: collections.Counter = collections.Counter()
    printed: collections.Counter = collections.Counter()

    def done() -> bool:
        nonlocal expected, printed
        expected = collections.Counter(topic_alerts(settings))
        printed = collections.Counter(console_lines(data_dir))
        return (
            bool(expected)
            and not expected - printed
            and committed(settings, settings.groups.alerts("console"))
        )

    wait(done, timeout, "every alert on a console")
    return printed, expected


def topic_alerts(settings) -> list[str]:
    """Each distinct alert of the alerts topic, as the console prints it."""
    from metricbus.schemas import decode_alert, default_codec, format_alert, read_topic

    codec, alerts = default_codec(), {}
    for record in read_topic(settings, settings.topics.alerts):
        alert = decode_alert(codec, record.value)
        alerts[(alert["run_id"], alert["seq"])] = format_alert(alert)
    return list(alerts.values())


def console_lines(data_dir: Path) -> list[str]:
    lines = []
    for log in (data_dir / "logs").glob("alerts-console*.log"):
        lines += [
            line
            for line in log.read_text().splitlines()
            if line.startswith(("[FIRING]", "[RESOLVED]", "[ENDED]"))
        ]
    return lines


def committed(settings, group: str) -> bool:
    """Whether ``group`` has committed every record of its topics."""
    from metricbus.ops._lag import LagProbe

    probe = LagProbe(settings)
    try:
        (sample,) = probe.sample([group]).values()
    finally:
        probe.close()
    return sample.lag == 0


def wait(condition, timeout: float, what: str, detail=lambda: "") -> None:
    """Until ``condition()``; else fail saying ``what`` and ``detail()`` (what the stack logged)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout:.0f}s\n{detail()}")


def log_tails(logs: Path, pattern: str, lines: int = 40) -> str:
    """The last lines of each log matching ``pattern``: what a failure shows of the stack."""
    return "".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        for log in sorted(logs.glob(pattern))
    )


class Statuses:
    """`metricbus status --json --watch 1` on a thread, as an operator would watch it: a snapshot a line."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.seen: list[dict] = []
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        argv = [
            sys.executable, "-m", "metricbus", "--bootstrap", self.settings.bootstrap_servers,
            "--data-dir", str(self.settings.data_dir), "status", "--json", "--sample",
            "--stop-after", str(STOP_AFTER_S), "--watch", "1",
        ]  # fmt: skip
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread.start()

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()  # --watch stops on SIGTERM
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._thread.join(30)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.strip():
                self.seen.append(json.loads(line))
