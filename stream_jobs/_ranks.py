"""Cross-rank merge: one run's ranks 0..W-1 log the same step; merge them per step.

Per (step, metric), each rank's value is folded into a Welford state and the ranks' states
are combined with Chan's parallel formulas (a rank that logs a batch of samples merges as a
block). A step is emitted once all ``world_size`` ranks reported it, or, if a rank is late,
once the leading rank is ``timeout_steps`` past it, with the ranks that did report
(``ranks/reported``); a rank's value for a step already emitted is counted as late. Steps,
not seconds, decide the timeout, so a replay or a back-test gives the same result as live.
"""

from __future__ import annotations

from typing import Any

from ._stats import Welford


class RankMerger:
    """Merges one run's ranks; ``feed`` returns ``(name, step, value)`` triples to emit."""

    def __init__(self, world_size: int, timeout_steps: int = 10) -> None:
        self.world_size = world_size
        self.timeout_steps = timeout_steps
        self._pending: dict[int, tuple[set[int], dict[str, Welford]]] = {}
        self._emitted_below = -1  # every step <= this has been emitted
        self._latest: dict[int, int] = {}  # rank -> latest step
        self.late_events = 0

    def feed(self, rank: int, step: int, scalars: dict[str, float]) -> list[tuple[str, int, float]]:
        """Fold one rank's scalars for ``step``; return what became complete."""
        self._latest[rank] = max(step, self._latest.get(rank, step))
        if step <= self._emitted_below:
            self.late_events += 1
            return [("ranks/late_events", step, float(self.late_events))]
        ranks, stats = self._pending.setdefault(step, (set(), {}))
        ranks.add(rank)
        for name, value in scalars.items():
            stats.setdefault(name, Welford()).add(value)
        out: list[tuple[str, int, float]] = []
        leader = max(self._latest.values())
        for pending in sorted(self._pending):
            reported, _ = self._pending[pending]
            if len(reported) < self.world_size and leader - pending < self.timeout_steps:
                break  # steps are emitted in order
            out.extend(self._emit(pending))
        if len(self._latest) == self.world_size:
            out.append(("ranks/lag_steps", step, float(leader - min(self._latest.values()))))
        return out

    def _emit(self, step: int) -> list[tuple[str, int, float]]:
        reported, stats = self._pending.pop(step)
        self._emitted_below = step
        out = [("ranks/reported", step, float(len(reported)))]
        for name, w in stats.items():
            out += [
                (f"ranks/{name}/mean", step, w.mean),
                (f"ranks/{name}/std", step, w.std),
                (f"ranks/{name}/min", step, w.min),
                (f"ranks/{name}/max", step, w.max),
            ]
        return out

    def flush(self) -> list[tuple[str, int, float]]:
        """Emit every pending step (at the end of the run)."""
        out: list[tuple[str, int, float]] = []
        for step in sorted(self._pending):
            out.extend(self._emit(step))
        return out

    @staticmethod
    def world_size_of(body: dict[str, Any]) -> int:
        """The world size a RunStarted body declares."""
        return int(body.get("world_size", 1) or 1)
