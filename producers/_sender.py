"""The sender: from the spool to Kafka, and the check that the broker kept what it acknowledged.

One of the Publisher's two threads (the spooler fills the spool, see ``_publisher``). It sends
what the spool holds (when ``send_batch_bytes`` are waiting, at once for a flush, else as a
token bucket allows: up to ``send_burst`` requests at once after a quiet spell, then one per
``send_linger_s``) and moves the spool's cursor on acknowledgement. What the broker
acknowledged stays in the ``ResendWindow`` until a check confirms the broker still holds it (a
memory-only broker that restarted does not: the window is sent again first); while `metricbus
up` restarts its broker, nothing is sent. It may block on a dead broker without holding
anything up: it shares only the spool's lock with the spooler (``TakeTurns``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._resend import ResendWindow
from ._spool import Spool
from ._transport import BrokerRestarting, Transport, TransportError

log = logging.getLogger("metricbus.producer")

#: How long the spooler waits, at most, for the sender to take the lock it waits for (a turn).
SENDER_TURN_S = 0.05
#: While sending, the broker is asked at most this often whether it still holds what it
#: acknowledged (a memory-only broker that restarted does not; ``ResendWindow``); always
#: before a flush returns.
VERIFY_INTERVAL_S = 1.0
#: The sender with nothing unsent or unchecked sleeps this long unless woken (by the spooler,
#: which wakes it when it spooled something, or by a flush): not a wake-up every spool pass.
IDLE_WAKE_S = 1.0
#: While the broker is restarting (planned), sending pauses this long between checks.
RESTART_CHECK_S = 0.25


class TakeTurns:
    """The spool's lock, shared by the spooler and the sender, and fair to the sender.

    Python's Lock is not fair: under overload the spooler, taking it back for batch after
    batch, kept the sender out for seconds. The sender says it waits; the spooler, between two
    batches, lets it in (``let_in``).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._waits = threading.Event()
        self._in = threading.Event()

    @contextlib.contextmanager
    def sender(self) -> Iterator[None]:
        """The lock, for the sender: the spooler lets it in between two batches."""
        self._in.clear()
        self._waits.set()
        with self.lock:
            self._waits.clear()
            self._in.set()
            yield

    def let_in(self) -> None:
        """The spooler, not holding the lock: if the sender waits for it, wait until it has it."""
        if self._waits.is_set():
            self._in.wait(SENDER_TURN_S)


class Sender:
    """Sends a Publisher's spool; :meth:`run` is its thread (until ``stopping``)."""

    def __init__(
        self,
        *,
        key: bytes,
        spool: Spool,
        transport: Transport,
        window: ResendWindow,
        turns: TakeTurns,
        queue: collections.deque[Any],
        linger_s: float,
        send_linger_s: float,
        send_burst: int,
        send_batch_bytes: int,
        describe_target: Callable[[], str],
    ) -> None:
        self.key, self.spool, self.transport, self.window, self.turns = key, spool, transport, window, turns
        self.queue = queue  #: the spooler's queue: a flush's check waits until it is empty
        self.linger_s = linger_s
        #: the sender sends when ``send_batch_bytes`` are spooled, at once for a flush, and
        #: otherwise about once per send_linger_s: at a trickle of events (an SB3 episode every
        #: few ms) each request costs ~0.7 ms of CPU, cold (the transport's request, the
        #: cursor's write). 30 ms, the spool pass: log() -> sent p99 ~31 ms at 100 to 10,000
        #: events/s (bench/stream_throughput.py).
        self.send_linger_s = send_linger_s
        self.send_batch_bytes = send_batch_bytes
        #: ... but not as a floor: a token bucket of ``send_burst`` sends, refilled one per
        #: ``send_linger_s``, lets what a quiet pipe is given go at once (a NaN loss, an episode)
        #: while the long-run rate of requests stays at most one per ``send_linger_s``
        self.send_burst = send_burst
        self._tokens = float(send_burst)
        self._refilled = time.monotonic()
        self.describe_target = describe_target
        self.stopping = False
        self.flushers = 0  #: flush() calls waiting: send at once, check without waiting for the interval
        self._flushers_lock = threading.Lock()  # flush() may be called from several threads
        #: held by a check of the broker and what it decides (``Publisher.backlog`` waits for it)
        self.checking = threading.Lock()
        #: set once it connected, or found it cannot yet (``Run`` waits for it briefly)
        self.connected = threading.Event()
        self._wake = threading.Event()
        self.next_attempt = 0.0  #: no send before this (a backoff); a flush sets it back to 0
        self.failures = 0  #: sends (or checks) failed in a row
        #: the run already said that no broker answers (at init): the first failure is not said again
        self.said_unreachable = False
        self._verified_at = 0.0
        self._restarting_said = False
        self.records_sent = 0

    def wake(self) -> None:
        """Look at the spool now (something was spooled, or a flush waits)."""
        self._wake.set()

    @contextlib.contextmanager
    def flushing(self) -> Iterator[None]:
        """While a flush waits: send at once, and check the broker before it returns."""
        with self._flushers_lock:
            self.flushers += 1
        try:
            yield
        finally:
            with self._flushers_lock:
                self.flushers -= 1

    def run(self) -> None:
        """Connect, then send whatever the spool holds until ``stopping``."""
        self._connect()
        while not self.stopping:
            self._wake.wait(self.linger_s if self._sending() else IDLE_WAKE_S)
            self._wake.clear()
            self._send_spooled()

    def respool_unverified_locked(self) -> None:
        """At stop, the lock held: what was acknowledged but not confirmed goes back in the spool.

        The broker was restarting or unreachable when the run stopped; ``metricbus sync`` (or
        the next run with this spool) sends it again, and consumers drop what arrived twice.
        """
        records = self.window.unconfirmed_records() if self.transport.unverified else []
        if not records:
            return
        try:
            self.spool.append(records)
            self.spool.sync()
        except OSError as exc:
            log.error("cannot put %d unchecked records back in %s (%s)", len(records), self.spool.path, exc)
            return
        log.warning(
            "%s acknowledged %d records that could not be checked before the run stopped (the broker "
            "was restarting or unreachable); they are back in %s: `metricbus sync` sends them again",
            self.describe_target(),
            len(records),
            self.spool.path,
        )

    # -- internals ------------------------------------------------------------------------

    def _send_spooled(self) -> None:
        while time.monotonic() >= self.next_attempt:
            if self.window.due and not self._send_retained():
                return
            if not self._send_due():
                return
            with self.turns.sender():
                pending = self.spool.read_unsent(max_records=64)
            if not pending:
                # a flush's check comes once all is sent: not while the spooler still holds some
                self._verify(force=self.flushers > 0 and not self.queue)
                return
            records = [record for record, _ in pending]
            if not self._send(records):
                return
            with self.turns.sender():
                self.spool.commit(pending[-1][1])
            self._tokens = max(0.0, self._tokens - 1)
            self.records_sent += len(pending)
            self.window.add(records)
            self._verify(force=False)

    def _connect(self) -> None:
        """Connect before there is anything to send; then say so (``connected``).

        A connect is several requests, each waiting for the GIL: begun once a training loop
        logs as fast as it can (an overload), the first one takes seconds.
        """
        try:
            connect = getattr(self.transport, "connect", None)
            if connect is not None:
                connect()
        except TransportError:
            pass  # sends try again, with their backoff; the run says where its events wait
        finally:
            self.connected.set()

    def _sending(self) -> bool:
        """Whether it has work of its own; if not, the spooler or a flush wakes it."""
        return bool(self.spool.unsent_bytes or self.window.due or self.failures or self.transport.unverified)

    def _send_due(self) -> bool:
        """Whether to send now: a flush waits, enough is spooled, or the bucket holds a send."""
        if self.flushers or self.stopping:
            return True
        now = time.monotonic()
        self._tokens = min(self.send_burst, self._tokens + (now - self._refilled) / self.send_linger_s)
        self._refilled = now
        return self._tokens >= 1 or self.spool.unsent_bytes >= self.send_batch_bytes

    def _verify(self, force: bool) -> None:
        """Ask whether the broker still holds what it acknowledged; if not, resend the window.

        At most once per VERIFY_INTERVAL_S unless ``force`` (a flush is waiting).
        """
        transport = self.transport
        now = time.monotonic()
        if not transport.unverified or (not force and now - self._verified_at < VERIFY_INTERVAL_S):
            return
        self._verified_at = now
        with self.checking:
            self._check(transport, now)

    def _check(self, transport: Transport, now: float) -> None:
        try:
            transport.verify()
        except BrokerRestarting as exc:
            self._hold(exc, now)
            return
        except TransportError:
            self._back_off(now)  # as a failed send: check again then
            return
        self._restarting_said = False
        if transport.take_lost():
            self.window.lost(self.transport.carried_over)
        else:
            self.window.confirmed()

    def _back_off(self, now: float) -> None:
        self.failures += 1
        self.next_attempt = now + min(0.25 * 2 ** (self.failures - 1), 5.0)

    def _hold(self, why: BrokerRestarting, now: float) -> None:
        """`metricbus up` restarts its broker: send nothing until the new one is ready."""
        if not self._restarting_said:
            self._restarting_said = True
            log.warning(
                "%s: the last %d acknowledged records are held and nothing is sent until the broker is back",
                why,
                self.window.unconfirmed,
            )
        self.next_attempt = now + RESTART_CHECK_S

    def _send(self, records: list[bytes]) -> bool:
        """One send; on failure, back off (and note a lost topic); True when acknowledged."""
        try:
            self.transport.send(self.key, records)
        except BrokerRestarting as exc:  # found at a reconnect: nothing was sent
            self._hold(exc, time.monotonic())
            return False
        except TransportError as exc:
            if self.transport.take_lost():  # what the broker acknowledged may be gone: resend it first
                self.window.lost(self.transport.carried_over)
                if self.window.due:
                    return False
            self._back_off(time.monotonic())
            offline = getattr(self.transport, "offline", False)  # offline: said at init
            if self.failures == 1 and not offline and not self.said_unreachable:
                log.warning(
                    "%s is unreachable (%s); events are kept in %s and sent when it is back",
                    self.describe_target(),
                    exc,
                    self.spool.path,
                )
            return False
        if self.transport.take_lost():  # found after these records: they were resent by the spool
            self.window.lost(self.transport.carried_over)
        if self.failures:
            log.warning("%s is reachable again; sending the spooled events", self.describe_target())
            self.failures = 0
        return True

    def _send_retained(self) -> bool:
        """Send the retained window again, oldest first; True when all of it was acknowledged."""
        window = self.window.to_resend()
        for start in range(0, len(window), 64):
            if not self._send(window[start : start + 64]):
                return False
        if self.window.resent(len(window)):
            log.warning(
                "%s had lost its topic (a memory-only broker restarted?): sent the last %d acknowledged "
                "records again; consumers drop the duplicates",
                self.describe_target(),
                len(window),
            )
        else:
            log.info(
                "%s was restarted by `metricbus up`, which carried over what it had acknowledged up "
                "to the last check: sent the %d records acknowledged since again",
                self.describe_target(),
                len(window),
            )
        return True
