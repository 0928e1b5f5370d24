"""Logging media from a training loop: metricbus beside SummaryWriter and wandb, in the same run.

Items: ``BENCH_IMAGES`` distinct 64x64 RGB uint8 images (random pixels: PNG cannot shrink them,
the worst case for every library alike) and ``BENCH_VIDEOS`` distinct 5 s 84x84 RGB videos at
30 fps (150 frames of a square moving over a gradient, an RL render's kind of picture).

- metricbus: ``run.log_image`` / ``run.log_video`` on an offline run (the media thread encodes
  PNG / animated GIF and writes the content-addressed store; nothing is sent).
- SummaryWriter (torch): ``add_image`` / ``add_video`` (its video needs moviepy's 1.x
  ``moviepy.editor``; with moviepy 2 it writes nothing and says so, so its video row is absent).
- wandb (offline): ``run.log({"x": wandb.Image(...)})`` / ``wandb.Video(..., format="gif")``.

Per library: the caller's time per call (median and p99: what the training loop waits), the
process's CPU per item from the first call to the run closed (the encoding, wherever it runs:
metricbus moves it off the loop, it does not remove it), and the disk used per item. Medians
of ``BENCH_REPEATS`` runs; ratios are the peer's figure over ours.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import tree_cpu_s  # noqa: E402

IMAGES = int(os.environ.get("BENCH_IMAGES", 200))
VIDEOS = int(os.environ.get("BENCH_VIDEOS", 6))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))


def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8) for _ in range(IMAGES)]


def videos() -> list[np.ndarray]:
    out = []
    y, x = np.mgrid[0:84, 0:84]
    background = np.stack([x * 3, y * 3, np.full_like(x, 90)], axis=-1).astype(np.uint8)
    for v in range(VIDEOS):
        frames = np.repeat(background[None], 150, axis=0)
        for t in range(150):
            at = (t * 2 + v * 7) % 70
            frames[t, at : at + 14, at : at + 14] = (255, 255, 255)
        out.append(frames)
    return out


def disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def ours(root: Path, kind: str, items: list[np.ndarray]) -> tuple[list[float], float, int]:
    from metricbus.producers import Run
    from metricbus.schemas import Settings

    cpu = tree_cpu_s()
    run = Run("bench", settings=Settings(data_dir=root, offline=True), system_metrics=False)
    calls = []
    for step, item in enumerate(items):
        t0 = time.perf_counter()
        if kind == "image":
            run.log_image("img", item, step=step)
        else:
            run.log_video("video", item, fps=30, step=step)
        calls.append(time.perf_counter() - t0)
    run.finish(timeout=600)
    assert run.stats()["media_logged"] == len(items), run.stats()
    return calls, tree_cpu_s() - cpu, disk(root / "media") + disk(root / "spool")


def summary_writer(root: Path, kind: str, items: list[np.ndarray]) -> tuple[list[float], float, int] | None:
    from torch.utils.tensorboard import SummaryWriter

    cpu = tree_cpu_s()
    writer = SummaryWriter(str(root))
    calls = []
    for step, item in enumerate(items):
        t0 = time.perf_counter()
        if kind == "image":
            writer.add_image("img", item, step, dataformats="HWC")
        else:
            writer.add_video("video", np.moveaxis(item, -1, 1)[None], step, fps=30)
        calls.append(time.perf_counter() - t0)
    writer.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(root), size_guidance={"images": 0})
    acc.Reload()
    tag = "img" if kind == "image" else "video"
    found = len(acc.Images(tag)) if tag in acc.Tags()["images"] else 0
    if found != len(items):
        return None  # it wrote nothing (torch's video without moviepy 1.x)
    return calls, tree_cpu_s() - cpu, disk(root)


def wandb_run(root: Path, kind: str, items: list[np.ndarray]) -> tuple[list[float], float, int]:
    import wandb

    cpu = tree_cpu_s()
    run = wandb.init(mode="offline", dir=str(root), project="bench", settings=wandb.Settings(silent=True))
    calls = []
    for step, item in enumerate(items):
        t0 = time.perf_counter()
        if kind == "image":
            run.log({"img": wandb.Image(item)}, step=step)
        else:
            run.log({"video": wandb.Video(np.moveaxis(item, -1, 1), fps=30, format="gif")}, step=step)
        calls.append(time.perf_counter() - t0)
    run.finish()
    return calls, tree_cpu_s() - cpu, disk(root)


def main() -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("METRICBUS_QUIET", "1")
    logging.getLogger("metricbus").setLevel(logging.ERROR)  # the offline runs say so each
    cases = {"image": images(), "video": videos()}
    peers = {"SummaryWriter": summary_writer, "wandb": wandb_run}
    print(f"media, {IMAGES} 64x64 RGB images, {VIDEOS} 5 s 84x84 30 fps videos; medians of {REPEATS} runs")
    for kind, items in cases.items():
        results: dict[str, list[tuple[float, float, float, float]]] = {}
        for _ in range(REPEATS):
            for name, fn in (("metricbus", ours), *peers.items()):
                with tempfile.TemporaryDirectory() as tmp:
                    got = fn(Path(tmp), kind, items)
                if got is None:
                    continue
                calls, cpu, used = got
                calls.sort()
                p99 = calls[min(len(calls) - 1, int(len(calls) * 0.99))]
                results.setdefault(name, []).append(
                    (statistics.median(calls), p99, cpu / len(items), used / len(items))
                )
        base = [statistics.median(r[i] for r in results["metricbus"]) for i in range(4)]
        print(f"\n{kind}: caller median / p99 per call, process CPU per item, disk per item")
        for name, runs in results.items():
            med = [statistics.median(r[i] for r in runs) for i in range(4)]
            line = (
                f"  {name:13s} caller {med[0] * 1e6:9.0f} us / {med[1] * 1e6:9.0f} us   "
                f"CPU {med[2] * 1e3:8.2f} ms   disk {med[3] / 1024:8.1f} KB"
            )
            if name != "metricbus":
                line += (
                    f"   (caller {med[0] / base[0]:.0f}x ours, CPU {med[2] / base[2]:.2f}x, "
                    f"disk {med[3] / base[3]:.2f}x)"
                )
            print(line)
        missing = [p for p in peers if p not in results]
        if missing:
            print(f"  ({', '.join(missing)}: wrote no {kind} here, see the module docstring)")


if __name__ == "__main__":
    main()
