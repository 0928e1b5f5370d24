"""The sink consumer runtime: poll, decode, deduplicate, write, flush, then commit.

One consumer group per sink. Offsets are committed only after the sink's flush returned
(durable), so a crash re-delivers at most what was not yet durable; the events' identities
then drop what the sink already held: ``(producer_id, seq)`` for logged events, ``(run,
seq)`` for derived ones (see ``schemas.decode_aggregates``). No single record stops a sink:
one that cannot be decoded, or an event the sink's library rejects, goes to the dead-letter
topic with the reason in its headers, is counted and logged, and the sink goes on. A failing
flush is retried with backoff, consuming nothing meanwhile; nothing is committed past data
not yet durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from metricbus.schemas import (
    ALERT,
    ALERTS_PRODUCER,
    DERIVED_PRODUCER,
    Codec,
    Deduper,
    Event,
    ForgedSignatureError,
    RecordDigests,
    ScalarColumns,
    SchemaError,
    Settings,
    all_events,
    decode_aggregates,
    decode_alert,
    decode_record,
    default_codec,
    encode_event,
    path_segment,
    record_span,
)

from ._catchup import CatchUp
from ._held import HeldRecords
from ._loop import ConsumerLoop
from ._protocol import Sink, Unavailable
from ._run_locks import RunLocks

log = logging.getLogger("metricbus.sink")


#: How often a sink looks for held records of runs the events topic never showed (seconds).
LET_GO_CHECK_S = 1.0

#: Runs a sink's feeder keeps what it knows of (which seqs the sink holds); past it, a run not
#: seen for KNOWN_IDLE_COMMITS commits is forgotten after a commit (what it took is durable
#: then) and asked of the sink again on its next event.
RUNS_KNOWN = 4096
KNOWN_IDLE_COMMITS = 30


class Feeder:
    """Decode, deduplicate and hand events to a sink: what live consumption and replay share.

    Remembers what the sink already holds (its ``recover``) the first time it sees a run.
    """

    def __init__(self, sink: Sink, codec: Codec | None = None, locks: RunLocks | None = None) -> None:
        self.sink = sink
        self.codec = codec or default_codec()
        #: the locks of the runs it looks at, when instances of its group share the runs
        #: (``_run_locks``); taken before what the sink holds of a run is read
        self.locks = locks
        self.logged = Deduper()  #: by producer_id (a producer's seqs are its own)
        self.derived = Deduper()  #: by run_id (derived seqs count per run)
        self.alerts = Deduper()  #: by run_id (alert seqs count per run)
        self._known_runs: dict[str, int] = {}  #: run -> the commit it was last seen after
        self._commits = 0
        self._run_of: dict[str, str] = {}  #: producer -> its run (to forget a run's producers)
        #: runs with a logged event seen (or held durably): their RunStarted has been written
        self.logged_runs: set[str] = set()

    @property
    def duplicates(self) -> int:
        """Events dropped because the sink already had them."""
        return self._forgotten + self.logged.duplicates + self.derived.duplicates + self.alerts.duplicates

    _forgotten = 0  # duplicates counted before the last forget()

    def forget(self) -> None:
        """Drop what is known of every run; the next sight of a run asks the sink again.

        After a rebalance another instance of the sink may have written a run's events
        meanwhile; only the sink's durable output (``recover``) knows.
        """
        self._forgotten = self.duplicates
        self.logged, self.derived, self.alerts = Deduper(), Deduper(), Deduper()
        self._known_runs.clear()
        self._run_of.clear()
        self.logged_runs.clear()

    def seen(self, run_id: str) -> bool:
        """Whether the sink has a logged event of ``run_id`` (its RunStarted, say)."""
        self.known(run_id)
        return run_id in self.logged_runs

    def known(self, run_id: str) -> None:
        """Load what the sink holds of ``run_id`` (once per run)."""
        known = self._known_runs
        if run_id in known:
            known[run_id] = self._commits
            return
        if self.locks is not None:
            self.locks.take(run_id)  # Unavailable: another instance still writes it
        known[run_id] = self._commits
        for producer, intervals in self.sink.recover(run_id).items():
            if producer == DERIVED_PRODUCER:
                self.derived.load(run_id, intervals)
            elif producer == ALERTS_PRODUCER:
                self.alerts.load(run_id, intervals)
            else:
                self.logged.load(producer, intervals)
                self._run_of[producer] = run_id
                self.logged_runs.add(run_id)

    def committed(self) -> None:
        """After a flush and commit: past RUNS_KNOWN runs, forget those long unseen.

        Everything the sink took is durable then, so what it holds of a forgotten run is what
        its ``recover`` says, read again on the run's next event (as after :meth:`forget`).
        """
        self._commits += 1
        if len(self._known_runs) <= RUNS_KNOWN:
            return
        idle = self._commits - KNOWN_IDLE_COMMITS
        gone = {run for run, seen in self._known_runs.items() if seen < idle}
        if self.locks is not None:
            self.locks.release(gone)
        for run in gone:
            del self._known_runs[run]
            self.logged_runs.discard(run)
            self.derived.sets.pop(run, None)
            self.alerts.sets.pop(run, None)
        for producer in [p for p, run in self._run_of.items() if run in gone]:
            del self._run_of[producer]
            self.logged.sets.pop(producer, None)

    def fresh(self, events: Sequence[Event]) -> list[Event]:
        """The events (logged or derived) the sink does not hold yet."""
        out = []
        for e in events:
            self.known(e.run_id)
            if e.producer_id == DERIVED_PRODUCER:
                if e.seq < 0 or self.derived.is_new(e.run_id, e.seq):
                    out.append(e)
            elif e.producer_id == ALERTS_PRODUCER:
                if e.seq < 0 or self.alerts.is_new(e.run_id, e.seq):
                    out.append(e)
            else:
                self.logged_runs.add(e.run_id)
                self._run_of[e.producer_id] = e.run_id
                if self.logged.is_new(e.producer_id, e.seq):
                    out.append(e)
        return out

    def fresh_columns(self, columns: ScalarColumns) -> bool:
        """Whether none of ``columns``' events was seen: then they are all recorded as seen.

        One check for the usual record, one producer's run of consecutive seqs; False changes
        nothing (the caller goes event by event through :meth:`fresh`).
        """
        self.known(columns.run_id)
        if not self.logged.add_run(columns.producer_id, columns.seqs):
            return False
        self.logged_runs.add(columns.run_id)
        self._run_of[columns.producer_id] = columns.run_id
        return True

    def write_columns(self, columns: ScalarColumns) -> list[tuple[Event, str]]:
        """Hand fresh columns to the sink (``write_columns`` when it has one, else as events).

        Returns the events it could not take, with the reason (as :meth:`write`).
        """
        if self.sink.columnar:
            try:
                self.sink.write_columns(columns)
                return []
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the sink
                log.error(
                    "sink %s: write of a record's columns failed (%.300s); event by event",
                    self.sink.name,
                    exc,
                )
        return self.write(columns.events())

    def fresh_derived(self, run_id: str, events: Sequence[Event], identified: bool) -> list[Event]:
        """Derived events of one record that the sink does not hold (one check per record)."""
        if not events or not identified:  # records written before v3: no identity to check
            return list(events)
        self.known(run_id)
        if self.derived.add_range(run_id, events[0].seq, events[-1].seq):
            return list(events)
        # held in part (a sink whose output outlived a crash mid-record): the rest, event by event
        return [e for e in events if self.derived.is_new(run_id, e.seq)]

    def write(self, events: Sequence[Event]) -> list[tuple[Event, str]]:
        """Hand events to the sink; return the ones it could not take, with the reason.

        A sink reports an event it cannot take by returning it from ``write``; one whose
        ``write`` raises anyway is retried an event at a time so the rest still land.
        """
        if not events:
            return []
        try:
            return list(self.sink.write(events) or ())
        except Unavailable:
            raise  # the destination's state, not the events': see ConsumerLoop
        except Exception as exc:  # noqa: BLE001 - one bad event must not stop the sink
            log.error(
                "sink %s: write of %d events failed (%.300s); retrying one by one",
                self.sink.name,
                len(events),
                exc,
            )
        rejected: list[tuple[Event, str]] = []
        for e in events:
            try:
                rejected.extend(self.sink.write([e]) or ())
            except Unavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - dead-lettered with the reason
                rejected.append((e, f"{type(exc).__name__}: {exc}"))
        return rejected


class SinkRunner(ConsumerLoop):
    """Runs one sink until :meth:`stop` (call it from the event loop, e.g. a signal handler)."""

    def __init__(
        self,
        sink: Sink,
        settings: Settings,
        *,
        topics: list[str] | None = None,
        group_id: str | None = None,
        flush_interval_s: float = 2.0,
        max_pending_events: int = 200_000,
        codec: Codec | None = None,
        alerts: bool = False,
    ) -> None:
        #: Topics consumed: the events topic and, for sinks that show derived series, the
        #: aggregates topic; with ``alerts``, the alerts topic too (the sink's ``write`` takes
        #: them as events of kind ALERT, by ALERTS_PRODUCER: the W&B sink raises them on the run
        #: it holds open)
        super().__init__(
            settings,
            [*(topics or [settings.topics.events]), *([settings.topics.alerts] if alerts else [])],
            group_id or settings.groups.sink(sink.name),
            f"sink-{sink.name}",
            flush_interval_s=flush_interval_s,
        )
        self.sink = sink
        self.max_pending_events = max_pending_events
        self.codec = codec or default_codec()
        #: the runs this instance writes, one instance at a time each (``_run_locks``)
        self.locks = RunLocks(settings.data_dir / "locks" / f"{path_segment(self.group_id)}.lock")
        self.feeder = Feeder(sink, self.codec, self.locks)
        self.digests = RecordDigests()  #: a record repeated with other bytes is forged: dead-lettered
        self.signer = settings.signer  #: with a signing key, an events record without its HMAC is forged
        self._badly_signed = 0
        #: derived records and alerts of runs whose logged events (RunStarted first) this sink
        #: has not seen yet: written once the run is, not committed past meanwhile
        self.held = HeldRecords()
        self._next_let_go_check = 0.0
        self._event_topics = {
            t for t in self.topics if t not in (settings.topics.aggregates, settings.topics.alerts)
        }
        self._gaps_reported: dict[str, int] = {}
        #: for a sink that confirms late (``Sink.confirmed``): per slice, the events handed by
        #: its end and the first offset of each partition it wrote from
        self._marks: list[tuple[int, dict[Any, int]]] = []
        self._last_handed = 0

    def open(self) -> None:
        """Open the sink."""
        self.sink.open()

    def close(self) -> None:
        """Close the sink, then let go of its runs."""
        self.sink.close()
        self.locks.release_all()

    def pending(self) -> int:
        """Events the sink holds unflushed."""
        return self.sink.pending()

    def flush(self) -> None:
        """The sink's flush."""
        self.sink.flush()

    def due(self) -> bool:
        """A full buffer, or the flush interval."""
        return self.sink.pending() >= self.max_pending_events or super().due()

    async def _process(self, records: list[Any]) -> None:
        prepared_at = self._generation
        fresh: list[Event] = []
        fresh_columns: list[ScalarColumns] = []
        closing: list[str] = []
        feeder = self.feeder
        derived_records = []
        alerts: list[tuple[Any, Event]] = []
        for record in records:  # logged events first: a run's RunStarted before its derived points
            self.stats.records += 1
            try:
                if record.topic == self.settings.topics.aggregates:
                    derived_records.append((record, decode_aggregates(self.codec, record.value)))
                    continue
                if record.topic == self.settings.topics.alerts:
                    alerts.append((record, self._alert_event(record.value)))
                    continue
                self.signer.check(record.value)
                events, columns = decode_record(self.codec, record.value)
                self.digests.check(record.value, record_span(events, columns))  # a forged repeat
            except SchemaError as exc:
                self._badly_signed += isinstance(exc, ForgedSignatureError)
                self.stats.forged = self.digests.forged + self._badly_signed
                await self.dead_letters.send(record.value, record.key, f"{type(exc).__name__}: {exc}", record)
                continue
            if columns is not None and self.sink.columnar and feeder.fresh_columns(columns):
                fresh_columns.append(columns)  # a columnar sink: the order of rows is its own
                self.stats.events += len(columns.seqs)
            else:
                events = all_events(events, columns)
            self.stats.events += len(events)
            fresh.extend(feeder.fresh(events))
        for _, derived in self.held.ready(self.held.derived, derived_records, feeder.seen):
            fresh.extend(feeder.fresh_derived(derived.run_id, derived.events, derived.identified))
            if derived.closes_run:
                closing.append(derived.run_id)
        self.stats.duplicates = feeder.duplicates

        def write() -> list[tuple[Event, str]]:
            rejected = feeder.write(fresh)
            for columns in fresh_columns:
                rejected += feeder.write_columns(columns)
            return rejected

        rejected = await self._owned_write(prepared_at, write)
        self.stats.written += len(fresh) + sum(len(c.seqs) for c in fresh_columns) - len(rejected)
        if rejected:
            for event, reason in rejected:
                self.stats.rejected += 1
                await self.dead_letters.send(self._event_bytes(event), event.run_id.encode(), reason, None)
        if closing:
            await self._owned_write(prepared_at, lambda: self._close_runs(closing))
        if alerts or self.held.alerts:
            await self._alerts(alerts, prepared_at)

    def _close_runs(self, run_ids: list[str]) -> None:
        """The sink's ``derived_complete`` of runs whose derived series are all in."""
        for run_id in run_ids:
            try:
                self.sink.derived_complete(run_id)
            except OSError as exc:  # its output cannot be closed now (a full disk): read it again later
                raise Unavailable(f"run {run_id} cannot be closed ({exc})") from exc

    async def _alerts(self, alerts: list[tuple[Any, Event]], prepared_at: int) -> None:
        """Alerts of runs the sink has seen (the rest are held), once each; refused: dead letters."""
        feeder = self.feeder
        for record, event in self.held.ready(self.held.alerts, alerts, feeder.seen):
            self.stats.events += 1
            if not feeder.fresh([event]):
                continue
            refused = await self._owned_write(prepared_at, functools.partial(feeder.write, [event]))
            for _, reason in refused:
                self.stats.rejected += 1
                await self.dead_letters.send(record.value, record.key, reason, record)
            self.stats.written += not refused
        self.stats.duplicates = feeder.duplicates

    async def _process_sliced(self, records: list[Any]) -> None:
        await super()._process_sliced(records)
        if (
            self.held
            and not self._stopping.is_set()  # else a poll's records may be left unprocessed
            and time.monotonic() >= self._next_let_go_check
        ):
            self._next_let_go_check = time.monotonic() + LET_GO_CHECK_S
            await self._let_go_of_unseen_runs()
        self._pause_while_too_much_held()

    def _pause_while_too_much_held(self) -> None:
        """Stop reading the aggregates and alerts topics while MAX_HELD_RECORDS are held.

        The events topic is still read, which is what releases them (their runs' RunStarted, or
        their events partitions read past: :meth:`_let_go_of_unseen_runs`).
        """
        consumer = self._consumer
        change = self.held.pause_or_resume()
        if change == "pause":
            consumer.pause(*(tp for tp in consumer.assignment() if tp.topic not in self._event_topics))
            log.info(
                "%s: %d records held for runs not seen yet; reading only the events",
                self.name,
                len(self.held),
            )
        elif change == "resume":
            consumer.resume(*consumer.paused())

    async def _let_go_of_unseen_runs(self) -> None:
        """Dead-letter what is held for runs that the events topic, read past them, never showed.

        A derived record or an alert is held until its run's RunStarted (or any logged event of
        it) is read. One whose run never comes (a hostile or misrouted record, a run whose
        logged events sit on partitions another instance reads) was held forever, and its
        partition never committed past it: memory grew, and `metricbus up` put its planned
        broker restarts off for good, the broker's memory growing with it. So each held run is
        marked with where this instance's events partitions ended (checked after every record
        the poll returned was processed); once they are read past those ends and the run is
        still unseen, its logged events are not coming here: what is held for it goes to the
        dead-letter topic with the reason, and its partitions are committed past it.
        """
        from aiokafka import TopicPartition

        consumer = self._consumer
        events = [tp for tp in consumer.assignment() if tp.topic in self._event_topics]
        unmarked = self.held.unmarked()
        try:
            if unmarked:
                self.held.mark(unmarked, await consumer.end_offsets(events) if events else {})
            positions = {tp: await consumer.position(tp) for tp in events}
        except Exception as exc:  # noqa: BLE001 - checked again later; holding loses nothing
            log.warning("%s: cannot tell where its events partitions stand (%s)", self.name, exc)
            return
        unseen = self.held.unseen(positions)
        for run in unseen:
            reason = (
                f"run {run!r} was not seen on {', '.join(sorted(self._event_topics))} (no "
                "RunStarted nor any logged event of it) up to where its partitions ended after "
                "this record came: held, then let go"
            )
            for record, _ in self.held.take(run):
                await self.dead_letters.send(record.value, record.key, reason, record)
                tp = TopicPartition(record.topic, record.partition)
                self._uncommitted[tp] = max(self._uncommitted.get(tp, 0), await consumer.position(tp))
        if unseen:
            self.held.limit(self._uncommitted)  # not committed past a record still held

    def _alert_event(self, value: bytes) -> Event:
        """An Alert record as an event of kind ALERT; SchemaError when it is none or unusable."""
        alert = decode_alert(self.codec, value)
        return Event(alert["run_id"], ALERTS_PRODUCER, alert["seq"], alert["ts_ms"], ALERT, alert, b"")

    async def _before_join(self) -> None:
        """Catch up from the archive on what a planned broker restart left this group behind on.

        See ``sinks._catchup``. One instance of the group does it (the others wait, so no two
        write a run at once); a stop asked for meanwhile is heeded between chunks, and what was
        done by then is kept (each run is flushed before it is struck off the list).
        """
        catchup = CatchUp(self.settings, self.group_id, self.name)
        if not catchup.runs() or not await catchup.take_turn(self._stopping):
            return
        try:
            runs = catchup.runs()  # what another instance left
            if runs:
                log.info("%s: catching up on %d run(s) from the archive", self.name, len(runs))
            for run_id, closed in runs.items():
                if not await self._catch_up_run(catchup, run_id, closed):
                    return
                catchup.done(run_id)
        finally:
            catchup.release()

    async def _catch_up_run(self, catchup: CatchUp, run_id: str, closed: bool) -> bool:
        """Feed one archived run to the sink and flush it; False when stopped midway."""
        found = 0
        while True:  # its lock first: an instance left out of the group may still write it
            try:
                self.feeder.known(run_id)
                break
            except Unavailable as why:
                log.warning("%s: %s; trying again in 1 s", self.name, why)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), 1.0)
                if self._stopping.is_set():
                    return False
        for events in catchup.chunks(run_id, self.sink.recover(run_id), self.codec):
            found += len(events)
            self.stats.events += len(events)
            fresh = self.feeder.fresh(events)
            rejected = self.feeder.write(fresh)
            self.stats.written += len(fresh) - len(rejected)
            self.stats.duplicates = self.feeder.duplicates
            for event, reason in rejected:
                self.stats.rejected += 1
                await self.dead_letters.send(self._event_bytes(event), event.run_id.encode(), reason, None)
            if (
                self.sink.pending() >= self.max_pending_events
                or time.monotonic() - self._last_flush >= self.flush_interval_s
            ):  # as live: what was read is durable within the interval, should the process be killed
                await self._flush_and_commit()  # flushes (retried with backoff); nothing to commit
            await asyncio.sleep(0)  # a stop can be heard
            if self._stopping.is_set():
                await self._flush_and_commit()
                return False
        if not found:
            log.warning("%s: run %r is not in the archive; nothing to catch up on", self.name, run_id)
        if closed:
            self.sink.derived_complete(run_id)
        self.sink.close_run(run_id)  # a sink that confirms late holds it all once the run is closed
        await self._flush_and_commit()
        return not self.pending()  # else stopped while its flush failed: the run stays listed

    def _released(self) -> None:
        """Another instance may take this one's runs over: keep no view of them in memory.

        What this instance knows of a run (the seqs held, open files or W&B runs) is reloaded
        from the sink's durable output the next time the run is seen, so two instances of a
        sink that pass a run between them never write an event twice.
        """
        self.feeder.forget()
        self.held.clear()  # their partitions were not committed past them: delivered again
        self._marks.clear()  # what was not confirmed is delivered again (not committed past)
        self.sink.release()
        self.locks.release_all()  # once the sink let go of them: another may take them

    def _after_slice(self, records: list[Any]) -> None:
        self.held.limit(self._uncommitted)  # not committed past a record still held
        released = self.held.take_released()
        confirmed = self.sink.confirmed()
        if confirmed is None or confirmed[0] == self._last_handed:
            return  # nothing handed in this slice: nothing of it to wait for
        from aiokafka import TopicPartition

        self._last_handed = confirmed[0]
        firsts: dict[Any, int] = {}
        for record in [*records, *released]:
            tp = TopicPartition(record.topic, record.partition)
            firsts[tp] = min(firsts.get(tp, record.offset), record.offset)
        self._marks.append((confirmed[0], firsts))

    def _commit_limits(self) -> dict[Any, int]:
        """No partition is committed past a record whose events the sink has not confirmed."""
        confirmed = self.sink.confirmed()
        if confirmed is None:
            self._marks.clear()
            return {}
        durable = confirmed[1]
        self._marks = [(handed, firsts) for handed, firsts in self._marks if handed > durable]
        limits: dict[Any, int] = {}
        for _, firsts in self._marks:
            for tp, offset in firsts.items():
                limits[tp] = min(limits.get(tp, offset), offset)
        return limits

    def _event_bytes(self, event: Event) -> bytes:
        try:
            return encode_event(self.codec, event)
        except SchemaError:
            return repr(event)[:4096].encode()

    def _after_commit(self) -> None:
        self.feeder.committed()
        for producer, missing in self.feeder.logged.gaps().items():
            if self._gaps_reported.get(producer) != missing:
                self._gaps_reported[producer] = missing
                log.warning(
                    "sink %s: producer %s has %d events missing so far (gap in seq)",
                    self.sink.name,
                    producer,
                    missing,
                )
