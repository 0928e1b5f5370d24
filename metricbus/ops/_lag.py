"""Consumer-group lag in records and in seconds, and a Burrow-style status.

One sample is one round of requests for every group of the prefix at once, as
``kafka-consumer-groups --describe --all-groups`` asks: ListGroups, DescribeGroups (who is a
member), one OffsetFetch for every group's committed offsets, ListOffsets EARLIEST, and Fetch at
the groups' positions. Lag is measured against the high watermark of a Fetch response, never
ListOffsets LATEST: the embedded broker answers that with the last batch's base offset + 1 (a
group at rest would show a lag of -1). Lag in seconds is the age of the oldest record the group
has not consumed (the record at its committed offset), as kafka-lag-exporter reports it. No
consumer group of its own is joined, none is created.

Status per partition, from the last sample and, when there are several, the window of them
(Burrow's rules, adapted to what a broker tells every client: commit timestamps are not among
it, so metricbus's consumers say every few seconds that they run, on the alive topic and in
each committed offset's metadata (the embedded broker keeps no such metadata, and lists a
member that died), and a group's members are asked too):

- OK: no lag in the last sample or in any sample of the window (records just arrived), or
  the group commits and its lag does not grow;
- SLOW: records wait, and a consumer of the group said it runs within
  ``stop_after_s``: it runs, however slowly it consumes (a slow destination); with a window,
  its commit rate is said beside the lag;
- WARN: the group commits, but its lag grew in every interval of the window;
- STALL: the committed offset did not move over the window while records wait;
- STOP: records have waited longer than ``stop_after_s`` and nothing says a consumer runs (no
  alive stamp that recent, or a group with no member): nobody consumes, the process is down
  or stuck for that long;
- ERR: the offsets cannot be read, or one is past the end of its log (the topic was
  re-created under the group, as after a restart of the memory-only embedded broker).

A group's status is its worst partition's.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from metricbus.schemas import (
    ONE_SHOT_FETCH_WAIT_MS,
    ONE_SHOT_POLL_MS,
    Settings,
    alive_at,
    make_admin,
    reach,
    topic_reader,
)

log = logging.getLogger("metricbus.lag")

#: the newest records of the alive topic a sample reads: a stamp of each consumer every 5 s,
#: so several minutes of a stack's consumers
STAMPS_READ = 500

#: Order of badness, for a group's status (its worst partition's).
STATUSES = ("OK", "SLOW", "WARN", "STALL", "STOP", "ERR")


@dataclasses.dataclass(frozen=True)
class PartitionLag:
    """One partition of one group at one moment."""

    topic: str
    partition: int
    committed: int | None  #: None: the group never committed here (it starts at the log start)
    end: int  #: high watermark
    lag: int  #: records not yet consumed
    lag_s: float | None  #: age of the oldest of them (None when there are none, or unknown)


@dataclasses.dataclass
class GroupSample:
    """Every partition of one group at time ``at`` (epoch seconds)."""

    group: str
    at: float
    partitions: dict[tuple[str, int], PartitionLag]
    error: str | None = None
    members: int | None = None  #: the group's members (processes in it); None: not known
    #: seconds since one of its consumers last committed an alive stamp; None: none does
    alive_s: float | None = None

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions.values())

    @property
    def lag_s(self) -> float:
        return max((p.lag_s or 0.0 for p in self.partitions.values()), default=0.0)


@dataclasses.dataclass(frozen=True)
class GroupStatus:
    """A group's verdict over a window of samples."""

    group: str
    status: str
    reason: str
    lag: int
    lag_s: float
    #: records committed per second over the window; None from one sample (not measured)
    commit_rate: float | None
    partitions: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evaluate(samples: Sequence[GroupSample], stop_after_s: float = 30.0) -> GroupStatus:
    """The Burrow-style status of one group from its samples, oldest first (at least one)."""
    last = samples[-1]
    first = samples[0]
    span = max(last.at - first.at, 1e-9)
    moved_total = 0
    verdicts: list[tuple[str, str, PartitionLag]] = []
    for key, part in sorted(last.partitions.items()):
        history = [s.partitions[key] for s in samples if key in s.partitions]
        before = history[0]
        if before.committed is not None and part.committed is not None:
            moved_total += max(0, part.committed - before.committed)
        alive = last.alive_s is not None and last.alive_s <= stop_after_s
        verdicts.append((*_partition_status(history, stop_after_s, last.members, alive), part))
    if last.error is not None:
        worst, reason = "ERR", last.error
    elif not verdicts:
        worst, reason = "OK", "no committed offsets yet"
    else:
        worst, reason, _ = max(verdicts, key=lambda v: STATUSES.index(v[0]))
        if worst == "OK":
            reason = "caught up" if last.lag == 0 else f"consuming, {last.lag} records behind"
        rate = moved_total / span if len(samples) > 1 else None
        if worst == "SLOW":
            oldest = f", the oldest for {last.lag_s:.0f}s" if last.lag_s else ""
            committing = f", committing {rate:.1f} records/s" if rate is not None else ""
            seen = f"alive {last.alive_s:.0f}s ago" if last.alive_s is not None else "alive"
            reason = f"consuming ({seen}); {last.lag} records behind{oldest}{committing}"
    return GroupStatus(
        group=last.group,
        status=worst,
        reason=reason,
        lag=last.lag,
        lag_s=round(last.lag_s, 3),
        commit_rate=round(moved_total / span, 3) if len(samples) > 1 else None,
        partitions=[
            {**dataclasses.asdict(p), "status": s, "reason": r}
            for s, r, p in sorted(verdicts, key=lambda v: (v[2].topic, v[2].partition))
        ],
    )


def _partition_status(
    history: list[PartitionLag], stop_after_s: float, members: int | None, alive: bool
) -> tuple[str, str]:
    """One partition's verdict over its samples, oldest first.

    ``members``: the group's, if known (0: nobody consumes); ``alive``: one of its consumers
    committed an alive stamp within ``stop_after_s`` (it runs, however slowly it consumes).
    """
    last = history[-1]
    where = f"{last.topic}[{last.partition}]"
    if last.committed is not None and last.committed > last.end:
        return "ERR", (
            f"{where}: committed offset {last.committed} is past the end of the log ({last.end}); "
            "the topic was re-created under the group"
        )
    if last.lag <= 0:
        return "OK", f"{where}: caught up"
    moved = last.committed != history[0].committed
    age = last.lag_s or 0.0
    runs = alive and members != 0  # it says it runs: behind, however slowly it commits
    if not moved and not runs and age > stop_after_s:
        who = "the group has no member" if members == 0 else "the committed offset does not move"
        waited = f"{last.lag} records wait, the oldest for {age:.0f}s"
        return "STOP", f"{where}: {waited}, and {who}: nothing consumes"
    if any(h.lag <= 0 for h in history):  # caught up within the window: records just arrived
        return "OK", f"{where}: {last.lag} behind, caught up within the window"
    if moved:
        lags = [h.lag for h in history]
        if len(lags) > 1 and all(b > a for a, b in zip(lags, lags[1:], strict=False)):
            return "WARN", f"{where}: consuming, but the lag grew in every sample ({lags[0]} -> {lags[-1]})"
        return "OK", f"{where}: consuming ({last.lag} behind)"
    if runs:
        return "SLOW", f"{where}: {last.lag} behind, its consumer alive"
    if len(history) < 2:
        return "OK", f"{where}: {last.lag} behind"
    return "STALL", f"{where}: {last.lag} records wait and the committed offset did not move"


class LagProbe:
    """Samples every consumer group of a topic prefix (kafka-python clients, no group of its own)."""

    def __init__(self, settings: Settings, timeout_s: float = 5.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._admin: Any = None
        self._consumer: Any = None

    def _clients(self) -> tuple[Any, Any]:
        if self._admin is None:
            reach(self.settings)  # nothing listening: said now, not after kafka-python's 25 s
            ms = int(self.timeout_s * 1000)
            self._admin = make_admin(self.settings, "metricbus-status", self.timeout_s)
            # only the first record at each position is needed (its timestamp): brokers
            # return at least the first batch however small the limit (KIP-74), so a
            # sample of a group far behind does not pull megabytes of its backlog
            self._consumer = topic_reader(
                self.settings,
                "metricbus-status",
                request_timeout_ms=max(ms, 6000),
                max_partition_fetch_bytes=64 * 1024,
                fetch_max_bytes=1024 * 1024,
                fetch_max_wait_ms=ONE_SHOT_FETCH_WAIT_MS,  # a partition at its end answers now
            )
        return self._admin, self._consumer

    def reader(self) -> Any:
        """The probe's topic reader (no group; closed by :meth:`close`), for others to read with."""
        return self._clients()[1]

    def close(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - closing a broken client must not hide the result
                    log.debug("closing a status client failed", exc_info=True)
        self._admin = self._consumer = None

    def groups(self) -> list[str]:
        """The groups of this prefix (the worker's, each sink's, each alert consumer's)."""
        admin, _ = self._clients()
        prefix = self.settings.topic_prefix
        return sorted(g["group_id"] for g in admin.list_groups() if g["group_id"].startswith(prefix))

    def sample(self, groups: Sequence[str] | None = None) -> dict[str, GroupSample]:
        """One sample of every group, in one round of requests for them all (see the module).

        Errors become samples with ``error`` set; this never raises.
        """
        from kafka.errors import KafkaError

        try:
            names = list(groups) if groups is not None else self.groups()
        except (KafkaError, OSError) as exc:
            self.close()
            now = time.time()
            return {"": GroupSample("", now, {}, error=f"cannot list consumer groups: {exc}")}
        if not names:
            return {}
        try:
            return self._sample_all(names)
        except (KafkaError, OSError, ValueError) as exc:
            self.close()
            now = time.time()
            return {g: GroupSample(g, now, {}, error=f"cannot read offsets: {exc}") for g in names}

    def _sample_all(self, names: list[str]) -> dict[str, GroupSample]:
        from kafka import TopicPartition

        admin, consumer = self._clients()
        offsets = _group_offsets(admin, names)
        committed = {
            group: {
                (tp.topic, tp.partition): meta.offset
                for tp, meta in found.items()
                if meta is not None and meta.offset is not None and meta.offset >= 0
            }
            for group, found in offsets.items()
        }
        stamped = self._stamps(consumer)
        alive = {  # when each group's consumers last said they were alive: a commit's metadata, a stamp
            group: max(
                filter(None, [stamped.get(group), *(alive_at(m.metadata) for m in found.values() if m)]),
                default=None,
            )
            for group, found in offsets.items()
        }
        members = group_members(admin, names)
        topics = sorted({t for offsets in committed.values() for t, _ in offsets})
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        starts = consumer.beginning_offsets(tps) if tps else {}
        # a group's partitions: every partition of each topic it committed on (one it has not
        # committed on yet waits from the start), and none of the topics only others read
        positions = {
            group: {
                tp: mine.get((tp.topic, tp.partition), starts.get(tp, 0))
                for tp in tps
                if tp.topic in {t for t, _ in mine}
            }
            for group, mine in committed.items()
            if mine
        }
        # a Fetch at every distinct position of each partition: a round per layer of them
        wanted = {tp: sorted({pos[tp] for pos in positions.values() if tp in pos}) for tp in tps}
        ends: dict[Any, int] = {}
        oldest: dict[tuple[Any, int], int] = {}
        for layer in range(max((len(v) for v in wanted.values()), default=0)):
            at = {tp: v[layer] for tp, v in wanted.items() if layer < len(v)}
            found_ends, found_oldest = self._fetch_at(consumer, at)
            ends.update(found_ends)
            oldest.update({(tp, at[tp]): ts for tp, ts in found_oldest.items()})
        now = time.time()
        out = {}
        for group in names:
            parts = {}
            for tp, pos in positions.get(group, {}).items():
                end = ends.get(tp, pos)
                ts = oldest.get((tp, pos))
                lag = max(0, end - pos)
                parts[(tp.topic, tp.partition)] = PartitionLag(
                    topic=tp.topic,
                    partition=tp.partition,
                    committed=committed[group].get((tp.topic, tp.partition)),
                    end=end,
                    lag=lag,
                    lag_s=round(max(0.0, now - ts / 1000), 3) if lag and ts is not None else None,
                )
            seen = alive.get(group)
            alive_s = round(max(0.0, now - seen), 3) if seen is not None else None
            out[group] = GroupSample(group, now, parts, members=members.get(group), alive_s=alive_s)
        return out

    def _stamps(self, consumer: Any) -> dict[str, float]:
        """When each group last said it runs (epoch seconds), from the alive topic's newest records.

        Empty when the topic cannot be read (a broker set up before it existed).
        """
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        tp = TopicPartition(self.settings.topics.alive, 0)
        found: dict[str, float] = {}
        try:
            start, end = consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
            if end <= start:
                return found
            consumer.assign([tp])
            consumer.seek(tp, max(start, end - STAMPS_READ))
            deadline = time.monotonic() + self.timeout_s
            while consumer.position(tp) < end and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=ONE_SHOT_POLL_MS).get(tp, []):
                    group = (record.key or b"").decode("utf-8", "replace")
                    at = alive_at((record.value or b"").decode("utf-8", "replace"))
                    if at is not None and at > found.get(group, 0.0):
                        found[group] = at
        except (KafkaError, KeyError) as exc:
            log.debug("cannot read the alive stamps (%s)", exc)
        return found

    def ends(self, at: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """The high watermark of each (topic, partition) of ``at``, from a Fetch at its offset."""
        from kafka import TopicPartition

        _, consumer = self._clients()
        found, _ = self._fetch_at(consumer, {TopicPartition(t, p): offset for (t, p), offset in at.items()})
        return {(tp.topic, tp.partition): end for tp, end in found.items()}

    def _fetch_at(self, consumer: Any, positions: dict[Any, int]) -> tuple[dict[Any, int], dict[Any, int]]:
        """Fetch at each position: the high watermark and the timestamp of the first record."""
        if not positions:
            return {}, {}
        consumer.assign(list(positions))
        for tp, pos in positions.items():
            consumer.seek(tp, pos)
        ends: dict[Any, int] = {}
        oldest: dict[Any, int] = {}
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            # a poll that brings no record waits out its whole timeout: the ends come with the
            # first fetch answer (the reader waits 10 ms at a partition's end), so look often
            for tp, records in consumer.poll(timeout_ms=ONE_SHOT_POLL_MS, update_offsets=False).items():
                if records and tp not in oldest:
                    oldest[tp] = records[0].timestamp
            for tp in positions:
                high = consumer.highwater(tp)
                if high is not None:
                    ends[tp] = high
            if all(tp in ends and (ends[tp] <= pos or tp in oldest) for tp, pos in positions.items()):
                break
            for tp, pos in positions.items():  # poll moves positions only where records came
                if tp not in oldest:
                    consumer.seek(tp, pos)
        return ends, oldest


def _group_offsets(admin: Any, groups: list[str]) -> dict[str, dict[Any, Any]]:
    """Every group's committed offsets: one OffsetFetch for them all (Kafka 3.0+), else one each."""
    from kafka.errors import UnsupportedVersionError

    try:
        return dict(admin.list_group_offsets(list(groups)))
    except UnsupportedVersionError:
        return {g: admin.list_group_offsets({g: None}).get(g, {}) for g in groups}


def group_members(admin: Any, groups: list[str]) -> dict[str, int | None]:
    """How many members each group has now (DescribeGroups, one request per coordinator).

    kafka-python 3.0.12's ``describe_groups`` always asks for the groups' authorized operations
    and cannot read the embedded broker's answer to that: the request is sent here without it,
    on the admin client's own connections. A group it cannot describe is left out (unknown).
    """
    from kafka.protocol.admin import DescribeGroupsRequest

    async def describe() -> dict[str, int | None]:
        found: dict[str, int | None] = {}
        coordinators: dict[int, list[str]] = {}
        for group, node in (await admin._find_coordinator_ids(groups)).items():  # noqa: SLF001
            coordinators.setdefault(node, []).append(group)
        for node, mine in coordinators.items():
            ask = DescribeGroupsRequest(groups=mine, include_authorized_operations=False, max_version=4)
            answer = await admin._manager.send(ask, node_id=node)  # noqa: SLF001
            for g in answer.groups:
                found[g.group_id] = None if g.error_code else len(g.members)
        return found

    try:
        return dict(admin._manager.run(describe))  # noqa: SLF001
    except Exception as exc:  # noqa: BLE001 - membership is extra: without it, the window decides
        log.debug("cannot describe the consumer groups (%s)", exc)
        return {}
