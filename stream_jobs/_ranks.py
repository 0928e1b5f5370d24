"""Cross-rank merge: one run's ranks 0..W-1 log the same step; merge them per step.

Per (step, metric), each rank's value is folded into a Welford state and the ranks' states
are combined with Chan's parallel formulas. The result depends only on the events, never on
how they were batched into records or in what order the ranks' records arrived:

- a step is complete once every rank has reported it or a later step (a rank that went past
  a step without logging it will not log it later: a producer's events arrive in order);
- a rank that stays silent counts as missing only after ``timeout_s`` of *event time*: once
  another rank's events are that far past the silent rank's last event (its heartbeats count
  as events). A burst of one rank's steps, a rank that started a second later or a spool
  synced after a short outage therefore waits for the others instead of emitting steps with
  one rank, live, after a restart and in a replay alike;
- steps are emitted in order, each with ``ranks/reported`` (how many ranks are in it),
  ``ranks/missing`` and ``ranks/lag_steps``; a value for a step already emitted (a rank later
  than the timeout) is counted in ``ranks/late_events`` and left out: the step is not
  re-emitted (see the README).
"""

from __future__ import annotations

import bisect
from typing import Any

from ._stats import Welford

Triple = tuple[str, int, float]


class _Step:
    __slots__ = ("stats", "reported_at")

    def __init__(self) -> None:
        self.stats: dict[str, Welford] = {}
        self.reported_at: dict[int, int] = {}  # rank -> event time it logged this step


class RankMerger:
    """Merges one run's ranks; ``feed`` returns ``(name, step, value)`` triples to emit."""

    #: event times kept per rank for ``ranks/lag_steps`` (the most recent ones)
    HISTORY = 4096

    def __init__(self, world_size: int, timeout_s: float = 30.0) -> None:
        self.world_size = world_size
        self.timeout_ms = int(timeout_s * 1000)
        self._pending: dict[int, _Step] = {}
        self._order: list[int] = []  # the pending steps, sorted
        self._emitted_below: int | None = None  # every step <= this has been emitted
        self._latest: dict[int, int] = {}  # rank -> latest step it reported
        self._last_ts: dict[int, int] = {}  # rank -> event time of its latest event
        self._leader_ts = -(2**63)  # the latest of those
        self._first_ts: int | None = None
        self._times: dict[int, list[int]] = {}  # rank -> event times of its step reports, in order
        #: lags not known yet: (step, the first rank to report it, when it did, when the last did,
        #: the lag of ranks that timed out), until the first rank's events reach the last's time
        self._lags: list[tuple[int, int, int, int, int]] = []
        self.late_events = 0

    def seen(self, rank: int, ts_ms: int) -> list[Triple]:
        """Any event of ``rank`` (a heartbeat too): it is alive at ``ts_ms``."""
        if 0 <= rank < self.world_size:
            self._last_ts[rank] = max(ts_ms, self._last_ts.get(rank, ts_ms))
            self._leader_ts = max(ts_ms, self._leader_ts)
        if self._first_ts is None or ts_ms < self._first_ts:
            self._first_ts = ts_ms
        return self._ready()

    def feed(self, rank: int, step: int, scalars: dict[str, float], ts_ms: int) -> list[Triple]:
        """Fold one rank's scalars for ``step``; return what became complete."""
        if not 0 <= rank < self.world_size:
            self.late_events += 1  # a rank the run did not declare: never part of the merge
            return [("ranks/late_events", step, float(self.late_events))]
        self._latest[rank] = max(step, self._latest.get(rank, step))
        times = self._times.setdefault(rank, [])
        times.append(ts_ms)
        if len(times) > 2 * self.HISTORY:
            del times[: self.HISTORY]
        if self._emitted_below is not None and step <= self._emitted_below:
            self.late_events += 1
            return [("ranks/late_events", step, float(self.late_events)), *self.seen(rank, ts_ms)]
        pending = self._pending.get(step)
        if pending is None:
            pending = self._pending[step] = _Step()
            if not self._order or step > self._order[-1]:
                self._order.append(step)
            else:
                bisect.insort(self._order, step)
        pending.reported_at.setdefault(rank, ts_ms)
        for name, value in scalars.items():
            pending.stats.setdefault(name, Welford()).add(value)
        return self.seen(rank, ts_ms)

    def last_event_ms(self) -> int:
        """Event time of the latest event of any rank."""
        return self._leader_ts if self._last_ts else self._first_ts or 0

    def silence(self) -> tuple[set[int], bool]:
        """The silent ranks: those seen, and whether those never seen are silent too.

        A rank seen is silent when its last event is more than the timeout behind the run's
        latest; the ranks never seen, once the timeout passed since the run's first event. Never
        a loop over the declared world size: a RunStarted is untrusted, and one declaring 2**31
        ranks must cost what one declaring two does.
        """
        leader_ts, timeout_ms = self._leader_ts if self._last_ts else 0, self.timeout_ms
        start = self._first_ts if self._first_ts is not None else leader_ts
        silent = {r for r, ts in self._last_ts.items() if leader_ts - ts > timeout_ms}
        return silent, leader_ts - start > timeout_ms

    def running(self, finished: set[int]) -> bool:
        """Whether any rank of the world is neither in ``finished`` nor silent."""
        silent, unseen_silent = self.silence()
        seen = self._last_ts.keys()
        done = {r for r in finished | silent if 0 <= r < self.world_size}
        if unseen_silent:
            return len(done & seen) + self.world_size - len(seen) < self.world_size
        return len(done) < self.world_size

    def _ready(self) -> list[Triple]:
        """Emit, in order, every pending step that is complete or whose missing ranks timed out."""
        out: list[Triple] = self._known_lags() if self._lags else []
        if not self._pending:
            return out
        silent, unseen_silent = self.silence()
        latest = self._latest
        # a rank that logged no step yet (never seen, or only its heartbeats) holds back every
        # step from -1 on; every rank that logged one is in _last_ts too
        stepless = (len(self._last_ts) < self.world_size and not unseen_silent) or any(
            r not in latest and r not in silent for r in self._last_ts
        )
        done = 0
        for step in self._order:
            reported = self._pending[step].reported_at
            if (stepless and step >= -1) or any(
                r not in reported and at <= step and r not in silent for r, at in latest.items()
            ):
                break  # steps are emitted in order
            out.extend(self._emit(step, silent, unseen_silent))
            done += 1
        del self._order[:done]
        return out

    def _emit(self, step: int, silent: set[int], unseen_silent: bool = False) -> list[Triple]:
        pending = self._pending.pop(step)
        self._emitted_below = step
        reported = pending.reported_at
        out = [
            ("ranks/reported", step, float(len(reported))),
            ("ranks/missing", step, float(self.world_size - len(reported))),
        ]
        timed_out = self._timed_out_lag(step, reported, silent, unseen_silent)
        if len(reported) > 1:
            first_rank = min(reported, key=reported.__getitem__)
            self._lags.append((step, first_rank, reported[first_rank], max(reported.values()), timed_out))
            out += self._known_lags()
        else:
            out.append(("ranks/lag_steps", step, float(timed_out)))
        for name, w in pending.stats.items():
            out += [
                (f"ranks/{name}/mean", step, w.mean),
                (f"ranks/{name}/std", step, w.std),
                (f"ranks/{name}/min", step, w.min),
                (f"ranks/{name}/max", step, w.max),
            ]
        return out

    def _known_lags(self, end: bool = False) -> list[Triple]:
        """``ranks/lag_steps`` of the steps whose lag is known now (``end``: all of them).

        How many steps the first rank to reach a step had logged past it when the last did, in
        event time (a burst in the stream is no lag). Known once that first rank's events reach
        the last one's time (a producer's events arrive in order: every step it logged by then
        has been seen), or it fell silent; counted when the last rank reported, it depended on
        how far the first rank's records had arrived by then.
        """
        out: list[Triple] = []
        waiting = []
        silent = self.silence()[0] if not end else set()
        for lag in self._lags:
            step, rank, first, last, timed_out = lag
            if not end and self._last_ts.get(rank, first) < last and rank not in silent:
                waiting.append(lag)
                continue
            times = self._times.get(rank, [])
            ahead = bisect.bisect_right(times, last) - bisect.bisect_right(times, first)
            out.append(("ranks/lag_steps", step, float(max(ahead, timed_out))))
        self._lags = waiting
        return out

    def _timed_out_lag(
        self, step: int, reported: dict[int, int], silent: set[int], unseen_silent: bool
    ) -> int:
        """The lag of ranks that timed out without reporting ``step``.

        The steps since their latest one (a rank never seen: since -1).
        """
        lag = 0
        for rank in silent:
            if rank not in reported:
                lag = max(lag, step - self._latest.get(rank, -1))
        if unseen_silent and len(self._last_ts) < self.world_size:
            lag = max(lag, step + 1)
        return lag

    def flush(self) -> list[Triple]:
        """Emit every pending step and lag (at the end of the run)."""
        out: list[Triple] = []
        for step in self._order:
            out.extend(self._emit(step, set()))
        self._order.clear()
        return out + self._known_lags(end=True)

    @staticmethod
    def world_size_of(body: dict[str, Any]) -> int:
        """The world size a RunStarted body declares."""
        return int(body.get("world_size", 1) or 1)
