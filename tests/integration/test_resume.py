"""A resumed run (``run_id=`` of an earlier, finished run) is one run in every sink."""

from __future__ import annotations

import time

import pytest

from metricbus.producers import Run
from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, run_config
from metricbus.sinks import read_events

from .conftest import aggregates
from .test_tensorboard_replay import scalars, start_sink

pytestmark = pytest.mark.integration


def test_a_resumed_run_continues_in_the_archive_tensorboard_and_the_worker(settings, sink, worker, tmp_path):
    sink(flush_interval=0.3)
    tb, tb_log = start_sink(settings, "tensorboard", tmp_path / "tb")
    try:
        first = Run("resume", name="ppo", config={"lr": 0.1}, settings=settings, system_metrics=False)
        run_id = first.run_id
        for step in range(10):
            first.log({"Train/Loss": 1.0 + step}, step=step, epoch=0)
        first.finish()
        # the job restarts from its checkpoint: same run id, steps go on from where it stopped
        second = Run("resume", config={"lr": 0.05}, run_id=run_id, settings=settings, system_metrics=False)
        for step in range(10, 20):
            second.log({"Train/Loss": 1.0 + step}, step=step, epoch=1)
        second.finish()

        deadline = time.monotonic() + 60
        events = []
        while time.monotonic() < deadline:
            events = (
                read_events(settings.archive_dir, run_id)
                if list(settings.archive_dir.glob("*/run=*"))
                else []
            )
            if sum(e.kind == RUN_FINISHED for e in events) == 2:
                break
            time.sleep(0.5)
        steps = sorted(e.body["step"] for e in events if e.kind == METRICS)
        assert steps == list(range(20))  # every step once, both attempts in one run
        assert [e.kind for e in events].count(RUN_STARTED) == 2
        assert len({e.producer_id for e in events}) == 2  # two attempts, told apart
        assert run_config(events) == {"lr": 0.05}  # the new attempt's config wins, in time order

        runs = [d for d in (tmp_path / "tb").glob(f"*/*{run_id}") if d.is_dir()]
        got: dict = {}
        while time.monotonic() < deadline:
            runs = [d for d in (tmp_path / "tb").glob(f"*/*{run_id}") if d.is_dir()]
            got = scalars(runs[0]) if len(runs) == 1 else {}
            if len(got.get("Train/Loss", [])) == 20:
                break
            time.sleep(0.5)
        assert [r.name for r in runs] == [f"ppo-{run_id}"]  # one directory, the first attempt's name
        assert [s for s, _, _ in got["Train/Loss"]] == list(range(20))

        derived: dict = {}
        while time.monotonic() < deadline and len(derived.get("Epoch/AvgLoss", [])) < 2:
            derived = aggregates(settings, 1, timeout=5)
        assert {p["epoch"]: p["value"] for p in derived["Epoch/AvgLoss"]} == {
            0: pytest.approx(5.5),
            1: pytest.approx(15.5),
        }  # the worker reopened the finished run for its second attempt
    finally:
        tb.terminate()
        tb.wait(20)
        tb_log.close()
