"""Scale-out on the real embedded broker: several stream workers and several Parquet sink
instances in one consumer group, partitions moving between them mid-run (issue 11)."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import time
import uuid

import pytest

from metricbus.producers import Run
from metricbus.schemas import METRICS, RUN_FINISHED, Event, aggregate_points, default_codec, ensure_topics
from metricbus.sinks import read_events
from metricbus.stream_jobs import StreamProcessor, derive_all, load_rules
from metricbus.stream_jobs._rules import DEFAULT_RULES

from .conftest import SinkProcess, cli, log_in_rounds, read_topic, spread_run_ids

pytestmark = pytest.mark.integration

PARTITIONS = 4
RUNS = 8
STEPS = 90


@pytest.fixture
def wide(settings):
    """Settings of a topic set with four partitions, every one carrying two of the runs."""
    s = dataclasses.replace(settings, topic_prefix=f"w{uuid.uuid4().hex[:8]}.", partitions=PARTITIONS)
    ensure_topics(s)
    return s


def run_ids() -> list[str]:
    """Run ids that the producer's key partitioner spreads two to each partition."""
    return spread_run_ids(PARTITIONS, RUNS // PARTITIONS)


def values(run: int, step: int) -> dict[str, float]:
    loss = math.nan if (run % 3 == 0 and step == 40) else 1.0 / (step + 1) + run
    return {"Train/Loss": loss, "Train/AvgReward": ((step * (run + 1)) % 10) / 10}


def start_worker(settings, tmp_path, name):
    env = {**os.environ, **dataclasses.replace(settings, checkpoint_interval_s=1.0).to_env()}
    out = open(tmp_path / f"{name}.log", "wb")
    return subprocess.Popen(cli(settings, "worker"), stdout=out, stderr=subprocess.STDOUT, env=env), out


def stop(proc, out, kill=False):
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        proc.wait(20)
    out.close()


def test_workers_killed_and_added_mid_run_derive_what_one_uninterrupted_worker_does(wide, tmp_path):
    ids = run_ids()
    workers = {name: start_worker(wide, tmp_path, name) for name in ("w1", "w2")}
    runs = [Run("scale", run_id=r, settings=wide, system_metrics=False) for r in ids]
    try:
        assigned(tmp_path, ["w1", "w2"])  # both joined: the partitions are split between them
        for step in range(STEPS):
            for i, run in enumerate(runs):
                run.log(values(i, step), step=step, epoch=step // 10)
            if step % 10 == 9:
                for run in runs:
                    assert run._publisher.flush(10)
                time.sleep(1.0)  # several records per partition, spread over time; checkpoints every 1 s
            if step == 30:
                stop(*workers.pop("w1"), kill=True)  # its partitions move to w2 after the session timeout
            if step == 60:
                assigned(tmp_path, ["w2"], "from the checkpoint")  # w2 took w1's partitions over
                workers["w3"] = start_worker(wide, tmp_path, "w3")  # a rebalance spreads them again
                assigned(tmp_path, ["w3"])
        for run in runs:
            assert run.finish(timeout=20)

        expected: dict = {}
        alerts_expected = set()
        for i, r in enumerate(ids):
            events = [
                (METRICS, {"step": s, "epoch": s // 10, "rank": 0, "scalars": values(i, s), "samples": {}}, s)
                for s in range(STEPS)
            ]
            events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, STEPS))
            for p in derive_all(events):
                if p.name.startswith("Epoch/"):
                    expected.setdefault(r, {}).setdefault(p.name, {})[p.epoch] = p.value
            processor = StreamProcessor(rules=load_rules(DEFAULT_RULES))
            batch = [Event(r, "p", n, 1000 + n, kind, body, b"") for n, (kind, body, _) in enumerate(events)]
            for a in processor.process(batch).alerts:
                if a["seq"] >= 0:
                    alerts_expected.add((r, a["rule"], a["metric"], a["state"], a["step"]))
        want = sum(len(epochs) for per_run in expected.values() for epochs in per_run.values())

        got: dict = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = _epochs_by_run(wide)
            if sum(len(e) for per_run in got.values() for e in per_run.values()) >= want:
                break
            time.sleep(1)
        assert got.keys() == expected.keys()
        for r in ids:
            for name, epochs in expected[r].items():
                assert got[r][name] == pytest.approx(epochs, nan_ok=True), (r, name)

        codec = default_codec()
        seen: dict = {}
        for record in read_topic(wide, wide.topics.alerts, 1, timeout=5):
            _, a = codec.decode(record.value)
            if a["seq"] >= 0:  # an alert re-sent after a crash keeps its identity (run, seq)
                seen.setdefault(
                    (a["run_id"], a["seq"]), (a["run_id"], a["rule"], a["metric"], a["state"], a["step"])
                )
        assert set(seen.values()) == alerts_expected
        assert len(seen) == len(alerts_expected)  # no alert fired twice under two identities
        assert any(rule == "nan_loss" for _, rule, *_ in alerts_expected)

        logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("w1", "w2", "w3")}
        # partitions moved with their state: w1's to w2 (from w1's checkpoints, killed -9), and
        # some of w2's to w3 (checkpointed by w2 when the rebalance revoked them)
        assert "state rebuilt from the checkpoint at offset" in logs["w2"], logs["w2"][-3000:]
        assert "state rebuilt from the checkpoint at offset" in logs["w3"], logs["w3"][-3000:]
    finally:
        for proc, out in workers.values():
            stop(proc, out)


def assigned(tmp_path, names, how="", timeout=60.0) -> None:
    """Wait until each named worker has taken partitions over (its log says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(f"state rebuilt {how}" in (tmp_path / f"{n}.log").read_text() for n in names):
            return
        time.sleep(0.5)
    raise AssertionError(f"workers {names} never got partitions")


def _epochs_by_run(settings) -> dict:
    """run -> Epoch/* name -> epoch -> value, from the aggregates topic (re-sent points agree)."""
    codec = default_codec()
    out: dict = {}
    for record in read_topic(settings, settings.topics.aggregates, 1, timeout=5):
        _, batch = codec.decode(record.value)
        for p in aggregate_points(batch):
            if p["name"].startswith("Epoch/"):
                by_epoch = out.setdefault(batch["run_id"], {}).setdefault(p["name"], {})
                assert by_epoch.setdefault(p["epoch"], p["value"]) == pytest.approx(p["value"], nan_ok=True)
    return out


def test_two_parquet_sinks_one_killed_mid_run_archive_every_event_once(wide, tmp_path):
    ids = run_ids()
    first, second = SinkProcess(wide, flush_interval=0.3), SinkProcess(wide, flush_interval=0.3)
    first.log, second.log = tmp_path / "s1.log", tmp_path / "s2.log"
    first.start()
    second.start()
    runs = [Run("scale", run_id=r, settings=wide, system_metrics=False) for r in ids]

    def assignments(sink) -> int:  # "assigned" lines that name a partition of the events topic
        return sum(
            "assigned" in line and f"'{wide.topics.events}'" in line
            for line in sink.log.read_text().splitlines()
        )

    try:
        deadline = time.monotonic() + 60
        while not (assignments(first) and assignments(second)) and time.monotonic() < deadline:
            time.sleep(0.5)  # both joined: the partitions are split between them
        taken = assignments(second)
        log_and_kill(runs, first.kill9)  # mid-run, mid-flush perhaps: its partitions move to the other
        deadline = time.monotonic() + 120
        complete = set()
        while time.monotonic() < deadline and len(complete) < RUNS:
            for r in ids:
                try:
                    events = read_events(wide.archive_dir, r)
                except (FileNotFoundError, ValueError):
                    continue
                if any(e.kind == RUN_FINISHED for e in events):
                    complete.add(r)
            time.sleep(1)
        assert complete == set(ids)
        assert assignments(second) > taken  # the killed sink's partitions moved to the other
        for r, run in zip(ids, runs, strict=True):
            events = read_events(wide.archive_dir, r)
            seqs = [e.seq for e in events]
            assert seqs == list(range(STEPS + 2)), r  # RunStarted, every step, RunFinished: each once
            assert {e.producer_id for e in events} == {run.producer_id}
    finally:
        for sink in (first, second):
            if sink.proc is not None and sink.proc.poll() is None:
                sink.stop()


class Instances:
    """Two or more instances of one sink in one consumer group, each a process with its log."""

    def __init__(self, settings, tmp_path, names, args, env=None) -> None:
        self.settings, self.tmp_path = settings, tmp_path
        env = {**os.environ, **settings.to_env(), **(env or {})}
        env.pop("WANDB_API_KEY", None)  # W&B offline: nothing leaves the machine
        self.logs = {n: open(tmp_path / f"{n}.log", "wb") for n in names}  # noqa: SIM115
        self.procs = {
            n: subprocess.Popen(cli(settings, *args), stdout=out, stderr=subprocess.STDOUT, env=env)
            for n, out in self.logs.items()
        }

    def assignments(self, name) -> int:
        """How often ``name`` was assigned partitions of the events topic, from its log."""
        text = (self.tmp_path / f"{name}.log").read_text()
        events = f"'{self.settings.topics.events}'"
        return sum("assigned" in line and events in line for line in text.splitlines())

    def wait_all_assigned(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(map(self.assignments, self.procs)) and time.monotonic() < deadline:
            time.sleep(0.5)

    def kill(self, name) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        for out in self.logs.values():
            out.close()


def log_and_kill(runs, kill, every_step=None) -> None:
    """STEPS steps of every run, flushed every 10 with a second's pause; ``kill()`` at step 40."""

    def after(step: int) -> None:
        if every_step is not None:
            every_step(step)
        if step == 40:
            kill()

    log_in_rounds(runs, STEPS, values, after)


def test_two_tensorboard_sinks_one_killed_mid_run_show_every_step_once(wide, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ids = run_ids()
    logdir = tmp_path / "tb"
    args = ["sink", "tensorboard", "--logdir", str(logdir), "--flush-interval", "0.3"]
    sinks = Instances(wide, tmp_path, ("t1", "t2"), args)
    runs = [Run("scale", run_id=r, settings=wide, system_metrics=False) for r in ids]
    try:
        sinks.wait_all_assigned()
        taken = sinks.assignments("t2")
        log_and_kill(runs, lambda: sinks.kill("t1"))
        steps: dict = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            steps = {}
            for r in ids:
                (run_dir,) = logdir.glob(f"scale/*{r}") or [None]
                if run_dir is None:
                    continue
                acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
                acc.Reload()
                if "Train/AvgReward" in acc.Tags()["scalars"]:
                    steps[r] = [s.step for s in acc.Scalars("Train/AvgReward")]
            if len(steps) == RUNS and all(len(v) >= STEPS for v in steps.values()):
                break
            time.sleep(1)
        assert sinks.assignments("t2") > taken  # the killed sink's runs moved to the other
        for r in ids:
            assert sorted(steps[r]) == list(range(STEPS)), r  # every step once, in one directory
    finally:
        sinks.stop()


def test_two_wandb_sinks_one_killed_mid_run_log_every_step_once(wide, tmp_path):
    """W&B opens a run in seconds: the sink's write must not cost its group session, and a run
    that moves between the two instances is written by one at a time (W&B's own records read)."""
    from metricbus.sinks._process_tmp import DIR_NAME, sweep
    from tests.wandb_reader import read_run, run_files

    ids = run_ids()
    logdir = tmp_path / "wandb"
    system_tmp = tmp_path / "system-tmp"  # the sinks' system temp dir: wandb's would go there
    system_tmp.mkdir()
    args = ["sink", "wandb", "--logdir", str(logdir), "--flush-interval", "0.3"]
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "TMPDIR": str(system_tmp)}
    sinks = Instances(wide, tmp_path, ("b1", "b2"), args, env)
    runs = [Run("scale", run_id=r, settings=wide, system_metrics=False) for r in ids]
    try:
        sinks.wait_all_assigned()
        time.sleep(3.0)  # the rebalance that gave b2 its share ends for b1 too
        before = {n: sinks.assignments(n) for n in sinks.procs}

        def no_rebalance_while_both_write(step: int) -> None:
            if step == 20:  # both wrote runs they opened meanwhile (seconds each)
                assert {n: sinks.assignments(n) for n in sinks.procs} == before

        log_and_kill(runs, lambda: sinks.kill("b1"), no_rebalance_while_both_write)
        steps: dict = {}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            steps = {}
            for r in ids:
                try:
                    history = (
                        read_run(logdir, r, every_opening=True)["history"] if run_files(logdir, r) else []
                    )
                except (OSError, ValueError, EOFError):  # a file being written: read again
                    continue
                steps[r] = [row["metricbus/step"] for row in history if _has(row, "Train/AvgReward")]
            if len(steps) == RUNS and all(len(v) >= STEPS for v in steps.values()):
                break
            time.sleep(1)
        assert sinks.assignments("b2") > before["b2"]  # the killed sink's runs moved to the other
        for r in ids:
            assert sorted(steps.get(r, [])) == list(range(STEPS)), r  # every step once, over its openings
        # wandb's temporary files are in each sink's own directory under the logdir, none in the
        # system's, not even the killed one's; a sweep finds the killed one's alone gone
        assert list(system_tmp.iterdir()) == []
        held = sorted(p for p in (logdir / DIR_NAME).iterdir() if p.is_dir())
        assert len(held) == 2 and all(any(p.iterdir()) for p in held), held
        gone = sweep(logdir / DIR_NAME)
        assert len(gone) == 1 and gone[0] in held and not gone[0].exists()
        assert sorted(p for p in (logdir / DIR_NAME).iterdir() if p.is_dir()) == [
            p for p in held if p != gone[0]
        ]
    finally:
        sinks.stop()


def _has(row: dict, name: str) -> bool:
    """Whether a W&B history row holds ``name`` (a key with slashes, or nested by them)."""
    if name in row:
        return True
    head, _, rest = name.partition("/")
    return bool(rest) and isinstance(row.get(head), dict) and _has(row[head], rest)
