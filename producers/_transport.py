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

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from metricbus.schemas import (
    BrokerError,
    MetricbusError,
    Settings,
    client_options,
    ensure_topics,
    make_admin,
    reach,
)

log = logging.getLogger("metricbus.producer")

#: A Kafka record batch holds at most this much before compression (a larger record goes alone).
#: Under a broker's default ``message.max.bytes`` (1 MB) whatever the compression does.
BATCH_BYTES = 1000 * 1000

#: ``Settings.compression_type`` -> Kafka's codec id in a record batch's attributes.
_CODECS = {None: 0, "gzip": 1, "zstd": 4}

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


def _unknown_leader(key: bytes) -> tuple[int, int]:
    raise TransportError("not connected")


class KafkaTransport:
    """Sends through kafka-python's network client: acks from the partition leader.

    One request in flight (order), a request per send of up to BATCH_BYTES.
    """

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
        self._client: Any = None
        self._leader: Callable[[bytes], tuple[int, int]] = _unknown_leader
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
        from kafka.errors import KafkaError
        from kafka.net.compat import KafkaNetClient

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
            # The network client under kafka-python's KafkaProducer, without the producer: this
            # thread builds each request and waits for its answer itself, which is what a send
            # here does anyway (one request in flight, every record acknowledged before the next
            # send). The producer's own sender thread, accumulator and futures would cost as much
            # CPU again a request, and as much wall time again.
            self._client = KafkaNetClient(
                **client_options(self.settings),
                client_id="metricbus-producer",
                request_timeout_ms=timeout_ms,
            )
            self._leader = self._find_leader(self._client, timeout_ms)
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
        return self._client

    def _find_leader(self, client: Any, timeout_ms: int) -> Callable[[bytes], tuple[int, int]]:
        """``key -> (partition, leader node)``, from one metadata request.

        Kafka's default partitioner over the topic's partitions (murmur2 of the key, as every
        Kafka client does).
        """
        from kafka.errors import KafkaError
        from kafka.partitioner.default import murmur2
        from kafka.protocol.metadata import MetadataRequest

        node = client.least_loaded_node(bootstrap_fallback=True)
        ask = MetadataRequest(topics=[self.topic], allow_auto_topic_creation=False, max_version=8)
        answer = client.send_and_receive(node, ask, timeout_ms)
        client.cluster.update_metadata(answer)  # the leaders' addresses, for their connections
        leaders = {}
        for topic in answer.topics:
            if topic.name == self.topic and not topic.error_code:
                leaders = {p.partition_index: p.leader_id for p in topic.partitions if not p.error_code}
        if not leaders or any(node < 0 for node in leaders.values()):
            raise KafkaError(f"{self.topic} has no leader for every partition: {leaders}")
        partitions = sorted(leaders)

        @functools.lru_cache(maxsize=64)  # a producer sends under one key: murmur2 is pure Python
        def leader(key: bytes) -> tuple[int, int]:
            partition = partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]
            return partition, leaders[partition]

        return leader

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

    def connect(self) -> None:
        """Connect now (the first send would); TransportError when it cannot."""
        if self._client is None:
            self._connect()

    def send(self, key: bytes, records: list[bytes]) -> None:
        """Send records in order; raise TransportError unless every one was acknowledged."""
        from kafka.errors import KafkaError, for_code

        if not records:
            return
        client = self._client or self._connect()
        if self._lost:  # found at reconnect: say so before sending, so the caller can resend first
            raise TransportError(f"topic {self.topic} was re-created since the last send (broker restart?)")
        try:
            partition, leader = self._leader(key)
            for batch in self._batches(key, records):
                answer = client.send_and_receive(
                    leader, self._request(partition, batch), int(self.send_timeout_s * 1000)
                )
                for topic in answer.responses:
                    for part in topic.partition_responses:
                        if part.error_code:
                            error = for_code(part.error_code).__name__
                            raise TransportError(f"broker refused the send: {error} ({part.error_message})")
            self._unverified = True
        except (KafkaError, OSError, TransportError) as exc:
            self.close()
            if isinstance(exc, TransportError):
                raise
            why = str(exc) or type(exc).__name__
            raise TransportError(f"send to {self.settings.bootstrap_servers} failed: {why}") from exc

    def _batches(self, key: bytes, records: list[bytes]) -> Iterator[Any]:
        """Kafka record batches of ``records`` in order, timestamped now.

        Each holds at most BATCH_BYTES before compression; a larger record goes alone.
        """
        from kafka.record.memory_records import MemoryRecordsBuilder

        codec = _CODECS[self.settings.compression_type]
        now_ms = int(time.time() * 1000)
        builder = MemoryRecordsBuilder(2, codec, BATCH_BYTES)
        for record in records:
            if builder.append(now_ms, key, record) is None:  # full: this record starts the next
                builder.close()
                yield builder
                builder = MemoryRecordsBuilder(2, codec, BATCH_BYTES)
                if builder.append(now_ms, key, record) is None:  # an empty batch takes any record
                    raise TransportError(f"a record of {len(record)} bytes was refused by an empty batch")
        builder.close()
        yield builder

    def _request(self, partition: int, batch: Any) -> Any:
        from kafka.protocol.producer import ProduceRequest

        topic = ProduceRequest.TopicProduceData
        data = topic.PartitionProduceData(index=partition, records=batch.buffer())
        return ProduceRequest(
            transactional_id=None,
            acks=1,  # the partition leader's
            timeout_ms=int(self.send_timeout_s * 1000),
            topic_data=[topic(name=self.topic, partition_data=[data])],
            max_version=9,
        )

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
        net, self._client = self._client, None
        admin, self._admin = self._admin, None
        for client in (net, admin):
            if client is not None:
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - closing a broken client must never raise here
                    log.debug("closing a Kafka client raised", exc_info=True)


class OfflineTransport:
    """Sends nothing: offline mode keeps every event in the spool for ``metricbus sync``."""

    offline = True
    carried_over = False

    def send(self, key: bytes, records: list[bytes]) -> None:
        """Refuse; the records stay spooled."""
        raise TransportError("offline mode")

    def take_lost(self) -> bool:
        """Never: nothing was sent."""
        return False

    unverified = False

    def verify(self) -> None:
        """Nothing to check."""

    def close(self) -> None:
        """Nothing to release."""
