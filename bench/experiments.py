"""The dashboard's experiments view on a project of many runs: the runs table and a grouped chart.

BENCH_RUNS runs (default 200) of BENCH_STEPS steps (1,000) of BENCH_METRICS scalars (10),
configs over lr x batch x seed, archived; then, in this process as the dashboard serves them
(the first call, and the median of BENCH_REPEATS after it: the first runs table reads every
run, later ones only runs whose files changed, as the dashboard keeps them): the runs table
(``runs_table``) and one metric of every run grouped by lr with its bands and per-group
statistics (``grouped_chart``). Beside
them the peer in the same run: TensorBoard's own loader (EventMultiplexer, as its scalars
dashboard does) reading the same runs from event files written with TensorBoard's writer, and
the one tag of all of them. Target: each of ours under 1 s.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RUNS = int(os.environ.get("BENCH_RUNS", 200))
STEPS = int(os.environ.get("BENCH_STEPS", 1_000))
METRICS = int(os.environ.get("BENCH_METRICS", 10))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))
RATES = (1e-4, 3e-4, 1e-3, 3e-3)


def build(data_dir: Path) -> None:
    import numpy as np
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from metricbus.schemas import METRICS as KIND
    from metricbus.schemas import RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started
    from metricbus.sinks import ParquetArchive

    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(data_dir / "archive")
    sink.open()
    rng = np.random.default_rng(0)
    for k in range(RUNS):
        rid = f"20261101-000000-b{k:07d}"
        lr, batch, seed = RATES[k % 4], (32, 64)[(k // 4) % 2], k // 8
        config = {"lr": lr, "batch": batch, "seed": seed, "model": {"width": 64}}
        events = [
            Event(rid, "p", 0, 1_700_000_000_000, RUN_STARTED, run_started("sweep", f"r{k}", config), fp)
        ]
        writer = EventFileWriter(str(data_dir / "tb" / rid))
        noise = rng.normal(0, 0.05, (STEPS, METRICS))
        for s in range(STEPS):
            scalars = {
                f"Train/m{j}": float(lr * 1000 * (1 - 1 / (s + 1)) + noise[s, j]) for j in range(METRICS)
            }
            body = {"step": s, "epoch": s // 100, "rank": 0, "samples": {}, "scalars": scalars}
            events.append(Event(rid, "p", s + 1, 1_700_000_000_000 + s, KIND, body, fp))
            values = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()]
            writer.add_event(
                event_pb2.Event(wall_time=1.7e9 + s, step=s, summary=summary_pb2.Summary(value=values))
            )
        body = {"status": "finished", "summary": {"final": float(lr)}}
        events.append(Event(rid, "p", STEPS + 1, 1_700_000_000_000 + STEPS, RUN_FINISHED, body, fp))
        sink.write(events)
        writer.close()
    sink.flush()
    sink.close()


def timed(fn) -> tuple[float, float]:
    """(first call, median of the next REPEATS) in seconds."""
    times = []
    for _ in range(REPEATS + 1):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times[0], statistics.median(times[1:])


def tensorboard_tag(tb: Path) -> None:
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    mux = EventMultiplexer(size_guidance={"tensors": 1000})  # TensorBoard's default: 1,000 a tag
    mux.AddRunsFromDirectory(str(tb))
    mux.Reload()
    assert len(mux.Runs()) == RUNS
    for run in mux.Runs():
        mux.Tensors(run, "Train/m0")


def main() -> None:
    from metricbus.diagnostics._runs import run_rows
    from metricbus.ops._experiments import grouped_chart, runs_table

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        started = time.perf_counter()
        build(data)
        print(
            f"built {RUNS} runs x {STEPS} steps x {METRICS} scalars in {time.perf_counter() - started:.0f}s"
        )
        archive = data / "archive"
        cache: dict = {}  # the dashboard's: a run is read again only once its files changed

        def table_now() -> dict:
            return runs_table(run_rows(archive, cache=cache), "sweep")

        table = timed(table_now)
        ids = [r["run_id"] for r in table_now()["runs"]]
        assert len(ids) == RUNS
        chart = timed(lambda: grouped_chart(archive, run_rows(archive, cache=cache), ids, "Train/m0", ["lr"]))
        peer = timed(lambda: tensorboard_tag(data / "tb"))
        print(f"{'':<36}{'first':>10}{'median':>10}")
        print(f"{'runs table (ours)':<36}{table[0]:>9.3f}s{table[1]:>9.3f}s")
        print(f"{'grouped chart, 1 metric (ours)':<36}{chart[0]:>9.3f}s{chart[1]:>9.3f}s")
        print(f"{'TensorBoard loading 1 tag (peer)':<36}{peer[0]:>9.3f}s{peer[1]:>9.3f}s")
        print(f"ratio peer / ours (table + chart, medians): {peer[1] / (table[1] + chart[1]):.1f}x")


if __name__ == "__main__":
    sys.exit(main())
