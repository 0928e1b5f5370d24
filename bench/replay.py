"""Replay speed: archive -> TensorBoard event files with metricbus, beside writing the same
scalars straight through torch's SummaryWriter, in the same run; and reading the archive.

Targets (issue 4): replay >= 2x SummaryWriter's scalars/s; reading the archive >= 1M scalars/s.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table  # noqa: E402

STEPS = int(os.environ.get("BENCH_STEPS", 20_000))
METRICS = int(os.environ.get("BENCH_METRICS", 10))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))


def build_archive(root: Path) -> str:
    from schemas import METRICS as KIND
    from schemas import RUN_STARTED, Event, default_codec, run_started
    from sinks import ParquetArchive

    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(root)
    sink.open()
    events = [
        Event(
            "bench-run",
            "p",
            0,
            0,
            RUN_STARTED,
            run_started("bench", "bench-run"),
            fp,
        )
    ]
    events += [
        Event(
            "bench-run",
            "p",
            s + 1,
            1_700_000_000_000 + s,
            KIND,
            {
                "step": s,
                "epoch": None,
                "rank": 0,
                "samples": {},
                "scalars": {f"Train/m{j}": 1.0 / (s + j + 1) for j in range(METRICS)},
            },
            fp,
        )
        for s in range(STEPS)
    ]
    sink.write(events)
    sink.flush()
    return "bench-run"


def replay(archive: Path, run_id: str, out: Path) -> float:
    from metricbus._replay import replay_to_sink
    from schemas import Settings
    from sinks import TensorBoardSink

    settings = Settings(data_dir=archive.parent)
    t0 = time.perf_counter()
    replay_to_sink(settings, [run_id], TensorBoardSink(out))
    return STEPS * METRICS / (time.perf_counter() - t0)


def summary_writer(out: Path) -> float:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(out))
    t0 = time.perf_counter()
    for s in range(STEPS):
        for j in range(METRICS):
            writer.add_scalar(f"Train/m{j}", 1.0 / (s + j + 1), s)
    writer.close()
    return STEPS * METRICS / (time.perf_counter() - t0)


def read_archive(archive: Path, run_id: str) -> float:
    from sinks import read_table

    t0 = time.perf_counter()
    t = read_table(archive, run_id, columns=["step", "name", "value"])
    n = t.num_rows
    return n / (time.perf_counter() - t0)


def main() -> None:
    ours, peer, reads = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "archive"
        run_id = build_archive(archive)
        for r in range(REPEATS):
            ours.append(replay(archive, run_id, Path(tmp) / f"replay{r}"))
            peer.append(summary_writer(Path(tmp) / f"sw{r}"))
            reads.append(read_archive(archive, run_id))
    o, p, rd = statistics.median(ours), statistics.median(peer), statistics.median(reads)
    print(f"{STEPS * METRICS:,} scalars ({METRICS} metrics x {STEPS:,} steps), median of {REPEATS} runs")
    table(
        "scalars per second into TensorBoard event files (higher is better)",
        [
            ("metricbus replay (archive -> TB)", o, "target >= 2x SummaryWriter"),
            ("torch SummaryWriter.add_scalar", p, ""),
        ],
        o,
        "scalars/s",
    )
    print(f"\nreading the archive (pyarrow, step/name/value): {rd:,.0f} scalars/s (target >= 1,000,000)")


if __name__ == "__main__":
    main()
