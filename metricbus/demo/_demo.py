"""``metricbus demo``: the embedded stack, a real PPO run, and the archive read back."""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from pathlib import Path
from typing import Any

from metricbus.schemas import DERIVED_PRODUCER, MediaStore, Settings
from metricbus.stack import Stack, port_free


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_archived(archive: Path, run_id: str, events: int, timeout: float, derived: bool = False) -> int:
    """Wait until the archive holds ``events`` distinct logged (or ``derived``) events of the run.

    Returns how many it holds.
    """
    from metricbus.sinks import read_table

    deadline = time.monotonic() + timeout
    held = 0
    while time.monotonic() < deadline:
        table = read_table(archive, run_id, columns=["producer_id", "seq"])
        pairs = zip(table["producer_id"].to_pylist(), table["seq"].to_pylist(), strict=True)
        held = len({(p, s) for p, s in pairs if (p == DERIVED_PRODUCER) == derived})
        if held >= events:
            break
        time.sleep(0.5)
    return held


def derived_total(settings: Settings, run_id: str, timeout: float = 30.0) -> int | None:
    """How many derived events the worker published for a finished run (None if it has not said yet)."""
    from metricbus.schemas import decode_aggregates, default_codec, read_topic

    codec = default_codec()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # the worker closes the run once it has seen RunFinished
        total = None
        for r in read_topic(settings, settings.topics.aggregates):
            if r.key == run_id.encode():
                record = decode_aggregates(codec, r.value)
                if record.events:
                    total = max(total or 0, record.events[-1].seq + 1)
                if record.closes_run:
                    return total or 0
        time.sleep(1.0)
    return None


def _print_stream_results(settings: Settings, run_id: str) -> None:
    """What the stream worker derived, read back from its topic, and what the console consumer printed."""
    from metricbus.schemas import aggregate_points, default_codec, read_topic

    codec = default_codec()
    points: list[dict[str, Any]] = [
        p
        for r in read_topic(settings, settings.topics.aggregates)
        for p in aggregate_points(codec.decode(r.value)[1])
        if r.key == run_id.encode()
    ]
    epochs: dict[int, dict[str, float]] = {}
    last: dict[str, float] = {}
    for p in points:
        if p["name"].startswith("Epoch/") and p["epoch"] is not None:
            epochs.setdefault(p["epoch"], {})[p["name"][6:]] = p["value"]
        last[p["name"]] = p["value"]
    print(f"stream worker: {len(points)} derived points\n")
    cols = ["AvgReward", "RewardVariance", "RewardCV", "RewardTrend", "AvgLoss", "LossTrend", "NumSamples"]
    print("epoch" + "".join(f"{c:>15}" for c in cols))
    for epoch in sorted(epochs):
        print(
            f"{epoch:<5}"
            + "".join(f"{epochs[epoch][c]:>15.4g}" if c in epochs[epoch] else f"{'-':>15}" for c in cols)
        )
    print("\nfinal rolling statistics (last 10 values, EMA):")
    for name in ("Train/AvgReward", "Train/Loss", "Train/Entropy", "Train/ApproxKL"):
        mean, ema = last.get(f"{name}_recent_mean"), last.get(f"{name}_ema")
        if mean is not None and ema is not None:
            print(f"  {name:<22} recent_mean {mean:>10.4g}   ema {ema:>10.4g}")
    for name in sorted(n for n in last if n.startswith("final/")):
        print(f"  {name:<40} {last[name]:>10.4g}")
    ended = {
        n.split("/")[1]: v
        for n, v in last.items()
        if n.startswith("by_termination/") and n.endswith("/share")
    }
    if ended:
        print("\nepisodes by how they ended (last 100; the stream's by_termination/<reason>/share):")
        for reason, share in sorted(ended.items()):
            reward = last.get(f"by_termination/{reason}/episode/reward_recent_mean")
            shown = f"   mean reward {reward:.4g}" if reward is not None else ""
            print(f"  {reason:<12} {share:>6.0%}{shown}")
        success = last.get("episode/success_recent_mean")
        if success is not None:
            print(f"  success rate (episode/success_recent_mean, last 10): {success:.0%}")
    console = settings.data_dir / "logs" / "alerts-console.log"
    lines = []
    if console.exists():
        lines = [line for line in console.read_text().splitlines() if line.startswith("[") and run_id in line]
    print(f"\nalerts, as the console consumer printed them ({console}):" + ("" if lines else " none fired"))
    for line in lines:
        print(f"  {line}")
    print()


def _tensorboard(settings: Settings, run_id: str, timeout: float = 30.0) -> None:
    """Where the live TensorBoard sink wrote the run, and a replay of it from the archive."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        print("tensorboard is not installed: pip install 'metricbus[tensorboard]'")
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from metricbus.replay import replay_to_sink
    from metricbus.sinks import make_sink
    from metricbus.sinks.tensorboard import TensorBoardSink

    def scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
        dirs = TensorBoardSink(root).run_dirs(run_id)
        if not dirs:
            return {}
        acc = EventAccumulator(str(dirs[0]), size_guidance={"scalars": 0})
        acc.Reload()
        return {t: [(s.step, s.value) for s in acc.Scalars(t)] for t in acc.Tags()["scalars"]}

    live_root = settings.data_dir / "tensorboard"
    replay_root = settings.data_dir / "tensorboard-replay" / run_id
    replay_to_sink(settings, [run_id], make_sink("tensorboard", replay_root, media=MediaStore.of(settings)))
    replayed = scalars(replay_root)
    deadline = time.monotonic() + timeout
    live = scalars(live_root)

    def same() -> bool:  # logged and derived series, the same points
        return live == replayed

    while not same() and time.monotonic() < deadline:  # the live sink flushes every 2 s
        time.sleep(0.5)
        live = scalars(live_root)
    derived = sorted(
        t for t in live if t.startswith(("Epoch/", "final/")) or t.endswith(("_recent_mean", "_ema"))
    )
    print(f"\ntensorboard (live sink): {live_root}   ->  tensorboard --logdir {live_root}")
    print(
        f"  {len(live)} tags, {len(derived)} of them derived by the stream worker "
        f"(e.g. {', '.join(derived[:3])})"
    )
    total = sum(map(len, replayed.values()))
    print(
        f"replayed from the archive (logged and derived rows) into {replay_root}: {total} scalars in "
        f"{len(replayed)} tags, identical to the live sink's: {same()}"
    )


def _print_status(settings: Settings, stack: Stack) -> None:
    """What ops sees: `metricbus status` of the stack, and where the dashboard was."""
    from metricbus.ops._status import collect, format_status

    print("\n$ metricbus status")
    print(format_status(collect(settings, window_s=1.0)))
    if stack.dashboard_url:
        print(f"\ndashboard (live while the stack runs: `metricbus up`): {stack.dashboard_url}")


def run_demo(settings: Settings, updates: int = 30) -> int:
    """Run the demo; return the exit code."""
    import metricbus
    from metricbus.demo._ppo import PPOConfig, train
    from metricbus.sinks import summary

    if settings.is_local and not port_free("127.0.0.1", settings.local_port):
        port = _free_port()
        print(
            f"port {settings.local_port} is busy (another metricbus up?); the demo's own broker uses {port}"
        )
        settings = dataclasses.replace(settings, local_port=port)
    cfg = PPOConfig(updates=updates)
    with Stack(settings) as stack:
        print(stack.describe(), flush=True)
        run = metricbus.init(
            project="demo-cartpole",
            name="ppo",
            config=cfg,
            tags=["demo", "ppo"],
            settings=settings,
            system_interval_s=1.0,
        )
        print(f"\ntraining PPO on {cfg.env_id} for {cfg.updates} updates, run {run.run_id} ...", flush=True)
        t0 = time.perf_counter()
        final = train(run, cfg)
        delivered = run.finish(summary=final, timeout=30)
        elapsed = time.perf_counter() - t0
        events = run.stats()["events"]
        print(f"trained in {elapsed:.1f}s; {events} events logged, all acknowledged by Kafka: {delivered}")
        held = wait_archived(settings.archive_dir, run.run_id, events, timeout=30)
        total = derived_total(settings, run.run_id)
        derived_held = wait_archived(settings.archive_dir, run.run_id, total or 0, timeout=30, derived=True)
        print(
            f"archive holds {held}/{events} logged events of the run "
            f"and {derived_held}/{total} derived ones\n"
        )
        time.sleep(1.5)  # the console consumer and the TensorBoard sink poll every 200 ms and flush every 2 s
        _print_stream_results(settings, run.run_id)
        rows = summary(settings.archive_dir, run.run_id, derived=False)
        derived = len(summary(settings.archive_dir, run.run_id)) - len(rows)
        print(f"logged metrics in the archive (and {derived} derived series beside them):")
        print(f"{'metric':<36}{'n':>5}{'first':>12}{'last':>12}{'min':>12}{'max':>12}")
        for r in rows:
            print(
                f"{r['name']:<36}{r['count']:>5}{r['first']:>12.4g}{r['last']:>12.4g}"
                f"{r['min']:>12.4g}{r['max']:>12.4g}"
            )
        _tensorboard(settings, run.run_id)
        _print_status(settings, stack)
    print(f"\narchive: {settings.archive_dir}")
    for line in next_steps(settings, run.run_id):
        print(line)
    return 0 if held >= events else 1


def next_steps(settings: Settings, run_id: str) -> list[str]:
    """What to type next, in a new shell: each line works pasted as it is (tested)."""
    activate = Path(sys.prefix) / "bin" / "activate"
    data = "" if Path(settings.data_dir) == Settings().data_dir else f" --data-dir {settings.data_dir}"
    lines = ["", "next, in a new shell (the demo's stack has stopped; the archive stays):"]
    if sys.prefix != sys.base_prefix and activate.exists():  # in a virtual environment: put it on PATH
        lines.append(f"  source {activate}")
    commands = [
        (f"metricbus runs{data}", "every archived run"),
        (f"metricbus health {run_id}{data}", "its health, 0-100, with the evidence"),
        (f"metricbus report {run_id}{data}", "one HTML file with every chart"),
        (f"metricbus export {run_id} --format csv{data} | head", "its scalars as rows"),
        ("metricbus up", "the stack again, for your own script"),
    ]
    width = max(len(c) for c, _ in commands)
    return lines + [f"  {c.ljust(width)}  # {why}" for c, why in commands]
