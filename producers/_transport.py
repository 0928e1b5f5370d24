"""Sending encoded records to Kafka from the publisher thread (kafka-python).

Any failure closes the client; the next send reconnects and re-creates missing topics, which
is what a restarted memory-only broker needs (it forgets every topic). A topic this transport had
sent to is left a few seconds to whoever restarted the broker, and nothing is sent while
``metricbus up``'s ``restarting`` marker exists: the records it carries over go first.

A send counts as delivered only if, after the acknowledgement, the topic still has the topic
id it had when we connected. Reason, measured here: when the embedded broker (Tansu) restarts
at the same address, kafka-python reconnects by itself and the new broker *acknowledges*
produce requests for the topic it no longer has, keeping nothing. Checking the topic id
(one metadata round trip, ~1 ms) turns that silent loss into a resend.
"""

from __future__ import annotations

import atexit
import logging
import time
from typing import Any, Protocol

from metricbus.schemas import (
    MAX_RECORD_BYTES,
    BrokerError,
    MetricbusError,
    Settings,
    client_options,
    ensure_topics,
    make_admin,
    reach,
)

log = logging.getLogger("metricbus.producer")

#: Seconds a producer waits, after finding gone a topic it had sent to, for whoever restarted
#: the broker to create it again before creating it itself (``KafkaTransport._hold_unless_ready``).
TOPIC_WAIT_S = 5.0


class TransportError(MetricbusError):
    """A send was not acknowledged; the records stay in the spool and are retried."""

    retriable = True


class BrokerRestarting(TransportError):
    """The broker is being restarted on purpose (``Topics.restarting`` exists).

    What it acknowledged since may not reach the new one, so nothing counts as delivered yet.
    """


class Transport(Protocol):
    """Where the publisher sends records. ``send`` raises TransportError unless all were acked."""

    def send(self, key: bytes, records: list[bytes]) -> None:
        """Send ``records`` in order under ``key``; return only once all are acknowledged."""

    def take_lost(self) -> bool:
        """True once after the broker was seen to have lost the topic (a memory-only restart)."""

    #: after ``take_lost``: the new topic holds what was acknowledged up to the last passing
    #: :meth:`verify` (``metricbus up`` carried it over), so only what came after is sent again
    carried_over: bool

    @property
    def unverified(self) -> bool:
        """Records were acknowledged since the last :meth:`verify`."""

    def verify(self) -> None:
        """Check that what was acknowledged is still there (``take_lost`` then says so).

        May raise TransportError.
        """

    def close(self) -> None:
        """Release connections; idempotent."""


class KafkaTransport:
    """kafka-python producer: acks from the partition leader, one request in flight (order)."""

    def __init__(self, settings: Settings, send_timeout_s: float = 5.0) -> None:
        # kafka-python logs every refused connection at ERROR, several lines a second while the
        # broker is down; the run says so once itself. A level the user set is left alone.
        kafka_log = logging.getLogger("kafka")
        if kafka_log.level == logging.NOTSET:
            kafka_log.setLevel(logging.CRITICAL)
        self.settings = settings
        self.topic = settings.topics.events
        self.send_timeout_s = send_timeout_s
        self._unverified = False
        self._producer: Any = None
        self._admin: Any = None
        self._topic_id: str | None = None
        self._lost = False
        self.carried_over = False
        self._had_topic = False  # connected once: a topic gone since is not ours to create at once
        self._gone_since: float | None = None
        #: the last connect found nothing listening at the bootstrap address (refused at once,
        #: not a broker that is slow or restarting): a flush need not wait for it
        self.refused = False

    def take_lost(self) -> bool:
        """True once after the topic was found lost or re-created (what it held may be gone)."""
        lost, self._lost = self._lost, False
        return lost

    def _open_admin(self) -> Any:
        """The admin client: creates the topics at a connect, checks them after sends."""
        if self._admin is None:
            timeout_ms = int(self.send_timeout_s * 1000)
            self._admin = make_admin(
                self.settings,
                "metricbus-producer-check",
                self.send_timeout_s,
                bootstrap_timeout_ms=min(timeout_ms, 3000),
            )
        return self._admin

    def _connect(self) -> Any:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        timeout_ms = int(self.send_timeout_s * 1000)
        try:
            reach(self.settings, timeout_s=min(self.send_timeout_s, 1.0))  # nothing listening: now
        except KafkaError as exc:
            self.refused = True
            self.close()
            raise TransportError(f"cannot connect to {self.settings.bootstrap_servers}: {exc}") from exc
        self.refused = False
        try:
            self._open_admin()
            found, restarting = self._current_topic_id()
            self._hold_unless_ready(found, restarting)
            created = ensure_topics(self.settings, admin=self._admin)
            self._producer = KafkaProducer(
                **client_options(self.settings),
                client_id="metricbus-producer",
                acks=1,
                enable_idempotence=False,  # InitProducerId is not available on every broker
                max_in_flight_requests_per_connection=1,
                retries=2,
                linger_ms=0,
                max_block_ms=timeout_ms,
                request_timeout_ms=timeout_ms,
                delivery_timeout_ms=timeout_ms * 2,
                bootstrap_timeout_ms=timeout_ms,
                max_request_size=MAX_RECORD_BYTES + 64 * 1024,
                allow_auto_create_topics=False,
                metrics_enabled=False,  # its sensors, never read: 0.53 -> 0.48 ms of CPU a request
                compression_type=self.settings.compression_type,
            )
            # kafka-python closes each producer at interpreter exit; atexit runs last-registered
            # first, so that would close it before a run's own exit-time finish() (registered at
            # init, earlier) flushed through it: "KafkaProducer already closed", all spooled.
            # close() here is ours to call.
            cleanup = getattr(self._producer, "_cleanup", None)
            if cleanup is not None:
                atexit.unregister(cleanup)
            if found is None or self.topic in created:  # its id is the new topic's
                found = self._current_topic_id()[0]
            previous, self._topic_id = self._topic_id, found
            if previous is not None and self._topic_id != previous:
                self._note_lost()  # reconnected to a broker that re-created the topic
            self._had_topic, self._gone_since = True, None
        except BrokerRestarting:
            self.close()
            raise
        except (KafkaError, BrokerError, OSError) as exc:
            self.close()
            raise TransportError(f"cannot connect to {self.settings.bootstrap_servers}: {exc}") from exc
        return self._producer

    def _hold_unless_ready(self, topic_id: str | None, restarting: bool) -> None:
        """Raise BrokerRestarting while a connect must not send (nor create the topic) yet.

        While ``metricbus up`` restarts its broker (the marker exists), and for up to
        ``TOPIC_WAIT_S`` after finding gone a topic this transport had sent to: the one who
        restarted the broker creates the topics (``up`` creates its marker first, then the
        topics, publishes what the consumers had not read, then deletes the marker), and what a
        producer sent before that would go before the carried records. After that wait (a broker
        restarted by hand) the producer creates the topic itself.
        """
        if restarting:
            raise BrokerRestarting(f"{self.settings.bootstrap_servers} is restarting (planned)")
        if topic_id is not None or not self._had_topic:
            return
        now = time.monotonic()
        if self._gone_since is None:
            self._gone_since = now
        if now - self._gone_since < TOPIC_WAIT_S:
            raise BrokerRestarting(
                f"{self.topic} is gone from {self.settings.bootstrap_servers} (the broker restarted?): "
                f"waiting up to {TOPIC_WAIT_S:.0f} s for it to be created again"
            )

    def send(self, key: bytes, records: list[bytes]) -> None:
        """Send records in order; raise TransportError unless every one was acknowledged."""
        from kafka.errors import KafkaError

        producer = self._producer or self._connect()
        if self._lost:  # found at reconnect: say so before sending, so the caller can resend first
            raise TransportError(f"topic {self.topic} was re-created since the last send (broker restart?)")
        try:
            futures = [producer.send(self.topic, key=key, value=r) for r in records]
            producer.flush(timeout=self.send_timeout_s)
            for future in futures:
                if not future.is_done:
                    raise TransportError(f"no acknowledgement within {self.send_timeout_s}s")
                if future.failed():
                    raise TransportError(f"send failed: {future.exception}")
            self._unverified = True
        except (KafkaError, OSError, TransportError) as exc:
            self.close()
            if isinstance(exc, TransportError):
                raise
            raise TransportError(f"send to {self.settings.bootstrap_servers} failed: {exc}") from exc

    @property
    def unverified(self) -> bool:
        """Records were acknowledged since the last :meth:`verify`."""
        return self._unverified

    def verify(self) -> None:
        """Ask the broker whether the topic is still the one the acknowledged records went to.

        A memory-only broker that restarted re-creates the topic empty (a new topic id): then
        ``take_lost`` says so, and the publisher sends its retained window again. One metadata
        request; the publisher calls it at most once a second while sending, and before a flush
        returns, not after every send (at a trickle of events that doubled the requests).
        """
        from kafka.errors import KafkaError

        if self._admin is None and not self._unverified:
            return
        try:
            self._open_admin()  # after a failed send closed it, acknowledged records are checked too
            current, restarting = self._current_topic_id()
        except (KafkaError, OSError) as exc:
            self.close()
            raise TransportError(f"cannot check topic {self.topic}: {exc}") from exc
        if restarting:  # `metricbus up` is carrying its broker's records over a planned restart
            # Closed, so that nothing more is sent until a connect finds the marker gone: an open
            # producer would send on to the broker about to go, and then by itself to the new one
            # before its marker and topics exist (ahead of the carried records).
            self.close()
            raise BrokerRestarting(f"{self.settings.bootstrap_servers} is restarting (planned)")
        self._unverified = False
        if current is None or current != self._topic_id:
            # Said once: what was acknowledged before is resent once. The clients are closed so
            # that the next send reconnects and creates the topic first: a producer that
            # reconnected by itself to a restarted broker keeps "delivering" to a topic that
            # does not exist there (acknowledged, kept nowhere), which a topic id of None then
            # would match forever.
            self._topic_id = current
            self._note_lost()
            self.close()

    def _note_lost(self) -> None:
        """The topic is not the one acknowledged records went to (and was it carried over?)."""
        self._lost = True
        self.carried_over = False
        if self._topic_id is None:
            return
        marker = self.settings.topics.carried(self._topic_id)
        try:
            found = self._admin.describe_topics([marker])
        except Exception as exc:  # noqa: BLE001 - not known: the whole window is sent again
            log.debug("cannot look for %s (%s)", marker, exc)
            return
        self.carried_over = any(d["name"] == marker and not d["error_code"] for d in found)

    def _current_topic_id(self) -> tuple[str | None, bool]:
        """The topic's id (None if the broker has none) and whether the broker is restarting.

        Restarting: its ``restarting`` marker exists. One metadata request.
        """
        found = {
            d["name"]: d
            for d in self._admin.describe_topics([self.topic, self.settings.topics.restarting])
            if not d["error_code"]
        }
        topic = found.get(self.topic)
        return (None if topic is None else str(topic["topic_id"])), self.settings.topics.restarting in found

    def close(self) -> None:
        """Close the clients without waiting; unacknowledged records stay in the spool."""
        producer, self._producer = self._producer, None
        admin, self._admin = self._admin, None
        for client, kwargs in ((producer, {"timeout": 0}), (admin, {})):
            if client is not None:
                try:
                    client.close(**kwargs)
                except Exception:  # noqa: BLE001 - closing a broken client must never raise here
                    log.debug("closing a Kafka client raised", exc_info=True)
