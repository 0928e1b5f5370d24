"""Alert evaluation: per (run, rule, series) state, firing once and resolving with hysteresis.

A condition must hold ``for`` consecutive evaluations to fire, and stay false for
``resolve_after`` evaluations and ``resolve_after_s`` of event time to resolve, so a flapping
metric is one alert, not a storm. At the run's end an alert whose condition had stopped holding
for ``resolve_after`` evaluations resolves (a short run that recovered is not left "ended").
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._rules import OPS, Rule
from ._shift import ShiftParams, ShiftState
from ._stats import RollingMoments

_NONE: list[dict[str, Any]] = []  # shared, never appended to: most series match no rule
#: series names whose matching rules are cached; past it the cache starts again (a worker of
#: runs that each log names of their own would keep every name of every run it ever saw)
MATCHES_KEPT = 65_536


@dataclasses.dataclass
class _State:
    seen: int = 0
    streak: int = 0
    firing: bool = False
    false_since: int | None = None
    false_count: int = 0  #: evaluations in a row the condition was false while firing
    window: RollingMoments | None = None
    previous: float | None = None
    repeats: int = 0  #: frozen: equal finite values in a row so far
    exempt: bool = False  #: frozen: the series repeated a value in its warm-up (logged stale by design)
    #: threshold with patience: (last step, sum, count) of its values, at most PATIENCE_KEPT
    history: list[tuple[int, float, int]] | None = None
    shift: ShiftState | None = None


class AlertEngine:
    """Evaluates rules on every value it is shown; returns Alert records (dicts) on transitions."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._value_rules = [r for r in rules if r.kind != "absent"]
        self._absent_rules = [r for r in rules if r.kind == "absent"]
        #: "@reward"/"@loss" -> the rules that watch the run's series of that role
        self._role_rules: dict[str, list[Rule]] = {}
        for r in self._value_rules:
            if r.role is not None:
                self._role_rules.setdefault(r.role, []).append(r)
        self._state: dict[tuple[str, str, str], _State] = {}
        #: run -> its keys in ``_state`` (for :meth:`forget`; rebuilt from it, not checkpointed)
        self._keys_of: dict[str, list[tuple[str, str, str]]] = {}
        self._last_seen: dict[str, int] = {}
        self._finished: set[str] = set()
        self._matches: dict[str, list[Rule]] = {}
        #: series some rule's ``only_if`` looks at -> per run, (min, max) of its finite values
        self._ranges: dict[str, dict[str, tuple[float, float]]] = {
            r.only_if.metric: {} for r in rules if r.only_if is not None
        }

    def watches(self, series: str, role: str | None = None) -> bool:
        """Whether :meth:`observe` of ``series`` (playing ``role``) could do anything.

        A rule watches it or its role, or a rule's scope reads it (cheap: cached per name).
        """
        if role is not None and (role in self._role_rules or role in self._ranges):
            return True
        return series in self._ranges or bool(self._rules_for(series))

    def _rules_for(self, series: str) -> list[Rule]:
        """The rules that watch ``series`` by name (cached; names come from users and topics)."""
        rules = self._matches.get(series)
        if rules is None:
            if len(self._matches) >= MATCHES_KEPT:
                self._matches.clear()
            rules = self._matches[series] = [r for r in self._value_rules if r.matches(series)]
        return rules

    def observe(
        self, run_id: str, series: str, value: float, step: int | None, ts_ms: int, role: str | None = None
    ) -> list[dict[str, Any]]:
        """Evaluate every rule that watches ``series`` (or its ``role`` in the run) on one value."""
        return self.observe_many(run_id, series, (value,), (step,), (ts_ms,), role)

    def observe_many(
        self,
        run_id: str,
        series: str,
        values: Sequence[float],
        steps: Sequence[int | None],
        stamps: Sequence[int],
        role: str | None = None,
    ) -> list[dict[str, Any]]:
        """Evaluate every rule that watches ``series`` on its values in order (one input record's).

        ``role`` ("@reward", "@loss") is the part the series plays in this run, if any: the rules
        that watch that role watch it too, and the rules scoped to the role see its range widen.

        Same alerts as value by value, at C speed for long columns: the usual case (not firing,
        no value trips the rule) is decided with ``sum``/``min``/``max``; otherwise the
        conditions of the whole column are computed with numpy and only the stretches where
        the condition changes are walked in Python.
        """
        for scoped in (series, role):
            ranges = self._ranges.get(scoped) if scoped is not None else None
            if ranges is not None:
                _widen(ranges, run_id, values)
        rules = self._rules_for(series)
        if role is not None and role in self._role_rules:
            rules = rules + self._role_rules[role]
        if not rules:
            return _NONE
        out = []
        for rule in rules:
            scope = rule.only_if
            if scope is not None and not scope.applies(self._ranges[scope.metric].get(run_id)):
                continue
            state = self._state.get((run_id, rule.name, series))
            if state is None:
                state = self._new_state((run_id, rule.name, series))
            vals, stps, stms = values, steps, stamps
            if rule.kind == "frozen":  # its warm-up is watched, not skipped
                _watch_repeats(rule, state, vals)
            else:
                skip = min(max(rule.warmup - state.seen, 0), len(vals))
                if skip:  # still warming up: these values are not evaluated
                    vals, stps, stms = vals[skip:], stps[skip:], stms[skip:]
            state.seen += len(values)
            if not vals:
                continue
            if rule.kind == "shift":
                out += self._shift(rule, state, run_id, series, vals, stps, stms)
                continue
            # a patience rule sees every value, on either side of its threshold (its history)
            if not state.firing and not rule.patience_steps and _quiet(rule, state, vals):
                state.streak = 0
                continue
            if len(vals) >= _VECTOR_MIN and not rule.patience_steps:
                conditions = _conditions(rule, state, vals)
                out += _walk(rule, state, conditions, run_id, series, vals, stps, stms)
                continue
            for value, step, ts_ms in zip(vals, stps, stms, strict=True):
                condition = self._condition(rule, state, value, step)
                alert = self._transition(rule, state, condition, run_id, series, value, step, ts_ms)
                if alert is not None:
                    out.append(alert)
        return out

    def _shift(
        self,
        rule: Rule,
        state: _State,
        run_id: str,
        series: str,
        values: Sequence[float],
        steps: Sequence[int | None],
        stamps: Sequence[int],
    ) -> list[dict[str, Any]]:
        """A ``shift`` rule over a column: evaluated at the end of each block (see ``_shift``)."""
        if state.shift is None:
            state.shift = ShiftState()
        out = []
        for verdict in state.shift.feed(_shift_params(rule), values, steps, lambda: state.firing):
            i = verdict.index
            was_firing = state.firing
            alert = self._transition(
                rule, state, verdict.holds, run_id, series, verdict.median, steps[i], stamps[i], verdict.why
            )
            if was_firing and not state.firing:
                state.shift.release()
            if alert is not None:
                out.append(alert)
        return out

    def _new_state(self, key: tuple[str, str, str]) -> _State:
        state = self._state[key] = _State()
        self._keys_of.setdefault(key[0], []).append(key)
        return state

    def end(self, run_id: str, ts_ms: int, step: int | None) -> list[dict[str, Any]]:
        """Close every alert still firing on a run that finished: "resolved" or "ended".

        An alert whose condition had stayed false for the rule's ``resolve_after`` evaluations
        resolves (the run recovered before it ended, too quickly for ``resolve_after_s``); any
        other gets "ended": a finished run's condition can no longer stop holding, so its alerts
        would stay "firing" for ever (Alertmanager closes an alert at its end of life likewise).
        Its rules start afresh if the run is resumed.
        """
        by_name = {rule.name: rule for rule in self._value_rules}
        out = []
        for key in self._keys_of.get(run_id, ()):
            state = self._state[key]
            rule = by_name.get(key[1])
            if rule is None or not state.firing:
                continue
            recovered = state.false_count >= max(1, rule.resolve_after)
            count = state.false_count
            state.firing, state.streak, state.false_since, state.false_count = False, 0, None, 0
            if state.shift is not None:
                state.shift.release()
            if recovered:
                why = f"back within limits for the run's last {count} evaluations"
                out.append(_alert(rule, "resolved", run_id, key[2], None, step, ts_ms, why))
            else:
                why = "the run finished while it fired"
                out.append(_alert(rule, "ended", run_id, key[2], None, step, ts_ms, why))
        return out

    def forget(self, run_id: str) -> None:
        """Drop what the rules hold of a finished run that the processor forgot (FINISHED_KEPT).

        Its rules' states (~600 B each in memory, six a run with the default rules), its ranges
        and when it was last seen went on for ever: a worker grew ~3.5 kB a finished run, and
        its checkpoints with it. It stays known as finished (a few bytes), so a stray late event
        does not make it a run gone silent; a resumed run's rules start afresh, as its windows do.
        """
        for key in self._keys_of.pop(run_id, ()):
            del self._state[key]
        for ranges in self._ranges.values():
            ranges.pop(run_id, None)
        self._last_seen.pop(run_id, None)

    def state(self) -> dict[str, Any]:
        """Per (run, rule, series) state and liveness, for checkpoints (rules are not included)."""
        return {
            "state": self._state,
            "last_seen": self._last_seen,
            "finished": self._finished,
            "ranges": self._ranges,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`; rules by the same name keep their firing/streak state."""
        self._state = state["state"]
        self._keys_of = {}
        for key in self._state:
            self._keys_of.setdefault(key[0], []).append(key)
        self._last_seen = state["last_seen"]
        self._finished = state["finished"]
        for metric, ranges in state["ranges"].items():
            if metric in self._ranges:
                self._ranges[metric] = ranges

    def seen(
        self, run_id: str, ts_ms: int, finished: bool = False, started: bool = False
    ) -> list[dict[str, Any]]:
        """Note that the run is alive; resolves its 'absent' alerts.

        ``finished`` ends watching it; ``started`` (a RunStarted: a resumed run) watches it again.
        """
        self._last_seen[run_id] = max(ts_ms, self._last_seen.get(run_id, 0))
        if started:
            self._finished.discard(run_id)
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
                state = self._state.get((run_id, rule.name, "*")) or self._new_state((run_id, rule.name, "*"))
                silent_s = (now_ms - last) / 1000
                if silent_s > rule.seconds and not state.firing:
                    state.firing = True
                    why = f"no event for {silent_s:.0f}s (limit {rule.seconds:g}s)"
                    out.append(_alert(rule, "firing", run_id, "*", None, None, now_ms, why))
        return out

    @staticmethod
    def _condition(rule: Rule, state: _State, value: float, step: int | None = None) -> bool:
        if rule.kind == "nonfinite":
            return not math.isfinite(value)
        if not math.isfinite(value):
            return False  # NaN is the nonfinite rule's business; it never satisfies a threshold
        if rule.kind == "threshold":
            # every value joins the patience history, on either side of the threshold
            stalled = not rule.patience_steps or _stalled(rule, state, value, step)
            return OPS[rule.op](value, float(rule.value)) and stalled
        if rule.kind == "frozen":
            state.repeats = state.repeats + 1 if value == state.previous else 1
            state.previous = value
            return not state.exempt and state.repeats >= int(rule.window)
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
        why: str | None = None,
    ) -> dict[str, Any] | None:
        if condition:
            state.streak += 1
            state.false_since = None
            state.false_count = 0
            if not state.firing and state.streak >= max(1, int(rule.for_)):
                state.firing = True
                why = why or _why(rule, value, state.streak)
                return _alert(rule, "firing", run_id, series, value, step, ts_ms, why)
            return None
        state.streak = 0
        if state.firing:
            if state.false_since is None:
                state.false_since = ts_ms
            state.false_count += 1
            if (
                state.false_count >= int(rule.resolve_after)
                and ts_ms - state.false_since >= rule.resolve_after_s * 1000
            ):
                state.firing = False
                state.false_since = None
                state.false_count = 0
                return _alert(rule, "resolved", run_id, series, value, step, ts_ms, "back within limits")
        return None


def _shift_params(rule: Rule) -> ShiftParams:
    return ShiftParams(
        int(rule.block),
        int(rule.reference),
        int(rule.gap),
        float(rule.slack),
        float(rule.limit),
        float(rule.floor),
        rule.direction,
    )


#: the most entries a patience rule keeps: past it, neighbouring entries are merged in pairs, so
#: the history reaches back over the whole run at a coarser grain (its means stay exact sums)
PATIENCE_KEPT = 1000


def _stalled(rule: Rule, state: _State, value: float, step: int | None) -> bool:
    """Whether the series has stopped improving (``value`` counted): see ``Rule.patience_steps``.

    Its mean over the last ``H`` steps is no better (by more than ``min_delta``) than over the
    ``H`` steps before them, where ``H`` is ``patience_steps``, or ``patience_share`` of the
    steps so far if that is more. Better is the side the threshold wants: higher for ``<``/``<=``
    (a target to reach), lower for ``>``/``>=``. With less than ``2H`` steps seen it is still
    improving, as far as anyone can tell.
    """
    if state.history is None:
        state.history = []
    history = state.history  # (last step, sum, count) of one value or of merged neighbours
    if step is None:  # no step: values count as steps
        step = history[-1][0] + 1 if history else 0
    history.append((step, value, 1))
    if len(history) > PATIENCE_KEPT:
        pairs = zip(history[0::2], history[1::2], strict=False)
        merged = [(b[0], a[1] + b[1], a[2] + b[2]) for a, b in pairs]
        history[:] = merged + ([history[-1]] if len(history) % 2 else [])
    span = max(float(rule.patience_steps), float(rule.patience_share) * step)
    if step - history[0][0] < 2 * span - 1:
        return False
    recent = [(v, n) for s, v, n in history if s > step - span]
    before = [(v, n) for s, v, n in history if step - 2 * span < s <= step - span]
    if not recent or not before:
        return False
    gain = _mean(recent) - _mean(before)
    return (gain if rule.op[0] == "<" else -gain) <= float(rule.min_delta)


def _mean(entries: list[tuple[float, int]]) -> float:
    return math.fsum(v for v, _ in entries) / sum(n for _, n in entries)


def _watch_repeats(rule: Rule, state: _State, values: Sequence[float]) -> None:
    """A ``frozen`` rule's warm-up: a series that repeats a value in it is never judged."""
    left = int(rule.warmup) - state.seen
    if left <= 0 or state.exempt:
        return
    head = [state.previous, *values[:left]] if state.previous is not None else list(values[:left])
    state.exempt = any(a == b for a, b in zip(head, head[1:], strict=False))


def _widen(ranges: dict[str, tuple[float, float]], run_id: str, values: Sequence[float]) -> None:
    """Fold a column's finite values into the run's (min, max)."""
    # a finite sum means every value is finite (one C loop); else keep the finite ones
    finite = values if math.isfinite(sum(values)) else [v for v in values if math.isfinite(v)]
    if finite:
        lo, hi = min(finite), max(finite)
        old = ranges.get(run_id)
        ranges[run_id] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))


def _quiet(rule: Rule, state: _State, values: Sequence[float]) -> bool:
    """True if no value trips ``rule``; then also moves its state past them, as one by one would.

    Only all-finite columns are decided here (a NaN among them is for the value-by-value path).
    """
    if not values or not math.isfinite(sum(values)):
        return False
    kind = rule.kind
    if kind == "nonfinite":
        return True
    if kind == "frozen":
        chain = [state.previous, *values] if state.previous is not None else list(values)
        if any(map(operator.eq, chain, chain[1:])):
            return False
        state.previous, state.repeats = values[-1], 1
        return True
    if kind == "threshold":
        op = rule.op
        extreme = max(values) if op[0] == ">" else min(values)
        return not OPS[op](extreme, float(rule.value))
    if kind == "rate":
        previous = [state.previous] if state.previous is not None else []
        chain = [*previous, *values]
        if len(chain) > 1 and max(map(abs, map(operator.sub, chain[1:], chain[:-1]))) > float(
            rule.max_change
        ):
            return False
        state.previous = values[-1]
        return True
    if kind == "zscore":
        window = state.window
        if window is None:
            window = state.window = RollingMoments(int(rule.window))
        z = window.scores(values, max(5, int(rule.window) // 2))
        signed = {"both": np.abs(z), "above": z, "below": -z}[rule.direction]
        if (signed > float(rule.z)).any():
            return False
        window.extend(values)
        return True
    return False


_VECTOR_MIN = 16  # shorter columns go value by value: numpy's fixed cost is larger


def _frozen(rule: Rule, state: _State, values: Sequence[float]) -> np.ndarray:
    """A ``frozen`` rule's condition at every value (equal values in a row, counted across columns)."""
    cond = np.zeros(len(values), dtype=bool)
    for i, value in enumerate(values):
        cond[i] = AlertEngine._condition(rule, state, value)
    return cond


def _conditions(rule: Rule, state: _State, values: Sequence[float]) -> np.ndarray:
    """The rule's condition at every value, as :meth:`AlertEngine._condition` one by one would."""
    a = np.asarray(values, dtype=float)
    finite = np.isfinite(a)
    if rule.kind == "nonfinite":
        return ~finite
    if rule.kind == "threshold":
        return finite & OPS[rule.op](a, float(rule.value))  # type: ignore[arg-type]  # elementwise
    if rule.kind == "frozen":
        return _frozen(rule, state, values)
    cond = np.zeros(a.size, dtype=bool)
    f = a[finite]
    if not f.size:
        return cond
    if rule.kind == "rate":
        jumps = np.zeros(f.size, dtype=bool)
        if state.previous is not None:
            jumps[0] = abs(f[0] - state.previous) > float(rule.max_change)
        jumps[1:] = np.abs(np.diff(f)) > float(rule.max_change)
        state.previous = float(f[-1])
        cond[finite] = jumps
    elif rule.kind == "zscore":
        window = state.window
        if window is None:
            window = state.window = RollingMoments(int(rule.window))
        z = window.scores(f, max(5, int(rule.window) // 2))
        cond[finite] = {"both": np.abs(z), "above": z, "below": -z}[rule.direction] > float(rule.z)
        window.extend(f.tolist())
    return cond


def _walk(
    rule: Rule,
    state: _State,
    conditions: np.ndarray,
    run_id: str,
    series: str,
    values: Sequence[float],
    steps: Sequence[int | None],
    stamps: Sequence[int],
) -> list[dict[str, Any]]:
    """:meth:`AlertEngine._transition` over a column, a stretch of equal conditions at a time."""
    out = []
    need = max(1, int(rule.for_))
    resolve_ms = rule.resolve_after_s * 1000
    cuts = (np.flatnonzero(conditions[1:] != conditions[:-1]) + 1).tolist()
    for start, end in zip([0, *cuts], [*cuts, len(conditions)], strict=True):
        if conditions[start]:
            if not state.firing and state.streak + (end - start) >= need:
                j = start + need - state.streak - 1  # where the streak reaches `need`
                state.firing = True
                why = _why(rule, values[j], need)
                out.append(_alert(rule, "firing", run_id, series, values[j], steps[j], stamps[j], why))
            state.streak += end - start
            state.false_since = None
            state.false_count = 0
            continue
        state.streak = 0
        if not state.firing:
            continue
        if state.false_since is None:
            state.false_since = stamps[start]
        # the first value by which the condition was false long enough, in evaluations and time
        first = start + max(0, int(rule.resolve_after) - state.false_count - 1)
        late = np.flatnonzero(np.asarray(stamps[first:end]) - state.false_since >= resolve_ms)
        if late.size:
            j = first + int(late[0])
            state.firing = False
            state.false_since = None
            state.false_count = 0
            why = "back within limits"
            out.append(_alert(rule, "resolved", run_id, series, values[j], steps[j], stamps[j], why))
        else:
            state.false_count += end - start
    return out


def _why(rule: Rule, value: float, streak: int) -> str:
    if rule.kind == "threshold":
        times = f" for {streak} evaluations" if streak > 1 else ""
        stalled = ", no better than over the span before" if rule.patience_steps else ""
        return f"{value:.4g} {rule.op} {rule.value:g}{times}{stalled}"
    if rule.kind == "frozen":
        return f"the same value {value:.6g} {rule.window} times in a row"
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
