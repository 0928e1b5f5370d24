"""Shared helpers for the benchmarks: medians of repeated runs, CPU of a process tree, a table."""

from __future__ import annotations

import os
import socket

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
