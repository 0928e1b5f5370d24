"""A planned restart of the embedded broker, to bound its memory (``broker_max_mb``).

The embedded broker keeps every record ever produced in memory (no retention, no
DeleteRecords). Past the bound, ``metricbus up`` restarts it empty and carries over what some
consumer has not read. The protocol, step by step, and which collaborator does each:

1. **Watch** (:meth:`PlannedRestart.watch`, every ``MEMORY_CHECK_S``): the broker's resident
   memory against ``broker_max_mb``.
2. **Decide** (:meth:`PlannedRestart.far_behind`): from the consumer groups' commits, whether
   a restart would free at least half the bound and whether every group that had committed
   before the last restart is back on this broker; if not, the restart is put off
   (``MEMORY_RETRY_S``) and the reason said once.
3. **Stop the consumers** (:class:`~metricbus.stack._children.Children`): they flush, commit
   and checkpoint.
4. **Read the carry** (``_restart.Unread``): per partition, from the oldest position any
   consumer still needs (its group's commit; the stream worker's checkpoint) to the end. A sink
   too far behind to carry for is left behind: its runs go on its catch-up list
   (``sinks._catchup``) and it rebuilds them from the archive.
5. **Mark the broker restarting** (``schemas.mark_broker_restarting``): from here each
   producer holds what the broker acknowledges (``producers._sender``) instead of letting
   it go; a last read takes what they saw confirmed before the marker.
6. **Restart the broker**, create the topics, mark it restarting again (producers hold their
   sends to the new broker until the carry is in) and **publish the carry** to the same
   partitions (``_restart.publish``).
7. **Resume the groups** (``_restart.resume_at`` / ``commit``): each group that is back gets
   committed where it had read to on the new broker's offsets; the stream checkpoints are
   rebased on them (``stream_jobs.rebase``).
8. **Mark carried over** (``schemas.mark_carried_over``): producers send again only what was
   acknowledged after their last check (without the marker, their whole last minute).
9. **Unmark restarting and start the consumers**: producers send to the new broker; consumers
   drop what they already hold by its identity; the next restart waits (``GROUPS_BACK_S`` at
   most) for every group to commit here.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from metricbus.schemas import (
    MetricbusError,
    Settings,
    count_restart,
    ensure_topics,
    mark_broker_restarting,
    mark_carried_over,
    unmark_broker_restarting,
)
from metricbus.stack import _restart as carrying
from metricbus.stack._broker import EmbeddedBroker
from metricbus.stack._children import Children

if TYPE_CHECKING:
    from metricbus.ops._lag import PartitionLag

log = logging.getLogger("metricbus.up")
#: Seconds between looks at the embedded broker's memory.
MEMORY_CHECK_S = 10.0
#: Seconds before a put-off planned restart is tried again.
MEMORY_RETRY_S = 60.0
#: After a planned restart, the next waits until every group that had committed before it
#: has committed on the new broker (its consumer is back), for at most this long: a group
#: whose consumer is gone for good (a one-off alerts consumer) does not hold it forever.
GROUPS_BACK_S = 300.0

Positions = dict[str, list["PartitionLag"]]


def _commits(lags: list[PartitionLag]) -> dict[tuple[str, int], int | None]:
    """A group's committed offset per (topic, partition)."""
    return {(lag.topic, lag.partition): lag.committed for lag in lags}


class PlannedRestart:
    """Watches the embedded broker's memory and restarts it, carrying what is unread."""

    def __init__(
        self, settings: Settings, broker: EmbeddedBroker, children: Children, report: Callable[[str], None]
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.children = children
        self.report = report
        self.restarts = 0  #: planned restarts done
        self.rss_mb = 0.0  #: the broker's resident memory at the last look
        self._next_check = 0.0
        self._retry_at = 0.0
        self._said = ""  #: the last put-off reason said, its numbers aside
        #: the groups that had committed before the last restart, and until when the next
        #: waits for them to commit on the new broker
        self.groups_before: set[str] = set()
        self.groups_wait_until = 0.0
        #: per group, the positions the last restart committed for it on the new broker
        self.recommitted: dict[str, dict[tuple[str, int], int]] = {}

    # -- 1, 2: watch and decide -------------------------------------------------------------

    def watch(self, now: float) -> None:
        """Restart the broker past ``broker_max_mb`` of resident memory, unless it must wait."""
        limit = self.settings.broker_max_mb
        proc = self.broker.proc
        if not limit or now < self._next_check or proc is None:
            return
        self._next_check = now + MEMORY_CHECK_S
        try:
            rss = psutil.Process(proc.pid).memory_info().rss / 1e6
        except psutil.Error:
            return
        self.rss_mb = rss
        if rss <= limit:
            self._said = ""
            return
        if now < self._retry_at:
            return
        behind = self.far_behind(rss)
        if behind:
            self.put_off(rss, behind, now)
            return
        self.restart(rss, now)

    def put_off(self, rss_mb: float, why: str, now: float) -> None:
        """Say why the restart waits: once per reason (its numbers aside), so a change of reason shows."""
        self._retry_at = now + MEMORY_RETRY_S
        reason = re.sub(r"\d+", "#", why)
        if self._said != reason:
            self._said = reason
            self.report(
                f"metricbus up: the embedded broker holds {rss_mb:.0f} MB (over METRICBUS_BROKER_MAX_MB="
                f"{self.settings.broker_max_mb:.0f}); its restart is put off: {why}"
            )

    def far_behind(self, rss_mb: float) -> str:
        """Why a restart now would free little or cannot be planned ('' when it can).

        Judged before the consumers are stopped, from their commits: a restart must free at
        least half of ``broker_max_mb``, and what the slowest consumer has not read (its share
        of the events topic's records, of ``rss_mb``) is carried over. A consumer slower than
        the training jobs thus holds the broker at its backlog plus that half, not at the bound:
        the restarts go on freeing what everyone has read.
        """
        try:
            positions = carrying.committed(self.settings)
        except RuntimeError as exc:
            return f"cannot read the consumer groups ({exc})"
        from metricbus.sinks._catchup import pending_groups

        leavable = self._leavable(positions, pending_groups(self.settings))
        missing = sorted(
            group
            for group in self.groups_before - leavable  # a sink left behind catches up from the archive
            # no commit on the new broker yet, or still the one made there at the restart
            if group not in positions or self.recommitted.get(group) == _commits(positions[group])
        )
        if missing and time.monotonic() < self.groups_wait_until:
            # each would lose what it had not read: the carry goes by the groups' commits
            return f"not every consumer is back on the restarted broker yet ({', '.join(missing)})"
        events = self.settings.topics.events
        leave = self.leave_behind(positions, rss_mb)
        unread, total, behind = carrying.unread_records(positions, events, leave)
        if total and not self._frees(rss_mb)(unread, total):
            slowest = max((g for g in behind if g not in leave), key=lambda g: behind[g])
            return (
                f"the consumers have {unread} of the {total} records of {events} still to read, "
                f"most of them {slowest} ({behind[slowest]}): a restart would free little (a consumer "
                "that stays this far behind is slower than the training jobs: `up --sink-instances N` "
                "shares each sink's partitions among N processes, given the cores)"
            )
        return ""

    def _frees(self, rss_mb: float) -> Callable[[int, int], bool]:
        """Whether a restart would free half the bound, carrying ``unread`` of the ``total`` records."""
        half = self.settings.broker_max_mb / 2
        return lambda unread, total: not total or rss_mb * (1 - unread / total) >= half

    def _leavable(self, positions: Positions, pending: set[str]) -> set[str]:
        """The groups a planned restart may leave behind: sinks, while the archive sink runs.

        What a group left behind had not read is below every other group's commit, so below
        the archive sink's, which commits only what it flushed: the archive holds it.
        """
        from metricbus.sinks import ParquetArchive

        prefix = self.settings.groups.sink_prefix
        archive = self.settings.groups.sink(ParquetArchive.name)
        if archive not in positions:
            return set()
        groups = set(positions) | self.groups_before | pending
        return {g for g in groups if g.startswith(prefix) and g != archive}

    def leave_behind(self, positions: Positions, rss_mb: float) -> set[str]:
        """The sink groups the next restart leaves behind to catch up from the archive.

        Those not back since the last restart, or still catching up; then, while a restart
        would free too little, the one furthest behind (``_restart.leave_behind``).
        """
        from metricbus.sinks._catchup import pending_groups

        pending = pending_groups(self.settings)
        leavable = self._leavable(positions, pending)
        must = {
            g
            for g in leavable
            if g in pending or g not in positions or self.recommitted.get(g) == _commits(positions[g])
        }
        return carrying.leave_behind(
            positions, self.settings.topics.events, leavable, must, self._frees(rss_mb)
        )

    # -- 3 to 9: the restart ----------------------------------------------------------------

    def restart(self, rss_mb: float, now: float) -> None:
        """Restart the broker empty, carrying over what the consumers have not read.

        The consumers stop first (they flush, commit and checkpoint); the records any of them
        still needs are read, the broker restarts, they are published again, the stream
        checkpoints are rebased on the new topic, and the consumers start again.
        """
        from metricbus.stream_jobs import checkpoint_dir, group_id, offsets, rebase

        limit = self.settings.broker_max_mb
        self.children.stop_all(each_s=30.0)
        checkpoints = checkpoint_dir(self.settings, group_id(self.settings))
        carry: carrying.Unread | None = None
        why = ""
        groups: set[str] = set()
        leave: set[str] = set()
        try:
            positions = carrying.committed(self.settings)
            groups = set(positions)
            leave = self.leave_behind(positions, rss_mb)
            needed = {g: lags for g, lags in positions.items() if g not in leave}
            carry = carrying.Unread(
                self.settings,
                carrying.oldest_needed(self.settings, offsets(checkpoints), needed),
                _holes(positions, leave),
            )
            carry.read()
        except Exception as exc:  # noqa: BLE001 - no restart without knowing what to carry
            why = f"cannot read what the consumers still need ({exc})"
        records = carry.records if carry is not None else []
        carried = carrying.stored_mb(self.settings, records)
        if rss_mb - carried < limit / 2:  # a restart would free little; the consumers catch up first
            why = f"what the consumers still need would take {carried:.0f} of its {rss_mb:.0f} MB again"
        if why:
            self._said = ""
            self.put_off(rss_mb, why, now)
            self.children.start_all()
            return
        assert carry is not None  # else `why` says why not
        self.report(  # said once it is decided: a restart put off above says so instead
            f"metricbus up: the embedded broker holds {rss_mb:.0f} MB (METRICBUS_BROKER_MAX_MB="
            f"{limit:.0f}): restarting it to free that memory (planned; what some consumer has not "
            "read yet is carried over, consumers drop what they already hold)"
        )
        try:  # from here producers hold what the old broker acknowledges, for the new one
            mark_broker_restarting(self.settings)
            carry.read(passes=1)  # what producers saw confirmed before the marker
        except Exception as exc:  # noqa: BLE001 - the restart goes on: live producers resend their last minute
            log.warning("planned broker restart: the last read before it failed (%s)", exc)
        records = carry.records
        self._left_behind(carry)
        moved: dict[int, int] = {}  # the stream checkpoints' offsets on the new broker
        self.broker.stop()
        try:
            self._start_broker()
            # Producers hold what they send on the new broker too until the carry is in, so that
            # the carry goes before their re-sent last minute: a consumer reads every partition in
            # seq order (in a soak the W&B sink read the re-sent minute, then a carried backlog
            # of 400,000 events, and meanwhile its highest seq stood 400,000 above what it held).
            mark_broker_restarting(self.settings)
            ensure_topics(self.settings)
            placed = carrying.publish(self.settings, records)
            carried_over = True
            moved = self._resume_groups(placed, positions, offsets(checkpoints), leave)
            self._mark_carried_over()
        except Exception as exc:  # noqa: BLE001 - `up` goes on: the consumers start, the broker is watched
            carried_over = False
            self.recommitted = {}
            log.exception("the planned broker restart failed")
            self.report(
                f"metricbus up: the planned broker restart failed ({type(exc).__name__}: {exc}); "
                f"{len(records)} records the consumers had not read may be lost (live training jobs "
                "send their last minute again). The consumers start again; a broker that is not "
                "running is restarted as after a crash."
            )
        if self.broker.proc is not None and self.broker.proc.poll() is None:
            self._unmark_restarting()
        rebased = rebase(checkpoints, moved)  # the old broker is gone either way: its offsets with it
        self.groups_before, self.groups_wait_until = groups, time.monotonic() + GROUPS_BACK_S
        self.children.start_all()
        self.restarts += 1
        self._said = ""
        count_restart("broker (planned)")
        log.warning(
            "planned broker restart %d %s (it held %.0f MB); %d records carried; groups resuming "
            "where they were: %s; stream checkpoints rebased: %s (at %s)",
            self.restarts,
            "done" if carried_over else "failed",
            rss_mb,
            len(records) if carried_over else 0,
            ", ".join(sorted(self.recommitted)) or "none",
            rebased,
            moved or "0",
        )

    def _start_broker(self) -> None:
        for attempt in range(20):  # the port may linger a moment after the old broker exits
            try:
                self.broker.start()
                return
            except MetricbusError:
                if attempt == 19:
                    raise
                time.sleep(0.5)

    def _left_behind(self, carry: carrying.Unread) -> None:
        """Record, for each sink group left behind, the runs it catches up on from the archive."""
        from metricbus.sinks._catchup import add_runs

        for group, runs in sorted(carry.hole_runs.items()):
            try:
                add_runs(self.settings, group, runs)
            except OSError as exc:
                log.error("planned broker restart: %s's catch-up list not written (%s)", group, exc)
                self.report(
                    f"metricbus up: {group} was left behind by the planned broker restart, and the "
                    f"list of runs it catches up on could not be written ({exc}): `metricbus replay` "
                    f"them into it ({', '.join(sorted(runs)[:5])}{', ...' if len(runs) > 5 else ''})"
                )
                continue
            log.warning(
                "planned broker restart: %s left behind; it catches up on %d run(s) from the archive",
                group,
                len(runs),
            )
            self.report(
                f"metricbus up: {group} is left behind by the planned broker restart (gone, or too "
                f"far behind to carry its backlog): it catches up on {len(runs)} run(s) from the archive"
            )

    def _resume_groups(
        self,
        placed: carrying.Placed,
        positions: Positions,
        checkpoints: dict[int, int],
        leave: set[str],
    ) -> dict[int, int]:
        """Commit for each group where it resumes on the new broker; the checkpoints' offsets there.

        A group that had read what another still needed does not read it again (in a soak every
        consumer re-read the slow W&B sink's carried backlog after each restart, the archive
        sink 1.88M duplicates in one process, on a 2-core machine the W&B sink shares). A group
        whose commits are still the ones this made at the last restart is not back: it gets none
        (as on a new broker; when it comes back it reads from the start, dropping what it holds),
        so a consumer gone for good does not hold records across every restart after.
        Nothing is committed when this fails: every group reads from the start.
        """
        back = {
            group: lags
            for group, lags in positions.items()
            if self.recommitted.get(group) != _commits(lags) and group not in leave
        }
        try:
            ends = carrying.end_offsets(self.settings, placed)
            resume = carrying.resume_at(placed, back, ends)
            carrying.commit(self.settings, resume)
        except Exception as exc:  # noqa: BLE001 - the consumers read the new topics whole instead
            log.warning(
                "planned broker restart: the groups' positions on the new broker not committed (%s)", exc
            )
            self.recommitted = {}
            return {}
        self.recommitted = resume
        events = self.settings.topics.events
        moved = {}
        for partition, offset in checkpoints.items():
            key = (events, partition)
            at = placed.position(events, partition, offset, ends[key]) if key in ends else None
            if at is not None:
                moved[partition] = at
        return moved

    def _mark_carried_over(self) -> None:
        """Tell the producers their records up to their last check are on the new broker.

        They then send again only what was acknowledged since (``producers._sender``); without
        the marker, their whole last minute (safe, and every consumer reads it twice).
        """
        try:
            mark_carried_over(self.settings)
        except MetricbusError as exc:
            log.warning("planned broker restart: producers will send their last minute again (%s)", exc)

    def _unmark_restarting(self) -> None:
        """Let the producers send to the restarted broker (they hold while its marker exists)."""
        error: MetricbusError | None = None
        for attempt in range(5):
            try:
                unmark_broker_restarting(self.settings)
                return
            except MetricbusError as exc:
                error = exc
                time.sleep(0.5 * (attempt + 1))
        log.error("planned broker restart: its marker cannot be deleted (%s)", error)
        self.report(
            f"metricbus up: the restarted broker's marker topic {self.settings.topics.restarting} "
            f"cannot be deleted ({error}): live training jobs hold their records until it is gone "
            "(or the broker restarts). Delete it with any Kafka admin tool."
        )


def _holes(positions: Positions, leave: set[str]) -> dict[str, dict[str, dict[int, int]]]:
    """Per group left behind, per topic and partition, where it had read to (none: the start)."""
    holes: dict[str, dict[str, dict[int, int]]] = {g: {} for g in leave}
    for group in leave & set(positions):
        for lag in positions[group]:
            if lag.committed is not None:
                holes[group].setdefault(lag.topic, {})[lag.partition] = lag.committed
    return holes
