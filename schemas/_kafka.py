"""The one home of Kafka clients: every consumer, producer and admin client is built here.

Security options, fetch waits and group timeouts come from Settings in one place. Clients are
imported lazily so importing metricbus never pays for them. Reading a whole topic once
(:func:`read_topic`) ends at the high watermark from Fetch responses: the embedded broker
answers ListOffsets LATEST with the last batch's base offset + 1, which would stop a reader early.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from ._errors import BrokerError
from ._settings import Settings

log = logging.getLogger("metricbus")


class _ClosedSocketRead(logging.Filter):
    """Drops kafka-python's traceback for a read of a socket its own ``close()`` took away.

    kafka-python 3.0.12 runs each client's network on an IO thread, while ``close()`` on the
    caller's thread shuts the transports: a read the IO thread had begun then finds the socket
    gone and logs "Error receiving network data closing socket" with an AttributeError
    traceback (a dashboard's log at shutdown, one `make test` in about ten). Nothing is lost:
    the transport was closed on purpose. Any other read error is still logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        transport = record.args[0] if isinstance(record.args, tuple) and record.args else None
        closed = getattr(transport, "_closed", False) and getattr(transport, "_sock", True) is None
        return not (closed and record.exc_info and isinstance(record.exc_info[1], AttributeError))


class _ClosedSocketWait(logging.Filter):
    """The same race, seen from the IO thread's scheduler.

    A task waiting to read a socket that ``close()`` already took away fails to register it
    ("Unhandled exception in task", a ValueError for file descriptor -1); or, woken with data
    just as ``close()`` detached the transport's protocol, hands the data to no protocol (an
    AttributeError on ``data_received``: the dashboard's samplers close a client after each
    dead-letter count, so it comes now and then in normal work). Only those exceptions of that
    line are dropped: the transport was closed on purpose, and what it read was for no one.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        no_protocol = "'NoneType' object has no attribute 'data_received'"
        closed = (isinstance(exc, ValueError) and str(exc) == "Invalid file descriptor: -1") or (
            isinstance(exc, AttributeError) and str(exc) == no_protocol
        )
        return not (closed and str(record.msg).startswith("Unhandled exception in task"))


logging.getLogger("kafka.net.transport").addFilter(_ClosedSocketRead())
logging.getLogger("kafka.net.selector").addFilter(_ClosedSocketWait())


def _security(settings: Settings) -> dict[str, Any]:
    opts: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.security_protocol.startswith("SASL"):
        opts.update(
            sasl_mechanism=settings.sasl_mechanism,
            sasl_plain_username=settings.sasl_username,
            sasl_plain_password=settings.sasl_password,
        )
    return opts


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for SSL / SASL_SSL, else None."""
    if not settings.security_protocol.endswith("SSL"):
        return None
    ctx = ssl.create_default_context(cafile=settings.ssl_cafile)
    if settings.ssl_certfile:
        ctx.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    return ctx


def client_options(settings: Settings) -> dict[str, Any]:
    """Connection and security options; kafka-python and aiokafka take the same names."""
    opts = {"bootstrap_servers": settings.bootstrap_servers, **_security(settings)}
    ctx = ssl_context(settings)
    if ctx is not None:
        opts["ssl_context"] = ctx
    return opts


def consumer_group_options(settings: Settings) -> dict[str, Any]:
    """Group timeouts for aiokafka consumers (short locally, see Settings)."""
    return {
        "session_timeout_ms": settings.session_timeout_ms,
        "rebalance_timeout_ms": settings.rebalance_timeout_ms,
        "heartbeat_interval_ms": settings.heartbeat_interval_ms,
    }


def fetch_options(settings: Settings) -> dict[str, Any]:
    """Fetch settings for aiokafka consumers (see ``Settings.fetch_max_wait_ms``)."""
    return {"fetch_max_wait_ms": settings.fetch_max_wait_ms}


#: Seconds without a record after which a consumer's fetches wait ``idle_fetch_max_wait_ms``.
IDLE_AFTER_S = 2.0


class FetchWait:
    """A consumer's fetch wait: the short one while records come, the idle one after a quiet spell.

    The embedded broker holds a fetch for its whole wait whenever a partition in it has nothing
    new, so the wait stays short (``Settings.fetch_max_wait_ms``) while records flow; an idle
    consumer on it asks ten or twenty times a second, and each ask costs CPU in the consumer and
    the broker. After ``idle_after_s`` without a record it asks with
    ``Settings.idle_fetch_max_wait_ms``; its next record brings the short wait back. Call
    :meth:`saw` after every poll. ``set_wait`` changes the client's wait (:meth:`of_aiokafka`,
    :meth:`of_kafka_python`: each client reads it when it builds its next fetch).
    """

    def __init__(
        self,
        set_wait: Callable[[int], None],
        busy_ms: int,
        idle_ms: int,
        idle_after_s: float = IDLE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.busy_ms, self.idle_ms, self.idle_after_s = busy_ms, idle_ms, idle_after_s
        self._set, self._clock = set_wait, clock
        self._last = clock()
        self.idle = False

    @classmethod
    def of_aiokafka(cls, consumer: Any, settings: Settings) -> FetchWait:
        """For a started aiokafka consumer (its Fetcher reads ``_fetch_max_wait_ms`` per fetch)."""

        def set_wait(ms: int) -> None:
            consumer._fetcher._fetch_max_wait_ms = ms

        return cls(set_wait, settings.fetch_max_wait_ms, settings.idle_fetch_max_wait_ms)

    @classmethod
    def of_kafka_python(cls, consumer: Any, settings: Settings) -> FetchWait:
        """For a kafka-python consumer (its Fetcher reads ``config['fetch_max_wait_ms']`` per fetch)."""

        def set_wait(ms: int) -> None:
            consumer._fetcher.config["fetch_max_wait_ms"] = ms

        return cls(set_wait, settings.fetch_max_wait_ms, settings.idle_fetch_max_wait_ms)

    def saw(self, records: int) -> None:
        """After a poll that returned ``records`` records."""
        now = self._clock()
        if records:
            self._last = now
            if self.idle:
                self.idle = False
                self._set(self.busy_ms)
        elif not self.idle and self.idle_ms > self.busy_ms and now - self._last >= self.idle_after_s:
            self.idle = True
            self._set(self.idle_ms)


def ensure_topics(settings: Settings, timeout_s: float = 10.0, admin: Any = None) -> list[str]:
    """Create any missing metricbus topic (idempotent); return the names it created.

    The events, aggregates and alerts topics get ``settings.partitions`` partitions; the
    dead-letter and alive topics one. Raises BrokerError when the broker cannot be reached. ``admin``:
    a KafkaAdminClient of the caller's to use (and leave open) instead of connecting one.
    """
    topics = settings.topics
    return _create_topics(
        settings,
        {n: 1 if n in (topics.deadletter, topics.alive) else settings.partitions for n in topics.all()},
        timeout_s,
        admin,
    )


def make_admin(settings: Settings, client_id: str, timeout_s: float = 10.0, **overrides: Any) -> Any:
    """The one kafka-python admin client set-up (the caller closes it).

    ``timeout_s`` bounds each request and the bootstrap; ``overrides`` are KafkaAdminClient options.
    """
    from kafka.admin import KafkaAdminClient

    ms = int(timeout_s * 1000)
    opts: dict[str, Any] = {
        **client_options(settings),
        "request_timeout_ms": ms,
        "bootstrap_timeout_ms": ms,
        "client_id": client_id,
    }
    opts.update(overrides)
    return KafkaAdminClient(**opts)


def mark_broker_restarting(settings: Settings, timeout_s: float = 10.0) -> None:
    """Create the ``restarting`` marker topic (see ``Topics.restarting``). Raises BrokerError."""
    _create_topics(settings, {settings.topics.restarting: 1}, timeout_s)


def mark_carried_over(settings: Settings, timeout_s: float = 10.0) -> str:
    """Create the ``carried`` marker of the events topic as it is now; its name.

    Raises BrokerError (also when the topic has no id to name it by).
    """
    from kafka.errors import KafkaError

    from ._errors import BrokerError

    try:
        admin = make_admin(settings, "metricbus-admin", timeout_s)
        try:
            (found,) = admin.describe_topics([settings.topics.events])
            if found["error_code"] or not found.get("topic_id"):
                raise BrokerError(f"{settings.topics.events} has no topic id on {settings.bootstrap_servers}")
            name = settings.topics.carried(str(found["topic_id"]))
            _create_topics(settings, {name: 1}, timeout_s, admin)
        finally:
            admin.close()
    except KafkaError as exc:
        raise BrokerError(f"marking the carry-over on {settings.bootstrap_servers} failed: {exc}") from exc
    return name


def unmark_broker_restarting(settings: Settings, timeout_s: float = 10.0) -> None:
    """Delete the ``restarting`` marker topic: the restarted broker is ready for producers.

    Raises BrokerError (a marker left in place holds every live producer's sends).
    """
    from kafka.errors import KafkaError, UnknownTopicOrPartitionError

    from ._errors import BrokerError

    try:
        admin = make_admin(settings, "metricbus-admin", timeout_s)
        try:
            admin.delete_topics([settings.topics.restarting], timeout_ms=int(timeout_s * 1000))
        except UnknownTopicOrPartitionError:
            pass  # already gone: the state we want
        finally:
            admin.close()
    except KafkaError as exc:
        raise BrokerError(
            f"deleting {settings.topics.restarting} on {settings.bootstrap_servers} failed: {exc}"
        ) from exc


def _create_topics(
    settings: Settings, wanted: dict[str, int], timeout_s: float, admin: Any = None
) -> list[str]:
    """Create the topics of ``wanted`` (name: partitions) that are missing; return those created."""
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    from ._errors import BrokerError

    own = admin is None
    try:
        if own:
            admin = make_admin(settings, "metricbus-admin", timeout_s)
    except KafkaError as exc:
        raise BrokerError(
            f"cannot reach Kafka at {settings.bootstrap_servers} to create topics: {exc}. "
            "Start the local stack with `metricbus up`, or set METRICBUS_BOOTSTRAP."
        ) from exc
    try:
        existing = set(admin.list_topics())
        created = []
        for name, partitions in wanted.items():
            if name in existing:
                continue
            topic = NewTopic(
                name, partitions, 1, topic_configs={"max.message.bytes": str(MAX_RECORD_BYTES + 64 * 1024)}
            )
            try:
                admin.create_topics([topic])
                created.append(name)
            except TopicAlreadyExistsError:
                pass  # another process won the race: that is the state we want
        return created
    except KafkaError as exc:
        raise BrokerError(f"creating topics on {settings.bootstrap_servers} failed: {exc}") from exc
    finally:
        if own:
            admin.close()


#: The largest record metricbus writes or reads (the producer caps its batches below it);
#: a topic on a real cluster needs ``max.message.bytes`` at least this large.
MAX_RECORD_BYTES = 8 * 1024 * 1024


def make_consumer(
    settings: Settings,
    *topics: str,
    group_id: str | None = None,
    client_id: str = "metricbus",
    **overrides: Any,
) -> Any:
    """The one aiokafka consumer set-up: security, fetch wait, group timeouts, manual commits.

    With ``group_id`` it joins that group (subscribe to ``topics``); without, assign
    partitions yourself. Reads from the earliest offset when the group has none.
    """
    from aiokafka import AIOKafkaConsumer

    opts: dict[str, Any] = {
        **client_options(settings),
        **fetch_options(settings),
        "client_id": client_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": MAX_RECORD_BYTES + 64 * 1024,
        "fetch_max_bytes": 4 * (MAX_RECORD_BYTES + 64 * 1024),
    }
    if group_id is not None:
        opts.update(consumer_group_options(settings), group_id=group_id, metadata_max_age_ms=5000)
    opts.update(overrides)
    return AIOKafkaConsumer(*topics, **opts)


def make_producer(settings: Settings, client_id: str = "metricbus", **overrides: Any) -> Any:
    """The one aiokafka producer set-up (acks=1; records up to MAX_RECORD_BYTES)."""
    from aiokafka import AIOKafkaProducer

    opts: dict[str, Any] = {
        **client_options(settings),
        "client_id": client_id,
        "enable_idempotence": False,
        "acks": 1,
        "max_request_size": MAX_RECORD_BYTES + 64 * 1024,
    }
    opts.update(overrides)
    return AIOKafkaProducer(**opts)


def unreachable(settings: Settings, timeout_s: float = 2.0) -> list[str]:
    """Each bootstrap server with why it refused a TCP connection; empty once one accepts.

    Needs no Kafka client (importing kafka-python alone costs 0.3-0.45 s of CPU).
    """
    refused = []
    for server in settings.bootstrap_servers.split(","):
        host, colon, port = server.strip().rpartition(":")
        if not colon:  # a host alone: Kafka's port, as kafka-python takes it
            host, port = port, "9092"
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return []
        except (OSError, ValueError) as exc:
            refused.append(f"{server.strip()} ({exc})")
    return refused


def reach(settings: Settings, timeout_s: float = 2.0) -> None:
    """Raise kafka's KafkaConnectionError now when no bootstrap server accepts a TCP connection.

    kafka-python tries to bootstrap for about 25 s before it gives up: the dashboard's pipeline
    page and ``status`` showed nothing for that long with the broker down, and again at each
    sample. A server that accepts but does not answer as Kafka is still left to kafka-python.
    """
    refused = unreachable(settings, timeout_s)
    if refused:
        from kafka.errors import KafkaConnectionError

        raise KafkaConnectionError(f"no broker answers at {'; '.join(refused)}")


def wait_for_broker(settings: Settings, wait_s: float | None, who: str) -> None:
    """Return once something accepts a connection at the bootstrap address; wait with backoff till then.

    Says once that it waits (and once that it goes on), as a container started before Kafka
    should. ``wait_s``: give up after this long with BrokerError (None: wait for ever).
    """
    deadline = None if wait_s is None else time.monotonic() + wait_s
    delay, said = 0.5, False
    # no Kafka client here: the sinks and the alert consumers (aiokafka) never import kafka-python
    while refused := unreachable(settings):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise BrokerError(
                f"no broker answered at {'; '.join(refused)} within {wait_s:g}s; start one "
                "(`metricbus up`), or point --bootstrap / METRICBUS_BOOTSTRAP at one"
            )
        if not said:
            said = True
            log.warning(
                "%s: no broker answers at %s yet; waiting for it (retrying with backoff%s)",
                who,
                settings.bootstrap_servers,
                "" if wait_s is None else f", for at most {wait_s:g}s",
            )
        time.sleep(delay if left is None else max(0.0, min(delay, left)))
        delay = min(delay * 2, 5.0)
    if said:
        log.warning("%s: the broker at %s answers; starting", who, settings.bootstrap_servers)


#: how long a one-shot read (``status``) polls at a time: kafka-python's poll that brings no
#: record waits out its whole timeout, while a partition's end comes with the first fetch answer
ONE_SHOT_POLL_MS = 20

#: how long the broker holds a one-shot reader's fetch at a partition's end (its default, 100 ms,
#: is for followers: they want records, a one-shot read wants the end)
ONE_SHOT_FETCH_WAIT_MS = 10


def topic_reader(settings: Settings, client_id: str, **overrides: Any) -> Any:
    """The one kafka-python consumer of the ops tools: no group, no commits, records up to the limit.

    ``status``, the dashboard's run board and the dead-letter count read with it (on threads of
    their own, so a synchronous client); raises kafka's KafkaError when Kafka is unreachable
    (at once when nothing listens: :func:`reach`).
    """
    from kafka import KafkaConsumer

    reach(settings)

    opts: dict[str, Any] = {
        **client_options(settings),
        "client_id": client_id,
        "enable_auto_commit": False,
        "fetch_max_wait_ms": settings.fetch_max_wait_ms,
        "max_partition_fetch_bytes": MAX_RECORD_BYTES + 64 * 1024,
        "request_timeout_ms": 10_000,
    }
    opts.update(overrides)
    return KafkaConsumer(**opts)


def read_topic(
    settings: Settings,
    topic: str,
    idle_s: float = 1.0,
    timeout_s: float = 30.0,
    starts: dict[int, int] | None = None,
    keep: Callable[[Any], bool] | None = None,
) -> list[Any]:
    """Every record of ``topic`` in partition order (no consumer group).

    From the beginning, or per partition from the offset in ``starts``. ``keep``: only the
    records it returns True for are returned (it sees every one; the rest are not held).
    """
    import asyncio  # imported here: ``status`` and a training script never pay for it

    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def main() -> list[Any]:
        consumer = AIOKafkaConsumer(
            **client_options(settings),
            **fetch_options(settings),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        try:  # started inside: one that cannot reach the broker is stopped too (else "Unclosed")
            await consumer.start()
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                await consumer._client.force_metadata_update()
                partitions = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            if not tps:
                return []
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            for tp in tps:
                if starts and starts.get(tp.partition):
                    consumer.seek(tp, starts[tp.partition])
            out: list[Any] = []
            deadline = time.monotonic() + timeout_s
            last_data = time.monotonic()
            while time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    out.extend(records if keep is None else filter(keep, records))
                    last_data = time.monotonic()
                caught_up = True
                for tp in tps:
                    high = consumer.highwater(tp)
                    caught_up = caught_up and high is not None and await consumer.position(tp) >= high
                if caught_up or time.monotonic() - last_data > idle_s:
                    break
            return out
        finally:
            await consumer.stop()

    return asyncio.run(main())


#: When a consumer was last alive: its commits carry it in each offset's metadata, and it says it
#: on the alive topic (``Topics.alive``; the embedded broker keeps no commit metadata). Brokers
#: say who is in a group, not when it last committed, and the embedded broker keeps a member that
#: died in its group. ``metricbus status`` reads both to tell a consumer alive and slow from one
#: stopped.
ALIVE_PREFIX = "metricbus alive "


def alive_stamp() -> str:
    """The metadata a commit carries: this moment, in milliseconds since the epoch."""
    return f"{ALIVE_PREFIX}{int(time.time() * 1000)}"


def alive_at(metadata: Any) -> float | None:
    """When the committing consumer was alive (epoch seconds), from a commit's metadata; None if unsaid."""
    if not isinstance(metadata, str) or not metadata.startswith(ALIVE_PREFIX):
        return None
    try:
        return int(metadata[len(ALIVE_PREFIX) :]) / 1000
    except ValueError:
        return None
