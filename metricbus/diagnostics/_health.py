"""Run health, 0-100, from a run's archived events: documented parts, each with its evidence.

- completeness (30): seqs missing from a producer's sequence (lost events), an event archived
  twice, no RunFinished, a rank that stopped reporting before the others;
- validity (20): NaN or infinite values, per metric (the first step given);
- progress (15): the run's loss (alias catalog) not lower at the end than at the start, its
  reward not higher (medians of the first and last tenth);
- stability (15): loss spikes, values more than 6 robust standard deviations (MAD) from the
  median of the 21 values around them (the first and last 10 values are not judged);
- timing (10): a metric logged at half the rate late in the run that it was early (a
  collection-frequency regression; not the ``episode/`` metrics of ``run.log_episode``, logged
  once an episode: an agent that learns plays longer episodes); a stall (no event for 10x the
  usual interval, over 30 s);
- pipeline (10): records of the run in the dead-letter topic (when the broker is reachable).

Each part deducts at most its weight; the score is 100 minus the deductions.

Labelled runs (``run.log_episode(..., labels={"task": ...})``) also get a breakdown per label:
its events and the final-window means of the reward, ``episode/success`` (the success rate) and
``episode/length``; a label whose reward did not improve while the run's did deducts from
progress (3 each), with the label named.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from metricbus.diagnostics._compare import final_window
from metricbus.diagnostics._series import Points, Series, scalars, split
from metricbus.schemas import (
    LOSS_ALIASES,
    METRICS,
    REWARD_ALIASES,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    Settings,
)

#: ranks named one by one when they never reported; the rest are counted in one line
SAID_RANKS = 8
#: The prefix of what ``run.log_episode`` logs, one value an episode.
EPISODE = "episode/"
WEIGHTS = {"completeness": 30, "validity": 20, "progress": 15, "stability": 15, "timing": 10, "pipeline": 10}


@dataclasses.dataclass
class Part:
    """One part of the score: what it deducted and why."""

    name: str
    weight: int
    deducted: float = 0.0
    evidence: list[str] = dataclasses.field(default_factory=list)

    def deduct(self, points: float, why: str) -> None:
        self.deducted = min(self.weight, self.deducted + points)
        self.evidence.append(why)


def shown_points(weight: float, deducted: float) -> tuple[float, float]:
    """A part's (kept, deducted) as shown, to a tenth: rounded once, so the two add up to its weight."""
    lost = round(deducted, 1)
    return weight - lost, lost


@dataclasses.dataclass
class Health:
    """A run's score and its parts."""

    run_id: str
    parts: list[Part]
    #: per label ("task=logo_a"): events, and final-window means of the reward, success, length
    labels: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def score(self) -> float:
        return round(100 - sum(p.deducted for p in self.parts), 1)

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "score": self.score,
            "parts": [dataclasses.asdict(p) for p in self.parts],
            "labels": self.labels,
        }


@dataclasses.dataclass
class Seen:
    """What the score needs of a run's events, gathered in one pass (:meth:`read`).

    Its scalar series (the labelled ones too) are the run's logged series as the report and
    compare read them too: one copy of a long run's points, not one per reader.
    """

    series: Series = dataclasses.field(default_factory=dict)  #: :func:`scalars` of the events
    #: per producer, as typed arrays (8 bytes a seq; a list of ints took ~36)
    seqs: dict[str, array[int]] = dataclasses.field(default_factory=dict)
    stamps: array[int] = dataclasses.field(default_factory=lambda: array("q"))  #: every event's ts_ms
    finished: bool = False
    world: int = 1
    last_step: dict[int, int] = dataclasses.field(default_factory=dict)  #: per rank

    @classmethod
    def read(cls, events: Iterable[Event]) -> Seen:
        """Read ``events`` once, keeping only what the score judges (not the events)."""
        seen = cls()
        seen.series = scalars(seen._track(events), samples=True)
        return seen

    def _track(self, events: Iterable[Event]) -> Iterator[Event]:
        """Yield ``events`` (to :func:`scalars`), noting what completeness and timing judge."""
        for e in events:
            (self.seqs.get(e.producer_id) or self.seqs.setdefault(e.producer_id, array("q"))).append(e.seq)
            self.stamps.append(e.ts_ms)
            if e.kind == RUN_FINISHED:
                self.finished = True
            elif e.kind == RUN_STARTED:
                self.world = max(self.world, int(e.body.get("world_size") or 1))
            elif e.kind == METRICS:
                rank, step = int(e.body.get("rank") or 0), e.body["step"]
                self.last_step[rank] = max(self.last_step.get(rank, step), step)
            yield e


def assess(run_id: str, events: Iterable[Event], dead_letters: int | None = None) -> Health:
    """The health of one run from its logged events (as the archive returns them).

    ``events`` is read once and not kept: a run read a chunk at a time (``sinks.iter_events``)
    is judged from its series and seqs, without every event in memory at once.
    """
    return judge(run_id, Seen.read(events), dead_letters)


def judge(run_id: str, seen: Seen, dead_letters: int | None = None) -> Health:
    """The health of a run from what :meth:`Seen.read` kept of its logged events."""
    parts = {name: Part(name, weight) for name, weight in WEIGHTS.items()}
    every = seen.series
    series = {n: pts for n, pts in every.items() if split(n)[1] is None}
    _completeness(parts["completeness"], seen)
    _validity(parts["validity"], series)
    _progress(parts["progress"], series)
    _stability(parts["stability"], series)
    _timing(parts["timing"], series, seen.stamps)
    pipeline = parts["pipeline"]
    if dead_letters is None:
        pipeline.evidence.append("dead letters not checked (no broker reachable, or not asked)")
    elif dead_letters:
        pipeline.deduct(2 * dead_letters, f"{dead_letters} record(s) of this run in the dead-letter topic")
    labels = _labels(parts["progress"], series, every)
    return Health(run_id, list(parts.values()), labels)


def _completeness(part: Part, seen: Seen) -> None:
    for producer, seqs in sorted(seen.seqs.items()):
        held = sorted(set(seqs))
        gaps = _missing(held)
        missing = sum(last - first + 1 for first, last in gaps)
        if missing:
            share = missing / (held[-1] + 1)
            part.deduct(
                10 + 10 * share,
                f"producer {producer[:12]}: {missing} event(s) missing from its sequence "
                f"(seqs {_spans(gaps)}): lost between the training job and the archive",
            )
        twice = len(seqs) - len(held)
        if twice:
            part.deduct(10, f"producer {producer[:12]}: {twice} event(s) archived twice")
    if not seen.finished:
        part.deduct(5, "no RunFinished: the run is still going, or its process was killed")
    world, last = seen.world, seen.last_step
    if world > 1:
        top = max(last.values(), default=0)
        # the ranks never heard from, without a loop over the declared world (untrusted: 2**31)
        never = world - sum(1 for rank in last if 0 <= rank < world)
        for rank in itertools.islice(itertools.filterfalse(last.__contains__, range(world)), SAID_RANKS):
            part.deduct(10, f"rank {rank} of {world} never reported a metric")
        if never > SAID_RANKS:
            part.deduct(10, f"and {never - SAID_RANKS} more rank(s) of {world} never reported a metric")
        for rank in sorted(r for r in last if 0 <= r < world):
            if top and last[rank] < 0.9 * top:
                part.deduct(10, f"rank {rank} stopped reporting at step {last[rank]}; others reached {top}")


def _columns(points: Sequence[tuple[int, float, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, values, times) of a series as numpy arrays (views of :class:`Points`' arrays)."""
    if isinstance(points, Points):
        return (
            np.frombuffer(points.steps, dtype=np.int64),
            np.frombuffer(points.values, dtype=np.float64),
            np.frombuffer(points.stamps, dtype=np.int64),
        )
    steps, values, stamps = zip(*points, strict=True) if points else ((), (), ())
    return (
        np.array(steps, dtype=np.int64),
        np.array(values, dtype=np.float64),
        np.array(stamps, dtype=np.int64),
    )


def _validity(part: Part, series: Series) -> None:
    for name, points in sorted(series.items()):
        steps, values, _ = _columns(points)
        bad = ~np.isfinite(values)
        count = int(bad.sum())
        if count:
            part.deduct(
                5 + 10 * count / len(values),
                f"{name}: {count} of {len(values)} values NaN or infinite, first at step "
                f"{int(steps[np.argmax(bad)])}",
            )


def _role(series: Series, catalog: Sequence[str]) -> str | None:
    return next((n for n in catalog if n in series), None)


def _finite(points: Sequence[tuple[int, float, int]]) -> list[float]:
    values = _columns(points)[1]
    return values[np.isfinite(values)].tolist()


def _progress(part: Part, series: Series) -> None:
    for role, catalog, better in (("loss", LOSS_ALIASES, -1), ("reward", REWARD_ALIASES, 1)):
        name = _role(series, catalog)
        values = _finite(series[name]) if name else []
        if len(values) < 10:
            part.evidence.append(f"no {role} series with 10 values to judge progress by")
            continue
        improved, start, end = _improved(values, better)
        if not improved:
            part.deduct(
                8 if role == "loss" else 7,
                f"{role} {name} did not improve: median {start:.4g} over the first tenth, "
                f"{end:.4g} over the last",
            )
        else:
            part.evidence.append(f"{role} {name}: {start:.4g} -> {end:.4g}")


def _improved(values: Sequence[float], better: int) -> tuple[bool, float, float]:
    """Whether the median of the last tenth is better than the first tenth's, and both medians."""
    k = max(1, len(values) // 10)
    start, end = statistics.median(values[:k]), statistics.median(values[-k:])
    return (end - start) * better > 0, start, end


def _labels(part: Part, series: Series, every: Series) -> list[dict[str, Any]]:
    reward = _role(series, REWARD_ALIASES)
    shown = [m for m in (reward, "episode/success", "episode/length") if m is not None]
    rows: dict[str, dict[str, Any]] = {}
    for name, points in every.items():
        metric, label = split(name)
        if label is None:
            continue
        row = rows.setdefault(label, {"label": label, "events": 0})
        row["events"] = max(row["events"], len(points))
        values = _finite(points)
        if metric in shown and values:
            row[metric] = statistics.fmean(final_window(values))
    overall = _finite(series[reward]) if reward else []
    if reward and len(overall) >= 10 and _improved(overall, 1)[0]:
        for label in sorted(rows):
            values = _finite(every.get(f"{reward} [{label}]", []))
            if len(values) < 10:
                continue
            improved, start, end = _improved(values, 1)
            if not improved:
                part.deduct(
                    3,
                    f"{reward} [{label}] did not improve while the run's reward did: median "
                    f"{start:.4g} over its first tenth, {end:.4g} over its last",
                )
    return [rows[k] for k in sorted(rows)]


def _stability(part: Part, series: Series) -> None:
    name = _role(series, LOSS_ALIASES)
    if name is None:
        return
    steps, values, _ = _columns(series[name])
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    spikes: list[int] = []
    if len(values) >= 21:  # each value with 10 on either side (the steep start is no spike)
        windows = np.lib.stride_tricks.sliding_window_view(values, 21)
        median = np.median(windows, axis=1)
        mad = np.median(np.abs(windows - median[:, None]), axis=1) * 1.4826
        centre = values[10:-10]
        with np.errstate(divide="ignore", invalid="ignore"):
            spiked = (mad > 0) & (np.abs(centre - median) / mad > 6)
        spikes = steps[10:-10][spiked].tolist()
    if spikes:
        part.deduct(
            5 + 2 * len(spikes), f"{name}: {len(spikes)} spike(s) (robust z > 6) at steps {_ranges(spikes)}"
        )


def _timing(part: Part, series: Series, every_ts: Sequence[int]) -> None:
    for name, points in sorted(series.items()):
        if name.startswith(EPISODE):
            continue  # its rate is the episodes', which lengthen as an agent learns
        gaps = np.diff(_columns(points)[2])
        if len(gaps) < 30:
            continue
        third = len(gaps) // 3
        early, late = float(np.median(gaps[:third])), float(np.median(gaps[-third:]))
        if early > 0 and late > 2 * early:
            part.deduct(
                5,
                f"{name}: logged every {late / 1000:.2f} s late in the run, every {early / 1000:.2f} s early "
                "(a collection-frequency regression)",
            )
    between = np.diff(np.sort(np.asarray(every_ts, dtype=np.int64)))
    if len(between) >= 10:
        usual = float(np.median(between))
        stalls = between[between > np.float64(max(10 * usual, 30_000))].tolist()
        for gap in stalls[:3]:
            part.deduct(
                5, f"no event for {gap / 1000:.0f} s (the run's usual interval is {usual / 1000:.2f} s)"
            )


def _missing(held: Sequence[int]) -> list[tuple[int, int]]:
    """The (first, last) spans of 0..max(held) that sorted, distinct ``held`` lacks.

    From the gaps between the seqs, not a set of every seq up to the last: one record's seq of
    10**12 (a topic is untrusted) took all the memory there was.
    """
    gaps, expected = [], 0
    for seq in held:
        if seq > expected:
            gaps.append((expected, seq - 1))
        expected = max(expected, seq + 1)
    return gaps


def _ranges(values: Sequence[int]) -> str:
    """1,2,3,7 -> '1-3, 7' (at most 5 ranges shown)."""
    spans: list[tuple[int, int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], v)
        else:
            spans.append((v, v))
    return _spans(spans)


def _spans(spans: Sequence[tuple[int, int]]) -> str:
    """[(1, 3), (7, 7)] -> '1-3, 7' (at most 5 shown)."""
    out = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:5]]
    return ", ".join(out) + (f" and {len(spans) - 5} more" if len(spans) > 5 else "")


def dead_letters_of(settings: Settings, run_id: str, timeout_s: float = 5.0) -> int | None:
    """Records of ``run_id`` in the dead-letter topic (keyed by run id); None without a broker."""
    from metricbus.schemas import read_topic, unreachable

    if unreachable(settings):  # nothing listening: known at once, without a Kafka client's import
        return None
    try:
        records = read_topic(settings, settings.topics.deadletter, idle_s=0.5, timeout_s=timeout_s)
    except Exception:  # noqa: BLE001 - no broker: the part says it was not checked
        return None
    return sum(r.key == run_id.encode() for r in records)
