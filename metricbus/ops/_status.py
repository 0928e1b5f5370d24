"""``metricbus status``: runs, consumer groups, dead letters and local spools, in one snapshot.

The same snapshot feeds the dashboard's pipeline page and its Prometheus gauges. A
:class:`StatusWatch` keeps a sliding window of lag samples so consumer statuses are judged
on a window (see :mod:`metricbus.ops._lag`), as Burrow does.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metricbus.ops._board import RunBoard
from metricbus.ops._lag import STATUSES, GroupSample, LagProbe, evaluate
from metricbus.producers import pending_spools, spool_in_use, unsent_bytes
from metricbus.schemas import ONE_SHOT_POLL_MS, BrokerError, Settings, printable, topic_reader

#: Dead letters read for the top reasons (the count covers the whole topic).
DEAD_LETTERS_READ = 10_000


class StatusWatch:
    """Lag samples of every group over a sliding window; one :meth:`sample` per call."""

    def __init__(self, settings: Settings, window: int = 10, stop_after_s: float = 30.0) -> None:
        self.settings = settings
        self.probe = LagProbe(settings)
        self.stop_after_s = stop_after_s
        self.window: dict[str, collections.deque[GroupSample]] = {}
        self.size = window

    def sample(self) -> list[dict[str, Any]]:
        """Take a sample of every group and return each group's status over the window."""
        for group, sample in self.probe.sample().items():
            self.window.setdefault(group, collections.deque(maxlen=self.size)).append(sample)
        latest = max((d[-1].at for d in self.window.values()), default=0.0)
        for group in [g for g, d in self.window.items() if latest - d[-1].at > 600]:
            del self.window[group]  # a group gone for ten minutes (deleted, or a renamed consumer)
        return [
            evaluate(list(samples), self.stop_after_s).to_dict() for _, samples in sorted(self.window.items())
        ]

    def close(self) -> None:
        self.probe.close()


def dead_letters(settings: Settings, timeout_s: float = 5.0, reader: Any = None) -> dict[str, Any]:
    """Count of the dead-letter topic, and the top reasons and consumers of its last records.

    ``reader``: a connected topic reader to read with (a lag probe's: ``status`` connects
    once), left open; else one of its own, closed here.
    """
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    topic = settings.topics.deadletter
    try:
        consumer = reader or topic_reader(
            settings, "metricbus-status", request_timeout_ms=max(6000, int(timeout_s * 1000))
        )
    except (KafkaError, OSError) as exc:
        return {"count": None, "error": str(exc), "reasons": [], "consumers": {}}
    try:
        deadline = time.monotonic() + timeout_s
        known = consumer.partitions_for_topic(topic)
        while known is None and time.monotonic() < deadline:  # metadata not fetched yet (a busy broker)
            time.sleep(0.2)
            known = consumer.partitions_for_topic(topic)
        if known is None:  # not "0": nobody could tell
            return {"count": None, "error": f"{topic}: partitions unknown", "reasons": [], "consumers": {}}
        tps = [TopicPartition(topic, p) for p in sorted(known)]
        if not tps:
            return {"count": 0, "reasons": [], "consumers": {}}
        starts = consumer.beginning_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        reasons: collections.Counter[str] = collections.Counter()
        consumers: collections.Counter[str] = collections.Counter()
        read = 0
        ends: dict[Any, int] = {}
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=ONE_SHOT_POLL_MS).values():
                for r in records:
                    read += 1
                    headers = {k: v for k, v in (r.headers or [])}
                    reason = headers.get("metricbus.reason", b"(no reason given)").decode("utf-8", "replace")
                    reasons[_reason_kind(reason)] += 1
                    consumers[headers.get("metricbus.consumer", b"?").decode("utf-8", "replace")[:200]] += 1
            for tp in tps:
                high = consumer.highwater(tp)
                if high is not None:
                    ends[tp] = high
            if len(ends) == len(tps) and all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            if read >= DEAD_LETTERS_READ:
                break
        if len(ends) < len(tps):  # no fetch answered for some partition in time: its end unknown
            return {
                "count": None,
                "error": f"{topic}: end unknown after {timeout_s:.0f} s",
                "reasons": [],
                "consumers": {},
            }
        count = sum(ends[tp] - starts[tp] for tp in tps)
        return {
            "count": count,
            "read": read,
            "reasons": [{"reason": r, "count": n} for r, n in reasons.most_common(5)],
            "consumers": dict(consumers.most_common(10)),
        }
    except (KafkaError, OSError) as exc:
        return {"count": None, "error": str(exc), "reasons": [], "consumers": {}}
    finally:
        if reader is None:
            consumer.close()


def _reason_kind(reason: str) -> str:
    """A reason without its specifics (offsets, values), so alike ones count together."""
    head = reason.split(":", 1)[0] if ":" in reason[:80] else reason
    return head[:120]


def spools(settings: Settings) -> list[dict[str, Any]]:
    """Spool files on this machine with records not yet published."""
    out = []
    for path in pending_spools(settings.spool_dir):
        out.append(
            {
                "run_id": path.parent.name,
                "path": str(path),
                "unsent_bytes": unsent_bytes(path),
                "live": spool_in_use(path),
            }
        )
    return out


def catching_up(settings: Settings) -> list[dict[str, Any]]:
    """Sink groups a planned broker restart left behind, with the runs each still reads from the archive."""
    if not (Path(settings.data_dir) / "catchup").is_dir():
        return []  # none here: and the sinks' package (pyarrow) is a second to import
    from metricbus.sinks._catchup import pending_groups, pending_runs

    return [
        {"group": group, "runs": sorted(pending_runs(settings, group))}
        for group in sorted(pending_groups(settings))
    ]


def snapshot(
    settings: Settings, board: RunBoard, groups: list[dict[str, Any]], deadletters: dict[str, Any]
) -> dict[str, Any]:
    """The whole status as one JSON-ready dict; ``healthy`` is False when a group is STOP or ERR."""
    worst = max((STATUSES.index(g["status"]) for g in groups), default=0)
    return {
        "at": round(time.time(), 3),
        "kafka": settings.bootstrap_servers,
        "topic_prefix": settings.topic_prefix,
        "healthy": worst < STATUSES.index("STOP"),
        "error": None,
        "runs": board.runs_table(),
        "groups": groups,
        "dead_letters": deadletters,
        "spools": spools(settings),
        "catching_up": catching_up(settings),
        "board": {"records": board.records, "skipped": board.skipped, "error": board.error},
    }


def ask_dashboard(url: str, path: str, timeout_s: float) -> Any:
    """The JSON the running stack's dashboard at ``url`` answers for ``path``; None if it does not.

    None for anything but a 200 with JSON (not running, a token it wants, a 404, a timeout):
    the caller then works it out itself.
    """
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/" + path, timeout=timeout_s) as response:  # noqa: S310 - the stack's own
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def from_dashboard(settings: Settings, url: str, timeout_s: float = 1.0) -> dict[str, Any] | None:
    """The status as the running dashboard sees it now (its sampler keeps a window of lag samples).

    Answers at once where :func:`collect` samples twice a window apart; None when the dashboard
    does not answer, or has not sampled the groups yet (the caller then samples itself).
    """
    seen = ask_dashboard(url, "api/status", timeout_s)
    if not isinstance(seen, dict):
        return None
    pipeline = seen.get("pipeline") or {}
    groups = pipeline.get("groups")
    if not groups or pipeline.get("error"):
        return None
    worst = max((STATUSES.index(g["status"]) for g in groups if g["status"] in STATUSES), default=0)
    return {
        "at": seen.get("at", round(time.time(), 3)),
        "kafka": settings.bootstrap_servers,
        "topic_prefix": settings.topic_prefix,
        "healthy": worst < STATUSES.index("STOP"),
        "error": None,
        "source": f"the dashboard at {url}",
        "runs": [r for r in seen.get("runs", []) if not r.get("archived")],
        "groups": groups,
        "dead_letters": pipeline.get("dead_letters", {}),
        "spools": spools(settings),
        "catching_up": pipeline.get("catching_up", []),
        "board": seen.get("board", {}),
    }


def kafka_down(groups: list[dict[str, Any]]) -> str | None:
    """Why Kafka could not be asked, from :meth:`StatusWatch.sample`'s statuses; None if it answered.

    The probe says so in one ERR row with no group.
    """
    return next((g["reason"] for g in groups if g["group"] == "" and g["status"] == "ERR"), None)


def unreachable(settings: Settings, error: str) -> dict[str, Any]:
    """What status can say while Kafka cannot be reached: the reason, and what is kept here.

    The local spools are what matters then: the runs' events wait there until the broker is
    back (a planned restart under ``metricbus up``) or ``metricbus sync`` publishes them.
    """
    return {
        "at": round(time.time(), 3),
        "kafka": settings.bootstrap_servers,
        "topic_prefix": settings.topic_prefix,
        "healthy": False,
        "error": error,
        "runs": [],
        "groups": [],
        "dead_letters": {"count": None, "error": "Kafka unreachable"},
        "spools": spools(settings),
        "catching_up": catching_up(settings),
        "board": {"records": 0, "skipped": 0, "error": error},
    }


#: records of each partition ``status`` reads for its runs table (the most recent): a long topic
#: would take seconds a million events, and what is live is at its end
STATUS_TAIL = 50


class _Reading:
    """``read()`` run on a daemon thread from now; :meth:`result` waits for what it returned."""

    def __init__(self, read: Callable[[], RunBoard]) -> None:
        self._read = read
        self._board: RunBoard | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="metricbus-status-runs", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._board = self._read()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            self._error = exc

    def result(self) -> RunBoard:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._board is not None
        return self._board


def collect(
    settings: Settings, window_s: float = 0.0, stop_after_s: float = 30.0, since_s: float | None = None
) -> dict[str, Any]:
    """One status: a lag sample of every group, the runs, then the dead letters, the spools.

    With ``window_s``, a second lag sample that far apart gives each group's commit rate.

    Raises BrokerError when Kafka cannot be reached (``status`` then exits 2 with the reason).
    """
    from kafka.errors import KafkaError

    # the runs table is read on a thread of its own while the groups are sampled: both wait on
    # the broker more than they compute
    reading = _Reading(RunBoard(settings, since_s=since_s, light=True, tail=STATUS_TAIL).read_once)
    watch = StatusWatch(settings, window=2, stop_after_s=stop_after_s)
    try:
        groups = watch.sample()
        down = kafka_down(groups)
        if down:
            raise BrokerError(f"cannot reach Kafka at {settings.bootstrap_servers}: {down}")
        started = time.monotonic()
        try:
            board = reading.result()
        except KafkaError as exc:
            raise BrokerError(f"cannot read the topics on {settings.bootstrap_servers}: {exc}") from exc
        if window_s > 0:
            time.sleep(max(0.0, window_s - (time.monotonic() - started)))
            groups = watch.sample()
        # after the commits just read: a consumer commits past a record only once its dead
        # letter is acknowledged, so every dead letter of what the groups show as read is counted
        deadletters = dead_letters(settings, reader=watch.probe.reader())
        mark_failing(groups, sink_failures(settings))
    finally:
        watch.close()
    return snapshot(settings, board, groups, deadletters)


def _rate(per_s: float | None) -> str:
    """A group's commit rate; '-' from one sample (``--window S`` measures it)."""
    return "-" if per_s is None else f"{per_s:.1f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def format_status(snap: dict[str, Any]) -> str:
    """The snapshot for a terminal: runs, groups, dead letters, spools."""
    lines = [
        f"metricbus status  kafka {snap['kafka']}  prefix {snap['topic_prefix']}  "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(snap['at']))}"
        + (f"  (as {snap['source']} sees it)" if snap.get("source") else ""),
        "",
        "RUNS",
    ]
    runs = snap["runs"]
    if snap.get("error"):
        lines[1:1] = ["", f"KAFKA UNREACHABLE: {snap['error']}"]
        lines.append("  unknown while Kafka cannot be reached")
    elif not runs:
        lines.append("  no runs on the topics")
    else:
        lines.append(
            f"  {'RUN':<28} {'PROJECT':<16} {'NAME':<18} {'STATE':<9} {'RANKS':>5} {'STEP':>8} "
            f"{'EV/S':>7} {'LAST':>6}  ALERTS"
        )
        for r in runs:
            step = "-" if r["last_step"] is None else str(r["last_step"])
            lines.append(
                # '-': its RunStarted was not found (see metricbus.ops._run_starts)
                f"  {_cut(r['run_id'], 28):<28} {_cut(r['project'] or '-', 16):<16} "
                f"{_cut(r['name'] or '-', 18):<18} "
                f"{r['state']:<9} {len(r['ranks']):>5} {step:>8} {r['events_per_s']:>7.1f} "
                f"{_age(r['since_last_event_s']):>6}  {', '.join(r['firing']) or '-'}"
            )
    lines += ["", "CONSUMER GROUPS"]
    if not snap["groups"]:
        lines.append("  unknown" if snap.get("error") else "  no consumer groups yet")
    for g in snap["groups"]:
        lines.append(
            f"  {_cut(g['group'], 40):<40} {g['status']:<5} lag {g['lag']:>7} records "
            f"{_age(g['lag_s'] if g['lag'] else None):>6}  {_rate(g['commit_rate']):>8} rec/s  {g['reason']}"
        )
    for c in snap.get("catching_up", []):
        runs = ", ".join(_cut(r, 28) for r in c["runs"][:3]) + (", ..." if len(c["runs"]) > 3 else "")
        lines.append(
            f"  {_cut(c['group'], 40):<40} left behind by a planned broker restart: catching up on "
            f"{len(c['runs'])} run(s) from the archive ({runs})"
        )
    dl = snap["dead_letters"]
    lines += ["", "DEAD LETTERS"]
    if dl.get("count") is None:
        lines.append(f"  cannot read: {dl.get('error')}")
    else:
        lines.append(f"  {dl['count']} record(s)")
        for r in dl["reasons"]:
            lines.append(f"  {r['count']:>7}  {r['reason']}")
    lines += ["", "LOCAL SPOOLS"]
    if not snap["spools"]:
        lines.append("  nothing waiting to be published")
    for s in snap["spools"]:
        owner = "live run, publishing" if s["live"] else "`metricbus sync` publishes it"
        lines.append(f"  {s['run_id']}: {s['unsent_bytes']} bytes unsent ({owner})")
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    text = printable(text)
    return text if len(text) <= width else text[: width - 1] + "…"


#: the counters of a consumer that say its destination is refusing (see SinkStats)
FAILURE_COUNTERS = {
    "flush_failures": "flush(es) failed",
    "unavailable": "time(s) its destination took nothing",
}


def sink_failures(settings: Settings) -> dict[str, dict[str, int]]:
    """Per consumer group: ``failing`` (1 while a live process of it is refused), and counts.

    The counts: its flush failures and unavailable so far. From the metrics files every
    process of `metricbus up` shares (``PROMETHEUS_MULTIPROC_DIR``, by default
    ``<data dir>/prometheus``); {} where there are none.
    """
    from metricbus.schemas import multiprocess_dir

    shared = multiprocess_dir() or str(Path(settings.data_dir) / "prometheus")
    if not os.path.isdir(shared):
        return {}
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=shared)
    names = {f"metricbus_consumer_{c}_total": c for c in FAILURE_COUNTERS}
    names["metricbus_consumer_failing"] = "failing"
    out: dict[str, dict[str, int]] = {}
    for family in registry.collect():
        for sample in family.samples:
            counter = names.get(sample.name)
            if counter is not None:
                group = out.setdefault(sample.labels.get("group", "?"), {"failing": 0})
                group[counter] = max(group.get(counter, 0), int(sample.value))
    return out


def mark_failing(groups: list[dict[str, Any]], failures: dict[str, dict[str, int]]) -> None:
    """A group refused now (a full disk, a destination that takes nothing) says so first.

    Its status is at least WARN then: a sink whose disk is full has not fallen behind yet when
    its flushes start failing.
    """
    for g in groups:
        seen = failures.get(g["group"], {})
        if not seen.get("failing"):
            continue
        counts = ", ".join(f"{seen[k]} {text}" for k, text in FAILURE_COUNTERS.items() if seen.get(k))
        g["failing"] = counts or "refused"
        g["reason"] = f"FAILING now ({g['failing']} so far; its log says why); {g['reason']}"
        if STATUSES.index(g["status"]) < STATUSES.index("WARN"):
            g["status"] = "WARN"
