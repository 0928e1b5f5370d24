"""Replay speed: archive -> TensorBoard event files with metricbus, beside writing the same
scalars straight through torch's SummaryWriter, in the same run; and reading the archive.
Then each one's peak resident memory, in a process of its own (``BENCH_STEPS=200000`` for a
long run: a replay holds one row group of the run and one chunk of it as Python objects).

Targets (issue 4): replay >= 2x SummaryWriter's scalars/s; reading the archive >= 1M scalars/s.
"""

from __future__ import annotations

import os
import statistics
import subprocess
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
    from metricbus.schemas import METRICS as KIND
    from metricbus.schemas import RUN_STARTED, Event, default_codec, run_started
    from metricbus.sinks import ParquetArchive

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
    for start in range(0, len(events), 20_000):  # a file per 20,000 events, as a live sink's flushes
        sink.write(events[start : start + 20_000])
        sink.flush()
    return "bench-run"


def replay(archive: Path, run_id: str, out: Path) -> float:
    from metricbus.replay import replay_to_sink
    from metricbus.schemas import Settings
    from metricbus.sinks import TensorBoardSink

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
    from metricbus.sinks import read_table

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
        ours_mb = peak_mb("replay", str(archive), run_id, str(Path(tmp) / "replay-peak"))
        peer_mb = peak_mb("writer", str(Path(tmp) / "sw-peak"))
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
    table(
        "peak resident memory, each in a process of its own (MB; lower is better)",
        [
            ("metricbus replay (archive -> TB)", ours_mb, "imports metricbus, pyarrow, tensorboard"),
            ("torch SummaryWriter.add_scalar", peer_mb, "imports torch; nothing read"),
        ],
        ours_mb,
        "MB",
    )


def peak_mb(*args: str) -> float:
    """Run one contender in a fresh interpreter; its peak resident memory (MB)."""
    out = subprocess.run(
        [sys.executable, __file__, "--peak", *args], capture_output=True, text=True, check=True
    ).stdout
    return float(out.split()[-1])


def peak_child(what: str, *args: str) -> None:
    if what == "replay":
        replay(Path(args[0]), args[1], Path(args[2]))
    else:
        summary_writer(Path(args[0]))
    # VmHWM, not ru_maxrss: that one keeps the forking parent's peak across exec
    status = Path("/proc/self/status").read_text().splitlines()
    print(int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024)  # kB


if __name__ == "__main__":
    if sys.argv[1:2] == ["--peak"]:
        peak_child(*sys.argv[2:])
    else:
        main()
