"""Bytes per scalar on disk for a long run: the metricbus Parquet archive vs TensorBoard's event
file (SummaryWriter) vs the W&B offline run file, for the same synthetic training curves,
in the same run.

The run: METRICS metrics logged every step for STEPS steps (noisy decaying losses, noisy
rising rewards, a learning-rate schedule, slowly varying system metrics). The archive is
written by the sink's own code (ParquetArchive) with one flush per FLUSH_STEPS steps (what a
live sink flushing every 2 s produces at 10 steps/s): while the run is live (flush files merged
every 64), after it finished (one file), and with merging off for reference.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table  # noqa: E402

STEPS = int(os.environ.get("BENCH_STEPS", 50_000))
FLUSH_STEPS = int(os.environ.get("BENCH_FLUSH_STEPS", 20))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))


def curves(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS, dtype=float)
    out = {}
    for k in range(6):
        out[f"Train/Loss_{k}"] = np.exp(-t / (5000 * (k + 1))) + rng.normal(0, 0.05, STEPS)
    for k in range(6):
        out[f"rewards/r{k}_mean"] = 1 / (1 + np.exp(-(t - 20000) / 4000)) + rng.normal(0, 0.1, STEPS)
    out["Train/LearningRate"] = 3e-4 * (1 - t / STEPS)
    out["Train/GradNorm"] = np.abs(rng.normal(1.0, 0.3, STEPS))
    out["System/CPU_Percent"] = np.round(np.clip(rng.normal(55, 10, STEPS), 0, 100), 1)
    out["System/Memory_Percent"] = np.round(40 + t / STEPS * 10, 1)
    out["System/Process_Memory_GB"] = 2.0 + np.cumsum(rng.normal(0, 1e-4, STEPS))
    out["Performance/Generation_TokensPerSec"] = rng.normal(120, 15, STEPS)
    out["Epoch/NumSamples"] = np.full(STEPS, 256.0)
    out["global_step"] = t * 64
    return out


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def metricbus_bytes(
    data: dict[str, np.ndarray], out: Path, flush_steps: int, compact_after: int = 64, finish: bool = False
) -> int:
    from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started
    from metricbus.sinks import ParquetArchive

    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(out, compact_after=compact_after)
    sink.open()
    names = list(data)
    columns = [data[n].tolist() for n in names]
    ts = 1_700_000_000_000
    sink.write(
        [
            Event(
                "run-1",
                "p" * 32,
                0,
                ts,
                RUN_STARTED,
                run_started("bench", "n"),
                fp,
            )
        ]
    )
    for start in range(0, STEPS, flush_steps):
        events = [
            Event(
                "run-1",
                "p" * 32,
                step + 1,
                ts + step * 100,
                METRICS,
                {
                    "step": step,
                    "epoch": step // 1000,
                    "rank": 0,
                    "scalars": {n: c[step] for n, c in zip(names, columns, strict=True)},
                    "samples": {},
                },
                fp,
            )
            for step in range(start, min(start + flush_steps, STEPS))
        ]
        sink.write(events)
        sink.flush()
    if finish:
        sink.write(
            [Event("run-1", "p" * 32, STEPS + 1, ts, RUN_FINISHED, {"status": "finished", "summary": {}}, fp)]
        )
        sink.flush()
    return dir_bytes(out)


def tensorboard_bytes(data: dict[str, np.ndarray], out: Path) -> int:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(out))
    names = list(data)
    columns = [data[n].tolist() for n in names]
    for step in range(STEPS):
        for n, c in zip(names, columns, strict=True):
            writer.add_scalar(n, c[step], step)
    writer.close()
    return dir_bytes(out)


def wandb_bytes(data: dict[str, np.ndarray], out: Path) -> int:
    import wandb

    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    run = wandb.init(
        project="bench", dir=str(out), settings=wandb.Settings(console="off", x_disable_stats=True)
    )
    names = list(data)
    columns = [data[n].tolist() for n in names]
    for step in range(STEPS):
        run.log({n: c[step] for n, c in zip(names, columns, strict=True)}, step=step)
    run.finish()
    return sum(p.stat().st_size for p in Path(out).rglob("*.wandb"))


def main() -> None:
    data = curves(0)
    scalars = STEPS * len(data)
    results: dict[str, list[float]] = {k: [] for k in ("raw", "live", "finished", "tb", "wandb")}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(REPEATS):
            data = curves(r)
            results["raw"].append(
                metricbus_bytes(data, Path(tmp) / f"r{r}", FLUSH_STEPS, compact_after=10**9) / scalars
            )
            results["live"].append(metricbus_bytes(data, Path(tmp) / f"l{r}", FLUSH_STEPS) / scalars)
            results["finished"].append(
                metricbus_bytes(data, Path(tmp) / f"f{r}", FLUSH_STEPS, finish=True) / scalars
            )
            results["tb"].append(tensorboard_bytes(data, Path(tmp) / f"tb{r}") / scalars)
            results["wandb"].append(wandb_bytes(data, Path(tmp) / f"wb{r}") / scalars)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"{scalars:,} scalars ({len(data)} metrics x {STEPS:,} steps), median of {REPEATS} runs, "
        f"{time.perf_counter() - t0:.0f}s"
    )
    table(
        "bytes per scalar on disk (lower is better; target <= 8 for the archive)",
        [
            ("metricbus archive, run finished", med["finished"], "merged into one file"),
            ("metricbus archive, run still live", med["live"], "merged every 64 flushes"),
            (
                "metricbus, flush files unmerged",
                med["raw"],
                f"one file per {FLUSH_STEPS} steps (2 s at 10 steps/s)",
            ),
            ("TensorBoard event file", med["tb"], "float32 values"),
            ("W&B offline .wandb file", med["wandb"], ""),
        ],
        med["finished"],
        "bytes/scalar",
    )


if __name__ == "__main__":
    main()
