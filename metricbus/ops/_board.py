"""The live view of runs: what ``status`` lists and the dashboard draws.

A :class:`RunBoard` folds events (logged and derived) and alerts into one bounded summary per
run: project, name, host, ranks, last step, events/s over the last minute, time since the
last event, firing alerts, config, and the last points of every series. It consumes the
topics itself (no consumer group: it never commits, never holds up a sink) on a thread of
its own; readers take snapshots under a lock, so a slow or closed browser costs it nothing.
Everything from the topics is untrusted: undecodable or unsafe records are counted and
skipped (the sinks dead-letter them), names are only ever data, sizes are capped.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import threading
import time
from typing import Any

from metricbus.ops._run_starts import find_starts
from metricbus.schemas import (
    CONFIG_UPDATE,
    DERIVED_PRODUCER,
    HEARTBEAT,
    LOSS_ALIASES,
    MEDIA,
    METRICS,
    ONE_SHOT_FETCH_WAIT_MS,
    ONE_SHOT_POLL_MS,
    REWARD_ALIASES,
    RUN_FINISHED,
    RUN_STARTED,
    FetchWait,
    MetricbusError,
    SchemaError,
    Settings,
    all_events,
    checked_digest,
    checked_media_type,
    config_object,
    decode_aggregates,
    decode_alert,
    decode_events,
    decode_record,
    default_codec,
    merge_config,
    topic_reader,
)
from metricbus.schemas import MAX_RECORD_BYTES as _MAX_RECORD

log = logging.getLogger("metricbus.board")

#: seconds a one-shot read spends finding the RunStarted of runs older than its tail
START_SEARCH_S = 2.0

#: A live run with no event (metrics or heartbeat) for this long is stalled.
STALL_AFTER_S = 60.0
#: Points kept per series, runs kept, series kept per run (the oldest go first).
MAX_POINTS = 2000
MAX_RUNS = 500
MAX_SUMMARY = 64  #: numbers of a run's own summary kept
MAX_SERIES = 400
MAX_CONFIG_BYTES = 64 * 1024
MAX_RANKS = 4096  #: ranks listed per run (a hostile stream may name 2**31)
MAX_MEDIA_NAMES = 32  #: media names kept per run ...
MAX_MEDIA_ITEMS = 100  #: ... and items per name, the latest steps
MAX_COLUMNS = 48  #: config keys and last values a runs-table row carries


@dataclasses.dataclass
class RunView:
    """What is known of one run."""

    run_id: str
    project: str = ""
    name: str = ""
    host: str = ""
    world_size: int = 1
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    ranks: set[int] = dataclasses.field(default_factory=set)
    started_ms: int | None = None
    finished: str | None = None  #: RunFinished status
    finished_ms: int | None = None
    last_step: int | None = None
    last_event_ms: int = 0
    events: int = 0
    #: per-second event counts of the last minute (event time): [second, count, its first ts_ms]
    recent: collections.deque[list[int]] = dataclasses.field(default_factory=lambda: collections.deque())
    #: per series its last points: (step, value or None, ts_ms)
    series: dict[str, collections.deque[tuple[int, float | None, int]]] = dataclasses.field(
        default_factory=dict
    )
    epochs: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    #: rule/metric -> the latest alert of that key
    alerts: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    finished_by: set[str] = dataclasses.field(default_factory=set)
    #: the run's own summary (``finish(summary=...)``): its numbers, bounded
    final: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: per media name its items (by step, the latest kept): step, kind, digest, caption, size
    media: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    media_count: int = 0  #: media items folded so far (the page redraws its media when it moves)
    #: the series the stream worker derived (the rest the run logged)
    derived: set[str] = dataclasses.field(default_factory=set)

    def fold_media(self, body: dict[str, Any]) -> None:
        """Fold a Media event: its reference and what the page shows of it (bounded, checked)."""
        try:
            checked_media_type(body)
            digest = checked_digest(body["ref"])
        except (ValueError, MetricbusError):
            return  # the sinks dead-letter it; the page has nothing to show
        name = str(body["name"])[:200]
        items = self.media.get(name)
        if items is None:
            if len(self.media) >= MAX_MEDIA_NAMES:
                return
            items = self.media[name] = []
        item = {
            "step": body["step"],
            "kind": body["kind"],
            "digest": digest,
            "caption": None if body.get("caption") is None else str(body["caption"])[:500],
            "size": body["size"],
        }
        items.append(item)
        items.sort(key=lambda i: i["step"])
        del items[:-MAX_MEDIA_ITEMS]
        self.media_count += 1

    def fold_summary(self, summary: Any) -> None:
        """Fold a RunFinished's summary: its numbers (a bounded count, names cut; JSON has no NaN)."""
        if not isinstance(summary, dict):
            return
        for key, value in summary.items():
            if len(self.final) >= MAX_SUMMARY:
                return
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.final[str(key)[:200]] = float(value) if math.isfinite(value) else None

    def fold_config(self, body: dict[str, Any]) -> None:
        """Fold a RunStarted's or a ConfigUpdate's config into the run's (bounded)."""
        raw = body.get("config_json") or "{}"
        if len(raw) > MAX_CONFIG_BYTES:
            return
        try:
            config = config_object(raw)
        except ValueError:
            return
        merged = merge_config(self.config, config)  # in arrival order, as schemas.run_config does
        text = json.dumps(merged, default=str)
        if len(text) <= MAX_CONFIG_BYTES:
            # NaN and infinities as text: the page's JSON has none ({"lr": NaN} made it a 500)
            self.config = json.loads(text, parse_constant=str)

    def add_point(self, name: str, step: int, value: float, ts_ms: int) -> None:
        """Keep a point of ``name`` (its last MAX_POINTS, of at most MAX_SERIES series)."""
        points = self.series.get(name)
        if points is None:
            if len(self.series) >= MAX_SERIES:
                return
            points = self.series[name] = collections.deque(maxlen=MAX_POINTS)
        # JSON has no NaN: a non-finite value is drawn as a gap (and the run's alerts say why)
        points.append((step, value if math.isfinite(value) else None, ts_ms))

    def state(self, now_ms: int) -> str:
        if self.finished is not None:
            return "finished" if self.finished in ("", "finished", "success", "ok") else self.finished
        if now_ms - self.last_event_ms > STALL_AFTER_S * 1000:
            return "stalled"
        return "live"

    def events_per_s(self, now_ms: int) -> float:
        """Events a second over the last minute, or over the part of it seen.

        A run younger than a minute, or a board that read only the topics' last records
        (``status``), is not divided by a minute it was not seen for.
        """
        seen = [(n, first) for sec, n, first in self.recent if sec > now_ms // 1000 - 60]
        if not seen:
            return 0.0
        first = min(ts for _, ts in seen)  # ranks' records interleave: not always the oldest bucket
        span_s = min(60.0, max(1.0, (now_ms - first) / 1000))
        return round(sum(n for n, _ in seen) / span_s, 3)

    def count(self, ts_ms: list[int]) -> None:
        """Count events (their times) for :meth:`events_per_s`, in per-second buckets."""
        recent = self.recent
        for ts in ts_ms:
            sec = ts // 1000
            if recent and recent[-1][0] == sec:
                recent[-1][1] += 1
            else:
                recent.append([sec, 1, ts])
        while len(recent) > 61:
            recent.popleft()

    def firing(self) -> list[dict[str, Any]]:
        return [a for a in self.alerts.values() if a["state"] == "firing"]

    def summary(self, now_ms: int, columns: bool = False) -> dict[str, Any]:
        """The runs-table row (JSON-ready); ``columns``: with its config, last values and summary."""
        extra = {}
        if columns:
            last: dict[str, float | None] = {}
            for name, points in self.series.items():
                if name not in self.derived and points and len(last) < MAX_COLUMNS:
                    last[name] = points[-1][1]
            extra = {"params": flat_params(self.config), "last": last, "final": dict(self.final)}
        return {
            **extra,
            "run_id": self.run_id,
            "project": self.project,
            "name": self.name,
            "host": self.host,
            "state": self.state(now_ms),
            "ranks": sorted(self.ranks) or [0],
            "world_size": self.world_size,
            "last_step": self.last_step,
            "events": self.events,
            "events_per_s": self.events_per_s(now_ms),
            "since_last_event_s": round(max(0, now_ms - self.last_event_ms) / 1000, 1)
            if self.last_event_ms
            else None,
            "started_ms": self.started_ms,
            "firing": [f"{a['rule']}" for a in self.firing()],
        }

    def detail(self, now_ms: int, since: dict[str, int] | None = None) -> dict[str, Any]:
        """Everything of the run for its page; ``since`` (series -> step) keeps only newer points.

        A point is ``[step, value, ts_ms]``; ``max_points`` is how many a page keeps per series.
        """
        since = since or {}
        return {
            **self.summary(now_ms),
            "config": self.config,
            "finished": self.finished,
            "series": {
                name: [[s, v, t] for s, v, t in points if s > since.get(name, -(2**63))]
                for name, points in sorted(self.series.items())
            },
            "max_points": MAX_POINTS,
            "derived": sorted(self.derived),
            # the charts the page puts first: the run's reward and loss (the alias catalog)
            "roles": {
                "reward": next((n for n in REWARD_ALIASES if n in self.series), None),
                "loss": next((n for n in LOSS_ALIASES if n in self.series), None),
            },
            "epochs": [{"epoch": e, **vals} for e, vals in sorted(self.epochs.items())],
            "alerts": sorted(self.alerts.values(), key=lambda a: a["ts_ms"]),
            "summary": self.final,
            "media": {name: list(items) for name, items in sorted(self.media.items())},
            "media_count": self.media_count,
        }


def flat_params(config: Any, limit: int = MAX_COLUMNS) -> dict[str, Any]:
    """A run's config as the runs table shows it: its scalar leaves, nested keys joined by ".".

    Lists and other values are shown as short text; at most ``limit`` keys.
    """
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if len(out) >= limit:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[prefix[:100]] = value if not isinstance(value, str) else value[:100]
        else:
            out[prefix[:100]] = json.dumps(value, default=str)[:100]

    if isinstance(config, dict):
        walk("", config)
    return out


def _json_number(value: Any) -> float | str | None:
    """A number for the page's JSON: NaN and the infinities as their names."""
    if value is None or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else str(value)


def _after_common(evidence: str | None, message: Any) -> str:
    """``message`` without the rule's message it shares with ``evidence`` (both begin "<message>: ")."""
    text = str(message)
    if not evidence:
        return text
    cut = 0
    for i, (a, b) in enumerate(zip(evidence, text, strict=False)):
        if a != b:
            break
        if text.startswith(": ", i):
            cut = i + 2
    return text[cut:] or text


class RunBoard:
    """Runs folded from the events, aggregates and alerts topics. Thread-safe snapshots."""

    def __init__(
        self, settings: Settings, since_s: float | None = None, light: bool = False, tail: int | None = None
    ) -> None:
        self.settings = settings
        #: how far back to read at start (None: from the start of each topic)
        self.since_s = since_s
        #: the runs table only (``status``): no series points, no derived topic, and a record of
        #: columns folded as columns, never an object per event
        self.light = light
        #: read only the last ``tail`` records of each partition (``status`` on a long topic)
        self.tail = tail
        #: with ``tail``: each run id's events partition and the offset of its first record read
        self._first_seen: dict[bytes, tuple[Any, int]] = {}
        self.codec = default_codec()
        self.signer = settings.signer  #: with a signing key, an events record without its HMAC is skipped
        self.runs: collections.OrderedDict[str, RunView] = collections.OrderedDict()
        self.lock = threading.Lock()
        self.skipped = 0  #: records that could not be read (the sinks dead-letter them)
        self.records = 0
        self.caught_up = threading.Event()  #: set once the topics were read to their ends
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: bumped on every change; the dashboard's stream waits on it
        self.version = 0
        self.changed = threading.Condition(self.lock)

    # -- folding (one thread) ------------------------------------------------------------

    def _run(self, run_id: str) -> RunView:
        view = self.runs.get(run_id)
        if view is None:
            view = self.runs[run_id] = RunView(run_id)
            while len(self.runs) > MAX_RUNS:
                self.runs.popitem(last=False)
        return view

    def take(self, topic: str, value: bytes | None) -> None:
        """Fold one record of ``topic`` (undecodable ones are counted and skipped)."""
        if value is None:
            self.skipped += 1
            return
        t = self.settings.topics
        try:
            if topic == t.events:
                self.signer.check(value)
            if topic == t.events and self.light:
                events, columns = decode_record(self.codec, value)
                if columns is not None and not events:
                    with self.changed:
                        self._columns(columns)
                        self._bump()
                    return
                decoded = all_events(events, columns)
            elif topic == t.events:
                decoded = decode_events(self.codec, value)
            elif topic == t.aggregates:
                decoded = decode_aggregates(self.codec, value).events
            elif topic == t.alerts:
                alert = decode_alert(self.codec, value)  # as the deliverers: no run page named ".."
                with self.changed:
                    self._alert(alert)
                    self._bump()
                return
            else:
                return
        except (SchemaError, MetricbusError, ValueError, KeyError, TypeError):
            self.skipped += 1
            return
        derived_topic = topic == t.aggregates
        with self.changed:
            try:
                for e in decoded:
                    self._event(e.run_id, e.producer_id, e.ts_ms, e.kind, e.body, derived_topic)
            except Exception as exc:  # noqa: BLE001 - raised, it would be read again at every reconnect
                self.skipped += 1
                log.warning(
                    "run board: a record of %s not folded (%s: %.200s)", topic, type(exc).__name__, exc
                )
            self._bump()

    def _columns(self, columns: Any) -> None:
        """A record of scalar columns, for the runs table: counts, last step and time, ranks."""
        view = self._run(columns.run_id)
        view.events += len(columns.seqs)
        view.last_event_ms = max(view.last_event_ms, max(columns.ts_ms))
        step = max(columns.steps)
        view.last_step = step if view.last_step is None else max(view.last_step, step)
        if len(view.ranks) < MAX_RANKS:
            view.ranks.update(set(columns.ranks))
        if view.last_event_ms < time.time() * 1000 - 61_000:
            return  # older than the last minute: no events/s to count
        view.count(sorted(columns.ts_ms))

    def fold(self, events: Any, alerts: Any = ()) -> None:
        """Fold decoded events and alert records (an archived run's, and the rules run over it).

        Logged and derived events are told apart by their producer.
        """
        with self.changed:
            for e in events:
                derived = e.producer_id == DERIVED_PRODUCER
                self._event(e.run_id, e.producer_id, e.ts_ms, e.kind, e.body, derived)
            for alert in alerts:
                self._alert(alert)
            self._bump()

    def fold_starts(self, starts: Any) -> None:
        """Fold RunStarted events from before what was read: their runs' identities alone.

        What ``status``'s search for a long run's start finds: the run's project, name, world
        size and config. Not counted as events seen, so its events/s stays over what was read.
        """
        with self.changed:
            for e in starts:
                self._event(e.run_id, e.producer_id, e.ts_ms, e.kind, e.body, derived=False, counted=False)
            self._bump()

    def _bump(self) -> None:
        self.records += 1
        self.version += 1
        self.changed.notify_all()

    def _event(
        self,
        run_id: str,
        producer_id: str,
        ts_ms: int,
        kind: str,
        body: dict[str, Any],
        derived: bool,
        counted: bool = True,
    ) -> None:
        view = self._run(run_id)
        if not derived and counted:
            view.events += 1
            view.last_event_ms = max(view.last_event_ms, ts_ms)
            view.count([ts_ms])
        if kind == METRICS:
            step = body["step"]
            if not derived:
                if len(view.ranks) < MAX_RANKS:
                    view.ranks.add(int(body.get("rank") or 0))
                view.last_step = step if view.last_step is None else max(view.last_step, step)
            epoch = body.get("epoch")
            if self.light:
                return
            for name, value in (body.get("scalars") or {}).items():
                view.add_point(name, step, value, ts_ms)
                if derived and name in view.series:
                    view.derived.add(name)
                if derived and epoch is not None and name.startswith("Epoch/"):
                    row = view.epochs.setdefault(int(epoch), {})
                    if len(row) < 64:
                        row[name[len("Epoch/") :]] = value if math.isfinite(value) else None  # type: ignore[assignment]
                    while len(view.epochs) > MAX_POINTS:
                        del view.epochs[min(view.epochs)]
        elif kind == RUN_STARTED:
            if view.finished and producer_id not in view.finished_by:
                view.finished = None  # a resumed run: a new attempt of a finished run
                view.finished_by.clear()
            view.project = str(body.get("project", ""))[:200]
            view.name = str(body.get("name", ""))[:200]
            view.host = str(body.get("host", ""))[:200]
            view.world_size = int(body.get("world_size") or 1)
            if view.finished and len(view.finished_by) < view.world_size:
                view.finished = view.finished_ms = None  # read after some ranks' RunFinished, not all
            view.started_ms = ts_ms if view.started_ms is None else min(view.started_ms, ts_ms)
            if len(view.ranks) < MAX_RANKS:
                view.ranks.add(int(body.get("rank") or 0))
            view.fold_config(body)
        elif kind == CONFIG_UPDATE:
            view.fold_config(body)
        elif kind == RUN_FINISHED and not derived:
            view.finished_by.add(producer_id)  # one producer per rank: finished when all ranks are
            if len(view.finished_by) >= max(1, view.world_size):
                view.finished = str(body.get("status") or "finished")[:40]
                view.finished_ms = ts_ms
            view.fold_summary(body.get("summary"))
        elif kind == HEARTBEAT:
            pass  # counted above: a heartbeat says the run is alive
        elif kind == MEDIA:
            view.fold_media(body)

    def _alert(self, alert: dict[str, Any]) -> None:
        """Fold one alert transition into its (rule, metric) row.

        The row keeps what the firing said (its step, value and evidence) when it resolves or
        ends, beside how and where that happened: a resolved alert still shows why it fired.
        """
        view = self._run(alert["run_id"][:128])
        key = f"{alert['rule']}/{alert['metric']}"[:300]
        prior = view.alerts.get(key) or {}
        state = str(alert["state"])[:20]
        firing = state == "firing"
        value = alert["value"]
        row = {
            "rule": str(alert["rule"])[:200],
            "metric": str(alert["metric"])[:200],
            "severity": str(alert["severity"])[:20],
            "state": state,
            "step": alert["step"],
            "message": str(alert["message"])[:500],
            "ts_ms": alert["ts_ms"],
            "fired_ms": alert["ts_ms"] if firing else prior.get("fired_ms"),
            "fired_step": alert["step"] if firing else prior.get("fired_step"),
            # JSON has no NaN: a NaN loss's value is said in words
            "value": _json_number(value) if firing else prior.get("value"),
            "evidence": str(alert["message"])[:500] if firing else prior.get("evidence"),
            "resolved_ms": None if firing else alert["ts_ms"],
            "resolved_step": None if firing else alert["step"],
            "resolution": None if firing else _after_common(prior.get("evidence"), alert["message"])[:300],
        }
        if key not in view.alerts and len(view.alerts) >= MAX_SERIES:
            return
        view.alerts[key] = row

    # -- reading -------------------------------------------------------------------------

    def runs_table(self, columns: bool = False) -> list[dict[str, Any]]:
        """The runs-table rows; ``columns``: with config, last values and summary (RunView.summary)."""
        now = int(time.time() * 1000)
        with self.lock:
            rows = [v.summary(now, columns) for v in self.runs.values() if v.started_ms or v.events]
        order = {"live": 0, "stalled": 1}
        return sorted(rows, key=lambda r: (order.get(r["state"], 2), -(r["started_ms"] or 0)))

    def run(self, run_id: str, since: dict[str, int] | None = None) -> dict[str, Any] | None:
        now = int(time.time() * 1000)
        with self.lock:
            view = self.runs.get(run_id)
            return None if view is None else view.detail(now, since)

    def alerts(self) -> list[dict[str, Any]]:
        with self.lock:
            rows = [{"run_id": v.run_id, **a} for v in self.runs.values() for a in v.alerts.values()]
        return sorted(rows, key=lambda a: -a["ts_ms"])

    def wait_change(self, version: int, timeout_s: float) -> int:
        """Block until the board changed past ``version`` (or timeout); the new version."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != version, timeout_s)
            return self.version

    # -- consuming -----------------------------------------------------------------------

    def read_once(self, timeout_s: float = 10.0) -> RunBoard:
        """Read the topics up to their ends now (for a one-shot ``status``), then return."""
        consumer = self._consumer(fetch_max_wait_ms=ONE_SHOT_FETCH_WAIT_MS)
        deadline = time.monotonic() + timeout_s
        try:
            self._consume(consumer, until_caught_up=True, deadline=deadline)
            if self.tail is not None:  # a long run's RunStarted is older than the tail read
                unstarted = {
                    key: seen
                    for key, seen in self._first_seen.items()
                    if (view := self.runs.get(key.decode("utf-8", "replace"))) and view.started_ms is None
                }
                until = min(deadline, time.monotonic() + START_SEARCH_S)
                self.fold_starts(find_starts(consumer, unstarted, self.signer, self.codec, until))
        finally:
            consumer.close()
        return self

    def start(self) -> RunBoard:
        """Follow the topics on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._follow, name="metricbus-board", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self.changed:
            self.changed.notify_all()
        if self._thread is not None:
            self._thread.join(5.0)

    def _follow(self) -> None:
        said: str | None = None  # the last reason logged
        while not self._stop.is_set():
            try:
                consumer = self._consumer()
                try:
                    said = self.error = None
                    self._consume(consumer, until_caught_up=False, deadline=None)
                finally:
                    consumer.close()
            except Exception as exc:  # noqa: BLE001 - the board outlives a broker restart
                error = str(exc)  # kafka's errors name their class; others get it here
                if not error.startswith(type(exc).__name__):
                    error = f"{type(exc).__name__}: {error}"
                if error != said:  # once per reason: with the broker down this comes every 2 s
                    log.warning("run board: %s; reconnecting every 2s", error)
                said = self.error = error
                self._stop.wait(2.0)

    def _consumer(self, **overrides: Any) -> Any:
        from kafka import TopicPartition

        t = self.settings.topics
        consumer = topic_reader(self.settings, "metricbus-board", **overrides)
        topics = (t.events, t.alerts) if self.light else (t.events, t.aggregates, t.alerts)
        found = {topic: sorted(consumer.partitions_for_topic(topic) or ()) for topic in topics}
        tps = [TopicPartition(topic, p) for topic, partitions in found.items() for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        if self.tail is not None and tps:
            begins, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, max(begins.get(tp, 0), ends.get(tp, 0) - self.tail))
        if self.since_s is not None and tps:
            start = int((time.time() - self.since_s) * 1000)
            for tp, found in consumer.offsets_for_times({tp: start for tp in tps}).items():
                if found is not None and found.offset >= 0:
                    consumer.seek(tp, found.offset)
        return consumer

    def _consume(self, consumer: Any, until_caught_up: bool, deadline: float | None) -> None:
        tps = list(consumer.assignment())
        events = self.settings.topics.events
        # following: a quiet board asks with the idle wait (a one-shot read keeps its own)
        wait = None
        if not until_caught_up:
            wait = FetchWait.of_kafka_python(consumer, self.settings)
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return
            # one-shot: an empty poll waits out its timeout, and the ends come with the first answer
            polled = consumer.poll(timeout_ms=ONE_SHOT_POLL_MS if until_caught_up else 200)
            if wait is not None:
                wait.saw(sum(map(len, polled.values())))
            for tp, records in polled.items():
                for record in records:
                    if self.tail is not None and tp.topic == events and record.key is not None:
                        self._first_seen.setdefault(record.key, (tp, record.offset))
                    if record.serialized_value_size > _MAX_RECORD:
                        self.skipped += 1
                        continue
                    self.take(tp.topic, record.value)
            if not self.caught_up.is_set() or until_caught_up:
                done = all(
                    consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp)
                    for tp in tps
                )
                if done:
                    self.caught_up.set()
                    if until_caught_up:
                        return
            if not tps:
                self.caught_up.set()
                if until_caught_up:
                    return
                self._stop.wait(2.0)
                return  # look again for the topics
