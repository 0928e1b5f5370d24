"""Looking at a long run: `metricbus report` (one self-contained HTML page from the archive: health,
charts, epochs, alerts) beside what TensorBoard does to show the same run (its
EventAccumulator loading the run's event files, with TensorBoard's default sampling of 1,000
points a tag), each in a process of its own, in the same run: seconds and peak resident memory.

The run: ``BENCH_STEPS`` steps (default 20,000; 200,000 for a long run) of ten scalars, with the
stream's ``_recent_mean`` of each every tenth step, as ``metricbus up`` archives it; the
TensorBoard files are the same events replayed into TensorBoard (``metricbus replay``).
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
RUN = "bench-run"


def build(data_dir: Path) -> None:
    """The run in ``data_dir``'s archive, and replayed into ``data_dir/tb``."""
    from metricbus.replay import replay_to_sink
    from metricbus.schemas import DERIVED_PRODUCER, RUN_FINISHED, RUN_STARTED, Event, Settings, default_codec
    from metricbus.schemas import METRICS as KIND
    from metricbus.schemas import run_started as started
    from metricbus.sinks import ParquetArchive, TensorBoardSink

    fp = default_codec().newest("EventBatch").fingerprint
    t0 = 1_700_000_000_000
    sink = ParquetArchive(data_dir / "archive")
    sink.open()
    sink.write([Event(RUN, "p", 0, t0, RUN_STARTED, started("bench", RUN), fp)])
    for lo in range(0, STEPS, 20_000):
        events = []
        for s in range(lo, min(STEPS, lo + 20_000)):
            scalars = {f"Train/m{j}": 1.0 / (s + j + 1) for j in range(METRICS)}
            body = {"step": s, "epoch": s // 1000, "rank": 0, "samples": {}, "scalars": scalars}
            events.append(Event(RUN, "p", s + 1, t0 + s, KIND, body, fp))
            if s % 10 == 0:
                means = {f"{n}_recent_mean": v for n, v in scalars.items()}
                derived = {"step": s, "epoch": s // 1000, "rank": 0, "samples": {}, "scalars": means}
                events.append(Event(RUN, DERIVED_PRODUCER, s // 10, t0 + s, KIND, derived, fp))
        sink.write(events)
        sink.flush()
    finished = {"status": "finished", "summary": {}}
    sink.write([Event(RUN, "p", STEPS + 1, t0 + STEPS, RUN_FINISHED, finished, fp)])
    sink.flush()
    replay_to_sink(Settings(data_dir=data_dir), [RUN], TensorBoardSink(data_dir / "tb"))


def ours(data_dir: str) -> None:
    from metricbus.cli import main

    assert main(["--data-dir", data_dir, "report", RUN, "--out", str(Path(data_dir) / "report.html")]) == 0


def tensorboard(data_dir: str) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = [p for p in (Path(data_dir) / "tb").rglob("*") if p.is_dir() and any(p.glob("events.*"))]
    acc = EventAccumulator(str(run_dir))  # TensorBoard's default: 1,000 points a scalar tag, sampled
    acc.Reload()
    assert len(acc.Tags()["scalars"]) == METRICS * 2


def measure(what: str, data_dir: str) -> tuple[float, float]:
    """(seconds, peak MB) of ``what`` in a fresh interpreter."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, data_dir], capture_output=True, text=True, check=True
    ).stdout
    return time.perf_counter() - t0, float(out.split()[-1])


def child(what: str, data_dir: str) -> None:
    {"ours": ours, "tensorboard": tensorboard}[what](data_dir)
    # VmHWM, not ru_maxrss: that one keeps the forking parent's peak across exec
    status = Path("/proc/self/status").read_text().splitlines()
    print(int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024)  # kB


def main() -> None:
    results: dict[str, list[tuple[float, float]]] = {"ours": [], "tensorboard": []}
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        for _ in range(REPEATS):  # interleaved, so machine noise hits both alike
            for what in results:
                results[what].append(measure(what, tmp))
    print(f"one run of {STEPS:,} steps x {METRICS} scalars (+ the stream's means), median of {REPEATS} runs")
    secs = {w: statistics.median(s for s, _ in r) for w, r in results.items()}
    peak = {w: statistics.median(m for _, m in r) for w, r in results.items()}
    table(
        "seconds to look at the run, interpreter start included (lower is better)",
        [
            ("metricbus report (archive -> HTML)", secs["ours"], "health, charts, epochs, alert rules"),
            ("TensorBoard EventAccumulator.Reload", secs["tensorboard"], "loads the scalars, nothing drawn"),
        ],
        secs["ours"],
        "s",
    )
    table(
        "peak resident memory, each in a process of its own (MB; lower is better)",
        [
            ("metricbus report (archive -> HTML)", peak["ours"], ""),
            ("TensorBoard EventAccumulator.Reload", peak["tensorboard"], ""),
        ],
        peak["ours"],
        "MB",
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:])
    else:
        main()
