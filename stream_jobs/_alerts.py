"""Alert evaluation: per (run, rule, series) state, firing once and resolving with hysteresis.

A condition must hold ``for`` consecutive evaluations to fire, and stay false for
``resolve_after_s`` (event time) to resolve, so a flapping metric is one alert, not a storm.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ._rules import OPS, Rule
from ._stats import RollingMoments

_NONE: list[dict[str, Any]] = []  # shared, never appended to: most series match no rule


@dataclasses.dataclass
class _State:
    seen: int = 0
    streak: int = 0
    firing: bool = False
    false_since: int | None = None
    window: RollingMoments | None = None
    previous: float | None = None


class AlertEngine:
    """Evaluates rules on every value it is shown; returns Alert records (dicts) on transitions."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._value_rules = [r for r in rules if r.kind != "absent"]
        self._absent_rules = [r for r in rules if r.kind == "absent"]
        self._state: dict[tuple[str, str, str], _State] = {}
        self._last_seen: dict[str, int] = {}
        self._finished: set[str] = set()
        self._matches: dict[str, list[Rule]] = {}

    def observe(
        self, run_id: str, series: str, value: float, step: int | None, ts_ms: int
    ) -> list[dict[str, Any]]:
        """Evaluate every rule that watches ``series``."""
        rules = self._matches.get(series)
        if rules is None:
            rules = self._matches[series] = [r for r in self._value_rules if r.matches(series)]
        if not rules:
            return _NONE
        out = []
        for rule in rules:
            state = self._state.setdefault((run_id, rule.name, series), _State())
            state.seen += 1
            if state.seen <= rule.warmup:
                continue
            condition = self._condition(rule, state, value)
            alert = self._transition(rule, state, condition, run_id, series, value, step, ts_ms)
            if alert is not None:
                out.append(alert)
        return out

    def seen(self, run_id: str, ts_ms: int, finished: bool = False) -> list[dict[str, Any]]:
        """Note that the run is alive; resolves its 'absent' alerts. ``finished`` ends watching it."""
        self._last_seen[run_id] = max(ts_ms, self._last_seen.get(run_id, 0))
        if finished:
            self._finished.add(run_id)
        out = []
        for rule in self._absent_rules:
            state = self._state.get((run_id, rule.name, "*"))
            if state is not None and state.firing:
                state.firing = False
                out.append(
                    _alert(rule, "resolved", run_id, "*", None, None, ts_ms, "the run is sending again")
                )
        return out

    def check_absent(self, now_ms: int) -> list[dict[str, Any]]:
        """Fire 'absent' rules for live runs silent for longer than their ``seconds``."""
        out = []
        for rule in self._absent_rules:
            for run_id, last in self._last_seen.items():
                if run_id in self._finished:
                    continue
                state = self._state.setdefault((run_id, rule.name, "*"), _State())
                silent_s = (now_ms - last) / 1000
                if silent_s > rule.seconds and not state.firing:
                    state.firing = True
                    why = f"no event for {silent_s:.0f}s (limit {rule.seconds:g}s)"
                    out.append(_alert(rule, "firing", run_id, "*", None, None, now_ms, why))
        return out

    @staticmethod
    def _condition(rule: Rule, state: _State, value: float) -> bool:
        if rule.kind == "nonfinite":
            return not math.isfinite(value)
        if not math.isfinite(value):
            return False  # NaN is the nonfinite rule's business; it never satisfies a threshold
        if rule.kind == "threshold":
            return OPS[rule.op](value, float(rule.value))
        if rule.kind == "rate":
            previous, state.previous = state.previous, value
            return previous is not None and abs(value - previous) > float(rule.max_change)
        if rule.kind == "zscore":
            window = state.window
            if window is None:
                window = state.window = RollingMoments(int(rule.window))
            fired = False
            if len(window) >= max(5, int(rule.window) // 2):
                std = window.std()
                if std > 0:
                    z = (value - window.mean()) / std
                    fired = {"both": abs(z), "above": z, "below": -z}[rule.direction] > float(rule.z)
            window.add(value)
            return fired
        return False

    @staticmethod
    def _transition(
        rule: Rule,
        state: _State,
        condition: bool,
        run_id: str,
        series: str,
        value: float,
        step: int | None,
        ts_ms: int,
    ) -> dict[str, Any] | None:
        if condition:
            state.streak += 1
            state.false_since = None
            if not state.firing and state.streak >= max(1, int(rule.for_)):
                state.firing = True
                return _alert(
                    rule, "firing", run_id, series, value, step, ts_ms, _why(rule, value, state.streak)
                )
            return None
        state.streak = 0
        if state.firing:
            if state.false_since is None:
                state.false_since = ts_ms
            if ts_ms - state.false_since >= rule.resolve_after_s * 1000:
                state.firing = False
                state.false_since = None
                return _alert(rule, "resolved", run_id, series, value, step, ts_ms, "back within limits")
        return None


def _why(rule: Rule, value: float, streak: int) -> str:
    if rule.kind == "threshold":
        times = f" for {streak} evaluations" if streak > 1 else ""
        return f"{value:.4g} {rule.op} {rule.value:g}{times}"
    if rule.kind == "rate":
        return f"changed by more than {rule.max_change:g} in one step (now {value:.4g})"
    if rule.kind == "zscore":
        return f"{value:.4g} is more than {rule.z:g} standard deviations from the last {rule.window} values"
    return f"value is {value}"


def _alert(
    rule: Rule,
    state: str,
    run_id: str,
    series: str,
    value: float | None,
    step: int | None,
    ts_ms: int,
    why: str,
) -> dict[str, Any]:
    text = f"{rule.message}: {why}" if rule.message else why
    return {
        "run_id": run_id,
        "rule": rule.name,
        "state": state,
        "severity": rule.severity,
        "metric": series,
        "value": value,
        "step": step,
        "message": text,
        "ts_ms": ts_ms,
    }
