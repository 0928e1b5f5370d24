"""The background half of the producer hook: batch, encode, spool, send.

The training thread only appends event tuples to a deque (:meth:`Publisher.submit`). Two
threads owned by the Publisher do the rest: the *spooler* (here) encodes what is queued into
EventBatch records every ``linger_s`` (within a 10 ms tick after a quiet spell) and appends
them to the spool (so a crash loses at most one linger interval, whatever the network does);
the *sender* (``_sender``) sends from the spool and moves its cursor on acknowledgement, and
may block on a dead broker without holding anything up. Ordering: every spool append happens
under one lock, in seq order.

When the queue is full (the training loop outruns encoding, millions of events a second),
``log()`` waits up to ``max_block_s`` for room (0 by default), then sheds the event: it gets
no seq, is counted in ``dropped_events`` and the run says so once. ``log()`` never encodes in
the caller and never waits on the network. Control events (RunStarted, RunFinished, ...) are
never shed.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from itertools import repeat, starmap
from typing import Any

from metricbus.schemas import (
    MAX_RECORD_BYTES,
    SIGNATURE_BYTES,
    Codec,
    EncodeError,
    ScalarRows,
    Signer,
    encode_fitting,
)

from ._resend import ResendWindow
from ._sender import Sender, TakeTurns
from ._spool import Spool
from ._transport import Transport

log = logging.getLogger("metricbus.producer")

#: (seq, ts_ms, body kind, body): what ``prepare`` makes of the queued events, the body a dict
Event = tuple[int, int, str, Any]
#: The queue holds each event as two items, a head ``(ts, kind, step, epoch, labels)`` (step,
#: epoch and labels None but in log()'s plain events, which Run's ``prepare`` turns into columns
#: or rows) and its body, added by one ``deque.extend`` (atomic under the GIL: two threads'
#: items never interleave). Seqs are given as the spooler takes events off the queue, so they
#: count in the spool's order whichever threads logged (and log() does not count them).
#: Why not one tuple: a tuple holding a dict stays tracked by the garbage collector, and one
#: queued for the spooler's linger (30 ms) outlives two young collections, so every queued
#: event was promoted to the oldest generation and the full collections that followed (~150 ms
#: each with a training job's heap) were a third of the producer's CPU. A head of numbers is
#: untracked at its first young collection and log()'s dict copy of floats is never tracked,
#: so a log() call now promotes nothing (measured: 3 full collections per 100k calls -> 0).
PER_EVENT = 2

#: The spooler looks at the queue this often: what comes after a quiet spell is spooled (and
#: sent) within a tick, a steady stream once per ``linger_s``.
QUIET_TICK_S = 0.01
#: A flush (``finish()``) gives up waiting once nothing has listened at the broker's address for
#: this long: what is unsent is in the spool by then, and ``metricbus sync`` sends it later.
REFUSED_GIVE_UP_S = 0.5
#: Encoded records held in memory while the spool's disk refuses them (full), at most.
HELD_MAX_BYTES = 64 << 20
#: ... and tried again this often.
HELD_RETRY_S = 0.5


class Publisher:
    """Owns the publisher thread of one Run; start / flush / stop, stop is idempotent."""

    def __init__(
        self,
        *,
        run_id: str,
        producer_id: str,
        spool: Spool,
        transport: Transport,
        codec: Codec,
        sdk_version: str,
        prepare: Callable[[list[Any], int], list[Event] | ScalarRows],
        linger_s: float = 0.03,
        send_linger_s: float = 0.03,
        send_burst: int = 4,
        send_batch_bytes: int = 256 * 1024,
        max_batch_events: int = 2000,
        max_queue: int = 100_000,
        max_record_bytes: int = MAX_RECORD_BYTES,
        max_block_s: float = 0.0,
        retain_s: float = 60.0,
        retain_bytes: int = 64 * 1024 * 1024,
        describe_target: Callable[[], str] = lambda: "Kafka",
        signer: Signer | None = None,
    ) -> None:
        self.run_id = run_id
        self.producer_id = producer_id
        self.spool = spool
        self.transport = transport
        self.codec = codec
        self.sdk_version = sdk_version
        self.linger_s = linger_s
        self._passed_at = 0.0  # the spooler's last pass (monotonic)
        #: events per EventBatch record at most (a tight loop's 30 ms linger holds ~3,000). At
        #: 500, kafka-python sent four records where one would do (it costs per record and per
        #: request), and the stream worker paid Faust's cost per record four times: 2,000 took
        #: the worker from ~2.7x to ~4-5x its bench's bare loop (bench/stream_throughput.py).
        #: Putting several records in one Kafka batch instead (a producer linger) halved the
        #: worker's rate: measured and undone. A 2,000-event batch is ~3 ms of the spooler's
        #: work (its check and encoding): it lets a waiting training thread have the GIL
        #: between its two stages (calls over 1 ms at 1M scalars/s for 20 s: 120 -> 45;
        #: bench/sustained.py).
        self.max_batch_events = max_batch_events
        self.max_queue = max_queue
        #: signs each record when the project sets a key (``Settings.signing_key``); the
        #: signature counts against ``max_record_bytes``
        self.signer = signer or Signer(None)
        self.max_record_bytes = max_record_bytes
        self.max_block_s = max_block_s
        #: what the broker acknowledged, sent again if it turns out to have lost its topic (a
        #: memory-only broker restarted): its acknowledgement was not durability
        self.window = ResendWindow(retain_s, retain_bytes)
        #: Events waiting for the thread, PER_EVENT items each. Run.log extends it directly
        #: while it holds fewer than ``max_items`` (max_queue events).
        self.queue: collections.deque[Any] = collections.deque()
        self._queue = self.queue
        self.max_items = max_queue * PER_EVENT
        #: EventBatch v5's columns for scalars-only Metrics events (False: one Avro record per
        #: event, the v4 layout; bench/stream_throughput.py compares the two)
        self.columnar = True
        #: turns the queue's items into encodable events on this thread, given the first's seq,
        #: their seqs consecutive (``_prepare.Prepare``; it may leave out a queued event it refuses)
        self.prepare = prepare
        self._next_seq = 0  #: the seq of the next event taken off the queue (also how many were)
        self.turns = TakeTurns()  #: the spool's lock, which the spooler lets the sender have in turn
        self._lock = self.turns.lock
        self.sender = Sender(
            key=run_id.encode(),
            spool=spool,
            transport=transport,
            window=self.window,
            turns=self.turns,
            queue=self.queue,
            linger_s=linger_s,
            send_linger_s=send_linger_s,
            send_burst=send_burst,
            send_batch_bytes=send_batch_bytes,
            describe_target=describe_target,
        )
        self._wake = threading.Event()  # the spooler's
        self._stopping = False
        self._closed = False
        # Daemon threads, because Python joins non-daemon threads *before* atexit handlers
        # run: a script that forgot finish() would hang at exit. Run's atexit hook flushes
        # them instead, and if even that never runs (os._exit, SIGKILL), the spool has the data.
        self._thread = threading.Thread(target=self._spool_loop, name=f"mb-spool-{run_id}", daemon=True)
        self._send_thread = threading.Thread(target=self._send_loop, name=f"mb-send-{run_id}", daemon=True)
        self._last_sync = 0.0
        #: Counters, readable at any time (the sender's, ``records_sent``, on it).
        self.events_spooled = 0
        self.overflows = 0  #: times log() found the queue full
        self.dropped_events = 0  #: events shed because the queue stayed full (no seq given)
        self.lost_events = 0
        #: encoded records the spool's disk refused (full): appended before anything newer once
        #: it takes them again, retried every linger interval; at most HELD_MAX_BYTES, past which
        #: the newest are lost (counted)
        self._held: list[bytes] = []
        self._held_events = 0
        self._held_bytes = 0
        self._held_retry_at = 0.0
        self.encode_errors = 0
        self.oversize_events = 0

    # -- the caller's side ------------------------------------------------------------

    def start(self) -> None:
        """Start the threads."""
        self._thread.start()
        self._send_thread.start()

    def submit(self, kind: str, body: Any) -> None:
        """Queue one event now, whatever the queue holds (control events). Never blocks; never raises."""
        self._queue.extend(((time.time_ns() // 1_000_000, kind, None, None, None), body))
        if len(self._queue) >= self.max_items:
            self._wake.set()

    def room(self) -> bool:
        """Called by ``log()`` with the queue full: wait up to ``max_block_s`` for room.

        False: shed the event (counted; said once per run).
        """
        self.overflows += 1
        self._wake.set()
        deadline = time.monotonic() + self.max_block_s
        while time.monotonic() < deadline:
            time.sleep(0.0002)
            if len(self._queue) < self.max_items:
                return True
        if len(self._queue) < self.max_items:
            return True
        self.dropped_events += 1
        if self.dropped_events == 1:
            log.warning(
                "metricbus: log() is outrunning the encoder (%d events queued): events are being "
                "dropped and counted in run.stats()['dropped_events']. Log less often, or pass "
                "max_block_s= to metricbus.init to wait for room instead.",
                len(self._queue) // PER_EVENT,
            )
        return False

    @property
    def events_submitted(self) -> int:
        """Events accepted so far: queued in memory, or taken off the queue.

        Those taken are spooled, held while the spool's disk refuses, or lost when it never made
        room (``lost_events``).
        """
        return self._next_seq + len(self._queue) // PER_EVENT

    @property
    def backlog(self) -> int:
        """Events queued in memory plus bytes spooled but unacknowledged (0 means all sent).

        Read under the lock: the thread takes events off the queue and appends them to the
        spool inside it, and between the two both would look empty. And not during a check:
        it clears ``unverified`` before it marks the window to resend (a flush that looked in
        between returned with the window never resent; test_planned_restart, 1 run in 4).
        """
        checking = self.sender.checking
        if not checking.acquire(timeout=0.05):
            return len(self._queue) // PER_EVENT + 1  # a check is under way: not done yet
        try:
            with self._lock:
                unchecked = self.transport.unverified or self.window.due
                queued = len(self._queue) // PER_EVENT + self._held_events
                return queued + self.spool.unsent_bytes + int(unchecked)
        finally:
            checking.release()

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted so far is acknowledged; False on timeout.

        Also False once nothing has listened at the broker's address for ``REFUSED_GIVE_UP_S``
        (a refused connection, not a slow broker): what is unsent is in the spool by then.
        """
        deadline = time.monotonic() + timeout
        sender = self.sender
        sender.next_attempt = 0.0
        refused_since: float | None = None
        with sender.flushing():
            while (now := time.monotonic()) < deadline:
                self._wake.set()
                sender.wake()
                if self.backlog == 0:
                    return True
                if not (self._thread.is_alive() and self._send_thread.is_alive()):
                    return False
                if getattr(self.transport, "refused", False) and sender.failures:
                    refused_since = refused_since if refused_since is not None else now
                    if now - refused_since >= REFUSED_GIVE_UP_S:
                        return False
                else:
                    refused_since = None
                time.sleep(0.005)
            return False

    def stop(self, timeout: float) -> bool:
        """Flush up to ``timeout``, then stop the threads; True when nothing was left unsent.

        Whatever is unsent stays in the spool file (fsynced) for ``metricbus sync``. If the
        sender is still inside a send, it closes the spool itself when that send returns
        (bounded by the transport timeout).
        """
        deadline = time.monotonic() + timeout
        if self._thread.is_alive() and not self.flush(timeout):
            deadline = min(deadline, time.monotonic())  # gave up: join the threads only briefly
        self._stopping = self.sender.stopping = True
        self._wake.set()
        self.sender.wake()
        for thread in (self._thread, self._send_thread):
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()) + 0.05)
        with self._lock:
            self._spool_queue_locked()
            try:
                self.spool.sync()
            except OSError as exc:  # a full or failing disk: said; finish() returns False below
                log.error("cannot fsync the spool %s (%s)", self.spool.path, exc)
                return False
            if not self._send_thread.is_alive():
                self._close_locked()
            if self._held_events:
                log.error(
                    "%d events could not be written to the spool %s (its disk is full) and are lost "
                    "when this process ends (counted in lost_events)",
                    self._held_events,
                    self.spool.path,
                )
                if self._closed:  # nothing will write them any more: lost, counted where callers read
                    self.lost_events += self._held_events
                    self._held, self._held_events, self._held_bytes = [], 0, 0
                    return False
            return not self._queue and not self._held_events and self.spool.unsent_bytes == 0

    def _close_locked(self) -> None:
        if not self._closed:
            self._closed = True
            self._spool_queue_locked()
            self.sender.respool_unverified_locked()
            self.spool.close()
            self.transport.close()

    # -- the threads ----------------------------------------------------------------------

    def _spool_loop(self) -> None:
        """Queue to spool every linger interval (fsynced at least once a second while unsent)."""
        try:
            while not self._stopping:
                woken = self._wake.wait(self._spool_wait())
                self._wake.clear()
                if not (woken or self._held or self._pass_due()):
                    self._sync_if_behind()
                    continue
                self._passed_at = time.monotonic()
                more = True
                while more and not self._stopping:  # a batch per hold of the lock: under overload
                    with self._lock:  # the queue never empties, and the sender needs the lock too
                        more = self._spool_queue_locked(batches=1)
                    if self.spool.unsent_bytes or self.sender.flushers:
                        self.sender.wake()  # else it has nothing new: let it sleep its interval
                    self.turns.let_in()  # the sender's turn, if it waits for the lock
                    self._sync_if_behind()
        except Exception:  # noqa: BLE001 - the thread must never die silently
            log.exception("metricbus spooler thread failed; queued events go to the spool at finish()")

    def _spool_wait(self) -> float:
        """Seconds until the spooler looks again: a tick, or the rest of the linger if less."""
        left = self._passed_at + self.linger_s - time.monotonic()
        return left if 0 < left < QUIET_TICK_S else QUIET_TICK_S

    def _pass_due(self) -> bool:
        """Whether events are queued and the last pass was a linger ago.

        A steady stream is spooled once per ``linger_s``; an event after a quiet spell within a
        tick (QUIET_TICK_S), not up to a whole linger later.
        """
        return bool(self._queue) and time.monotonic() - self._passed_at >= self.linger_s - 0.001

    def _send_loop(self) -> None:
        """Spool to Kafka (the sender's thread); the last of the two threads to end closes."""
        try:
            self.sender.run()
        except Exception:  # noqa: BLE001 - the thread must never die silently
            log.exception("metricbus sender thread failed; unsent events stay in the spool")
        finally:
            if self._stopping:
                with self._lock:
                    if not self._thread.is_alive():
                        self._close_locked()

    def _spool_queue_locked(self, batches: int | None = None) -> bool:
        """Spool what is queued (at most ``batches`` records' worth).

        True if a whole record's worth (``max_batch_events``) is still queued: an overload,
        spooled on at once. Less waits for the next linger interval, so that a busy loop's
        events go in records of a linger's worth, not in a record per few events taken as
        they arrive (each its own request then, and a backlog of them).
        """
        queue = self._queue
        while len(queue) >= PER_EVENT:
            if batches is not None:
                if batches == 0:
                    return len(queue) // PER_EVENT >= self.max_batch_events
                batches -= 1
            n = min(len(queue) // PER_EVENT, self.max_batch_events)
            items = list(starmap(queue.popleft, repeat((), n * PER_EVENT)))
            prepared = self.prepare(items, self._next_seq)
            time.sleep(0)  # a training thread waiting for the GIL gets it between the two stages
            records = self._encode(prepared)
            taken = len(prepared.seqs) if isinstance(prepared, ScalarRows) else len(prepared)
            self._next_seq += taken
            self._spool_records(records, taken)
        if self._held and not queue:
            self._spool_records([], 0)  # the disk may have room again
        return False

    def _spool_records(self, records: list[bytes], events: int) -> None:
        """Append to the spool after what it refused before, in order; hold them while it refuses."""
        if self._held:
            if self._held_bytes + sum(map(len, records)) > HELD_MAX_BYTES:
                if not self.lost_events:
                    log.error("the spool's disk is still full and %d MB are held: newer events are lost "
                              "(counted in lost_events)", HELD_MAX_BYTES >> 20)  # fmt: skip
                self.lost_events += events
                records, events = [], 0
            self._held.extend(records)
            self._held_events += events
            self._held_bytes += sum(map(len, records))
            records, events = self._held, self._held_events
            if (time.monotonic() < self._held_retry_at and not self._stopping) or self.spool.closed:
                return  # the disk refused them a moment ago (try again in a while), or the run ended
        try:
            self.spool.append(records)
        except OSError as exc:
            self._held_retry_at = time.monotonic() + HELD_RETRY_S
            if not self._held:
                log.error(
                    "cannot write the spool %s (%s): its events are held in memory (at most %d MB) "
                    "and written when it has room again. Free disk space, or set METRICBUS_DATA_DIR "
                    "to another disk.",
                    self.spool.path,
                    exc,
                    HELD_MAX_BYTES >> 20,
                )
                self._held, self._held_events = list(records), events
                self._held_bytes = sum(map(len, records))
            return
        if self._held:
            log.warning("the spool %s has room again: %d held events written", self.spool.path, events)
            self._held, self._held_events, self._held_bytes = [], 0, 0
        self.events_spooled += events

    def _encode(self, events: list[Event] | ScalarRows) -> list[bytes]:
        """Records for ``events``, each under ``max_record_bytes``; what cannot be encoded is dropped.

        The spool never holds a record the broker would refuse (see :func:`encode_fitting`);
        an event that cannot be encoded, or is too large for any record, is dropped with an
        error naming it (counted in ``lost_events``).
        """
        signer = self.signer
        records = encode_fitting(
            self.codec,
            self.run_id,
            self.producer_id,
            events,
            self.max_record_bytes - (SIGNATURE_BYTES if signer.active else 0),
            self._rejected,
            self.sdk_version,
            self.columnar,
        )
        return [signer.sign(r) for r in records] if signer.active else records

    def _rejected(self, event: Event, why: EncodeError | int) -> None:
        self.lost_events += 1
        if isinstance(why, EncodeError):
            self.encode_errors += 1
            log.error(
                "event seq %d cannot be encoded and is dropped%s",
                event[0],
                "" if self.encode_errors == 1 else f" ({self.encode_errors} so far)",
                exc_info=(type(why), why, why.__traceback__) if self.encode_errors == 1 else None,
            )
            return
        self.oversize_events += 1
        log.error(
            "event seq %d is %.1f MB encoded, over the %.0f MB a Kafka record may hold: dropped. "
            "Log fewer values per call, or large arrays as a histogram.",
            event[0],
            why / 1e6,
            self.max_record_bytes / 1e6,
        )

    def _sync_if_behind(self) -> None:
        now = time.monotonic()
        if self.spool.unsent_bytes and now - self._last_sync > 1.0:
            self._last_sync = now
            with self._lock:
                try:
                    self.spool.sync()
                except OSError as exc:  # a full or failing disk: the next pass tries again
                    log.error("cannot fsync the spool %s (%s)", self.spool.path, exc)
