"""Alert rules from YAML: parsed once, validated with the file's line numbers in every error."""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from metricbus.schemas import ConfigError

DEFAULT_RULES = Path(__file__).resolve().parent / "rules" / "default.yaml"

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
#: the roles a rule's ``metric`` (or ``only_if``) may name instead of a series: the run's reward
#: or loss, whatever its framework called it (the stream config's alias catalog)
ROLES = ("@reward", "@loss")
KINDS = ("threshold", "nonfinite", "absent", "shift", "frozen", "zscore", "rate")
_FIELDS = {
    "name",
    "kind",
    "metric",
    "op",
    "value",
    "for",
    "warmup",
    "window",
    "z",
    "direction",
    "max_change",
    "block",
    "reference",
    "gap",
    "slack",
    "limit",
    "floor",
    "patience_steps",
    "patience_share",
    "min_delta",
    "seconds",
    "severity",
    "resolve_after",
    "resolve_after_s",
    "message",
    "only_if",
}


@dataclasses.dataclass(frozen=True)
class Scope:
    """Which runs a rule applies to, from the values a run has shown of one series.

    ``within``: only runs whose every finite value of ``metric`` so far lies in [lo, hi]
    (seed 004's absolute reward targets assume rewards in [0, 1]); ``outside``: only runs
    with some value out of it (for the scale-free rule that stands in for them).
    """

    metric: str
    lo: float
    hi: float
    within: bool

    def applies(self, seen: tuple[float, float] | None) -> bool:
        """Whether a run whose ``metric`` spanned ``seen`` (min, max; None: no value) is in scope."""
        if seen is None:
            return False
        inside = self.lo <= seen[0] and seen[1] <= self.hi
        return inside if self.within else not inside


@dataclasses.dataclass(frozen=True)
class Rule:
    """One alert rule. ``metric`` is a glob over logged and derived series names."""

    name: str  #: the rule's name, unique in its file: the alert's title
    kind: str  #: threshold | nonfinite | absent | shift | frozen | zscore | rate
    metric: str = "*"  #: a glob over logged and derived series names (``*[Ll]oss*``)
    op: str = ">"  #: threshold: > >= < <=
    value: float = 0.0  #: threshold: the limit
    for_: int = 1  #: consecutive evaluations the condition must hold before firing
    warmup: int = 0  #: first evaluations of each series ignored (frozen: watched for repeats)
    patience_steps: int = 0  #: threshold: holds only while its mean over the last H steps is no better ...
    patience_share: float = 0.0  #: ... than over the H before; H = max(patience_steps, this x step)
    min_delta: float = 0.0  #: threshold with patience: improving means better by more than this
    window: int = 20  #: zscore: values in the reference window; frozen: equal values in a row that fire
    z: float = 4.0  #: zscore: |value - mean| / std above this fires
    direction: str = "both"  #: shift, zscore: both | above | below
    block: int = 20  #: shift: values per block (each judged by its median)
    reference: int = 40  #: shift: blocks in the reference a block is judged against
    gap: int = 2  #: shift: blocks left out between the reference and the block judged
    slack: float = 3.5  #: shift: CUSUM allowance, in reference sds (a block this far out adds nothing)
    limit: float = 3.5  #: shift: CUSUM decision limit, in reference sds
    floor: float = 0.01  #: shift: the smallest reference sd, as a share of the reference median's size
    max_change: float = 0.0  #: rate: |value - previous value| above this fires
    seconds: float = 300.0  #: absent: silence longer than this fires
    severity: str = "warning"  #: critical | warning | info
    resolve_after: int = 3  #: the condition must stay false this many evaluations ...
    resolve_after_s: float = 30.0  #: ... and this long (event time) before "resolved"
    message: str = ""  #: the alert's text, followed by why it fired (the value against the limit)
    only_if: Scope | None = None  #: the runs this rule applies to (all when None)
    line: int = 0  #: where the rule starts in its file

    @property
    def role(self) -> str | None:
        """``@reward`` or ``@loss`` when the rule watches the run's series of that role, else None."""
        return self.metric if self.metric in ROLES else None

    def matches(self, series: str) -> bool:
        """Whether this rule watches ``series`` by name (a role rule watches a role, no name)."""
        return self.role is None and fnmatch.fnmatchcase(series, self.metric)


class _LineLoader(yaml.SafeLoader):
    pass


def _mapping_with_line(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping: dict[str, Any] = {str(k): v for k, v in loader.construct_mapping(node, deep=True).items()}
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


def load_rules(path: Path | str = DEFAULT_RULES) -> list[Rule]:
    """Parse a rules file; raise ConfigError naming the file, line and fix for anything wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read rules file {path}: {exc}") from exc
    return parse_rules(text, source=str(path))


def parse_rules(text: str, source: str = "<rules>") -> list[Rule]:
    """Parse rules from YAML text (see :func:`load_rules`)."""
    try:
        doc = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list):
        raise ConfigError(f"{source}: expected a top-level 'rules:' list of rules")
    rules, names = [], set()
    for raw in doc["rules"]:
        rule = _rule(raw, source)
        if rule.name in names:
            raise ConfigError(
                f"{source}:{rule.line}: rule name {rule.name!r} is used twice; names must be unique"
            )
        names.add(rule.name)
        rules.append(rule)
    return rules


def _rule(raw: Any, source: str) -> Rule:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: each rule must be a mapping with at least 'name' and 'kind'")
    line = raw.pop("__line__", 0)
    where = f"{source}:{line}"
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
    name, kind = raw.get("name"), raw.get("kind")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: every rule needs a 'name'")
    if kind not in KINDS:
        raise ConfigError(f"{where}: rule {name!r} has kind {kind!r}; use one of {', '.join(KINDS)}")
    fields: dict[str, Any] = {"name": name, "kind": kind, "line": line}
    for key in _FIELDS - {"name", "kind"}:
        if key in raw:
            fields["for_" if key == "for" else key] = raw[key]
    if kind == "threshold":
        if "value" not in raw or fields.get("op", ">") not in OPS:
            raise ConfigError(
                f"{where}: threshold rule {name!r} needs 'op' (one of {' '.join(OPS)}) and a numeric 'value'"
            )
    if kind == "rate" and "max_change" not in raw:
        raise ConfigError(
            f"{where}: rate rule {name!r} needs 'max_change' (largest allowed change per value)"
        )
    metric = raw.get("metric", "*")
    if isinstance(metric, str) and metric.startswith("@") and metric not in ROLES:
        raise ConfigError(f"{where}: rule {name!r} watches {metric!r}; a role is one of {', '.join(ROLES)}")
    if "only_if" in raw:
        fields["only_if"] = _scope(raw["only_if"], f"{where}: rule {name!r}")
    if kind in ("zscore", "shift") and fields.get("direction", "both") not in ("both", "above", "below"):
        raise ConfigError(f"{where}: {kind} rule {name!r}: direction must be both, above or below")
    if ("patience_steps" in raw or "patience_share" in raw) and kind != "threshold":
        raise ConfigError(
            f"{where}: rule {name!r}: patience_steps and patience_share are for threshold rules "
            "(a target not met while the series has stopped improving)"
        )
    try:
        rule = Rule(**fields)
        numerics = ("value", "z", "max_change", "seconds", "resolve_after_s", "slack", "limit", "floor")
        for numeric in (*numerics, "min_delta", "patience_share"):
            if not math.isfinite(float(getattr(rule, numeric))):
                raise ValueError(f"{numeric} must be finite")
        for integer in ("for_", "warmup", "window", "patience_steps", "gap", "resolve_after"):
            if int(getattr(rule, integer)) < 0:
                raise ValueError(f"{integer} must be 0 or more")
        for positive in ("block", "reference"):
            if int(getattr(rule, positive)) < 2:
                raise ValueError(f"{positive} must be 2 or more")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: rule {name!r} has a value of the wrong type ({exc})") from None
    return rule


def _scope(raw: Any, where: str) -> Scope:
    usage = (
        f"{where}: only_if must be {{metric: NAME, within: [lo, hi]}} or {{metric: NAME, outside: [lo, hi]}}"
    )
    if not isinstance(raw, dict):
        raise ConfigError(usage)
    raw = {k: v for k, v in raw.items() if k != "__line__"}
    which = [k for k in ("within", "outside") if k in raw]
    metric, bounds = raw.get("metric"), raw.get(which[0]) if len(which) == 1 else None
    if (
        set(raw) != {"metric", *which}
        or not isinstance(metric, str)
        or not isinstance(bounds, list)
        or len(bounds) != 2
        or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
        or not bounds[0] <= bounds[1]
    ):
        raise ConfigError(usage)
    return Scope(metric, float(bounds[0]), float(bounds[1]), which[0] == "within")
