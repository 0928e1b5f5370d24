"""Each sink beside its own library writing the same rows, in the same run (medians of several).

- W&B: the W&B sink (offline; events handed in records of 500 steps, a flush every 2,000 as the
  runtime does, then closed: its run file written and closed) against a bare ``wandb.init`` +
  ``run.log(row)`` loop + ``run.finish()`` of the same rows, in one process.
- TensorBoard: the TensorBoard sink (the same records, flushes and close) against TensorBoard's
  own ``EventFileWriter`` writing one event per step with the step's scalars, then closing.
- Parquet: the archive sink on the same records.

Wall seconds from the first row to the last one on disk, and CPU seconds of the process and its
children (wandb-core), each as rows/s and as a ratio to the peer. Target (issue 40): each sink
within 1.5x of its library's own time.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import tree_cpu_s  # noqa: E402

STEPS = int(os.environ.get("BENCH_STEPS", 5_000))
METRICS = int(os.environ.get("BENCH_METRICS", 10))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))
RECORD, FLUSH_EVERY = 500, 2_000  # steps a record holds, steps between two flushes


def rows() -> list[dict[str, float]]:
    return [{f"Train/m{j}": 1.0 / (s + j + 1) for j in range(METRICS)} for s in range(STEPS)]


def events(run_id: str) -> list:
    from metricbus.schemas import METRICS as KIND
    from metricbus.schemas import RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started

    fp = default_codec().newest("EventBatch").fingerprint
    out = [Event(run_id, "p", 0, 1_700_000_000_000, RUN_STARTED, run_started("bench", run_id), fp)]
    for s, scalars in enumerate(rows()):
        body = {"step": s, "epoch": None, "rank": 0, "samples": {}, "scalars": scalars}
        out.append(Event(run_id, "p", s + 1, 1_700_000_000_000 + s, KIND, body, fp))
    out.append(
        Event(
            run_id, "p", STEPS + 1, 1_700_000_100_000, RUN_FINISHED, {"status": "finished", "summary": {}}, fp
        )
    )
    return out


def timed(work) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall s, CPU s of this process and its children) of ``work()``."""
    cpu, t0 = tree_cpu_s(), time.perf_counter()
    work()
    return time.perf_counter() - t0, tree_cpu_s() - cpu


def through_sink(sink, evs: list) -> None:  # type: ignore[no-untyped-def]
    sink.open()
    for start in range(0, len(evs), RECORD):
        sink.write(evs[start : start + RECORD])
        if (start + RECORD) % FLUSH_EVERY == 0:
            sink.flush()
    sink.flush()
    sink.close()


def wandb_sink(out: Path) -> tuple[float, float]:
    from metricbus.sinks.wandb import WandbSink

    evs = events("wb-sink")
    return timed(lambda: through_sink(WandbSink(out, mode="offline", finish_grace_s=0.0), evs))


def wandb_bare(out: Path) -> tuple[float, float]:
    import wandb

    data = rows()

    def work() -> None:
        run = wandb.init(
            project="bench",
            dir=str(out),
            mode="offline",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        for row in data:
            run.log(row)
        run.finish()

    return timed(work)


def tensorboard_sink(out: Path) -> tuple[float, float]:
    from metricbus.sinks.tensorboard import TensorBoardSink

    evs = events("tb-sink")
    return timed(lambda: through_sink(TensorBoardSink(out), evs))


def tensorboard_bare(out: Path) -> tuple[float, float]:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    data = rows()

    def work() -> None:
        writer = EventFileWriter(str(out))
        for step, row in enumerate(data):
            values = [Summary.Value(tag=k, simple_value=v) for k, v in row.items()]
            writer.add_event(Event(step=step, wall_time=time.time(), summary=Summary(value=values)))
        writer.close()

    return timed(work)


def parquet_sink(out: Path) -> tuple[float, float]:
    from metricbus.sinks import ParquetArchive

    evs = events("pq-sink")
    return timed(lambda: through_sink(ParquetArchive(out), evs))


def main() -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    contenders = {
        "wandb sink": wandb_sink,
        "wandb.log loop": wandb_bare,
        "tensorboard sink": tensorboard_sink,
        "EventFileWriter": tensorboard_bare,
        "parquet sink": parquet_sink,
    }
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    with tempfile.TemporaryDirectory() as tmp:  # wandb-core starts once, before either is timed
        wandb_bare(Path(tmp) / "warm-up")
    for r in range(REPEATS):
        with tempfile.TemporaryDirectory() as tmp:
            for name, contender in contenders.items():
                got[name].append(contender(Path(tmp) / f"{name.replace(' ', '-')}-{r}"))
    print(f"{STEPS:,} rows of {METRICS} scalars, medians of {REPEATS} runs (wall s, CPU s with children)")
    print(f"  {'':<20}{'rows/s':>10}{'wall s':>9}{'CPU s':>8}   ours / the library's (wall, CPU)")
    pairs = {"wandb sink": "wandb.log loop", "tensorboard sink": "EventFileWriter"}
    for name, runs in got.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        note = ""
        if name in pairs:
            peer = got[pairs[name]]
            walls = sorted(w / p for (w, _), (p, _) in zip(runs, peer, strict=True))
            cpus = sorted(c / p for (_, c), (_, p) in zip(runs, peer, strict=True))
            note = (
                f"{statistics.median(walls):.2f}x [{walls[0]:.2f}-{walls[-1]:.2f}], "
                f"{statistics.median(cpus):.2f}x [{cpus[0]:.2f}-{cpus[-1]:.2f}]  (target <= 1.5x)"
            )
        print(f"  {name:<20}{STEPS / wall:>10,.0f}{wall:>9.2f}{cpu:>8.2f}   {note}")


if __name__ == "__main__":
    main()
