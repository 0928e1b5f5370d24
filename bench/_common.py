"""Shared helpers for the benchmarks: medians of repeated runs, CPU of a process tree, a table."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def bench_broker() -> Iterator[tuple[str, Any]]:
    """``(tmp, broker)``: a temporary directory and the embedded broker logging into it, with
    warnings only and kafka-python's connection noise off; both gone on exit."""
    from metricbus.stack._broker import EmbeddedBroker

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(free_port(), log_path=Path(tmp) / "broker.log") as broker,
    ):
        yield tmp, broker


#: Child processes that are infrastructure, not the contender (the embedded broker).
EXCLUDED_PIDS: set[int] = set()


def tree_cpu_s() -> float:
    """User+system CPU seconds of this process and its children (wandb runs a service process),
    leaving out EXCLUDED_PIDS."""
    me = psutil.Process(os.getpid())
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        if p.pid in EXCLUDED_PIDS:
            continue
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def table(title: str, rows: list[tuple[str, float, str]], ours: float, unit: str) -> None:
    print(f"\n{title}")
    print(f"  {'':<34}{unit:>14}{'ratio to ours':>16}")
    for name, value, note in rows:
        ratio = value / ours if ours else float("nan")
        print(f"  {name:<34}{value:>14.3f}{ratio:>15.1f}x  {note}")


def fill(settings, n: int, run_id: str | None = None, columnar: bool = True) -> None:  # type: ignore[no-untyped-def]
    """One run of ``n`` events (RunStarted, n - 2 steps of 3 scalars, RunFinished) into the topic.

    ``max_block_s``: a tight loop outruns the encoder, and shed events would make n a lie.
    ``columnar=False`` writes a record per event (the v4 layout) instead of EventBatch v5's columns.
    """
    from metricbus.producers import Run

    run = Run("bench", run_id=run_id, settings=settings, system_metrics=False, linger_s=0.05, max_block_s=5.0)
    run._publisher.columnar = columnar
    for step in range(n - 2):
        run.log(
            {
                "Train/Loss": 1.0 / (step + 1),
                "Train/AvgReward": (step % 100) / 100,
                "System/Memory_Percent": 40.0,
            },
            step=step,
            epoch=step // 1000,
        )
    assert run.finish(timeout=300), "the bench's run did not deliver everything"
