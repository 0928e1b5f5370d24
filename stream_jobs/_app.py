"""The Faust app: a thin adapter that feeds the events topic to :class:`StreamProcessor`.

Faust's cost is per record, so each record is a whole EventBatch and each input record
produces at most one AggregateBatch record per run; the statistics are plain Python objects
(``_stats``, ``_derive``, ``_alerts``) with no Faust import.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from pathlib import Path
from typing import Any

from metricbus.schemas import (
    MAX_RECORD_BYTES,
    FetchWait,
    ForgedSignatureError,
    LoopMetrics,
    RecordDigests,
    SchemaError,
    Settings,
    dead_letter,
    decode_record,
    default_codec,
    encode_aggregates,
    record_span,
    ssl_context,
)

from ._checkpoint import partition_path, write
from ._partitions import PartitionedState
from ._rebuild import committed_offsets

log = logging.getLogger("metricbus.stream")


def _credentials(settings: Settings) -> Any:
    import faust

    ctx = ssl_context(settings)
    if settings.security_protocol.startswith("SASL"):
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=ctx,
        )
    return faust.SSLCredentials(ctx) if ctx is not None else None


def _patch_fetch_wait() -> None:
    """Let a Faust app choose its consumer's fetch wait (``app.fetch_max_wait_ms``).

    faust-streaming 0.15.3 hard-codes ``fetch_max_wait_ms=1500`` in its aiokafka driver; on
    the embedded broker that stalled the worker 1.5 s per fetch whenever one of its
    partitions had nothing new (measured: 26k events/s instead of 88k over a full topic).
    The wrapper sets aiokafka's attribute before the consumer starts, which is when aiokafka
    reads it, and keeps the consumer as ``app.kafka_consumer``: the app's :class:`FetchWait`
    changes the wait of its running fetcher when the worker falls idle and when it wakes.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    create = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(create, "metricbus", False):
        return

    def create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        wait_ms = getattr(self.app, "fetch_max_wait_ms", None)
        if wait_ms is not None:
            consumer._fetch_max_wait_ms = wait_ms
        self.app.kafka_consumer = consumer  # for the app's FetchWait, once it has started
        return consumer

    create_worker_consumer.metricbus = True  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._create_worker_consumer = create_worker_consumer  # type: ignore[method-assign]


#: the cyclic collector's thresholds in the worker (CPython's are 700, 10, 10)
COLLECTOR_THRESHOLDS = (10_000, 10, 10)


def settle_heap() -> None:
    """Keep CPython's cyclic collector off what the worker built before its first record.

    The worker allocates a tuple per derived point (hundreds of thousands a second), each
    young collection of 700 of them paid for, and every full collection walked Faust's and
    aiokafka's import-time objects too. Called once the app is built: those move to the
    permanent generation (``gc.freeze``), and young collections come every 10,000
    allocations. Reference counting frees all the worker makes; the collector remains for
    cycles. Measured on the bench's records in one process: 366-474k events/s before,
    480-560k after.
    """
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def group_id(settings: Settings) -> str:
    """The stream worker's consumer group (Faust's app id)."""
    return settings.groups.stream


def build_app(settings: Settings, state: PartitionedState | None = None) -> Any:
    """The stream worker's Faust app (consumer group :func:`group_id`).

    ``state`` holds one processor per partition of the events topic this worker owns (see
    :mod:`stream_jobs._partitions`): a partition's state is rebuilt when the partition is
    assigned, and checkpointed (when ``state.directory`` is set) every
    ``settings.checkpoint_interval_s``, when the partition is revoked and at shutdown. Any number of workers
    may run in the group; their output equals one uninterrupted worker's.
    """
    import faust

    topics = settings.topics
    datadir = Path(settings.data_dir) / "stream" / "faust"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    codec = default_codec()
    state = state or PartitionedState(settings)
    app = faust.App(
        group_id(settings),
        broker=[f"kafka://{server}" for server in settings.bootstrap_servers.split(",")],
        broker_credentials=_credentials(settings),
        value_serializer="raw",
        key_serializer="raw",
        store="memory://",
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_allow_declare=False,  # metricbus creates its topics (metricbus up / metricbus topics)
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
        broker_rebalance_timeout=settings.rebalance_timeout_ms / 1000,
        consumer_auto_offset_reset="earliest",
        producer_acks=1,
        producer_compression_type=settings.compression_type,  # as the training jobs send
        producer_max_request_size=MAX_RECORD_BYTES + 64 * 1024,
        # a batch may hold several outputs (a smoothed point every 10 steps of every metric makes
        # records of tens of kB): at aiokafka's 16 kB each went out in a request of its own
        producer_max_batch_size=MAX_RECORD_BYTES + 64 * 1024,
        consumer_max_fetch_size=MAX_RECORD_BYTES + 64 * 1024,
        datadir=str(datadir),  # never the user's working directory
    )
    app.partition_state = state  # type: ignore[attr-defined]  # for tests and status
    unacked: set[Any] = set()  # outputs not yet acknowledged by the broker
    digests = RecordDigests()  # a record repeated with other bytes is forged: not a repeat
    signer = settings.signer  # with a signing key, a record without its HMAC is forged
    badly_signed = 0
    _patch_fetch_wait()
    app.fetch_max_wait_ms = settings.worker_fetch_max_wait_ms  # type: ignore[attr-defined]
    app.kafka_consumer = None  # type: ignore[attr-defined]

    def set_fetch_wait(ms: int) -> None:
        fetcher = getattr(app.kafka_consumer, "_fetcher", None)  # type: ignore[attr-defined]
        if fetcher is not None:  # aiokafka reads it as it builds each fetch
            fetcher._fetch_max_wait_ms = ms

    fetch_wait = FetchWait(set_fetch_wait, settings.worker_fetch_max_wait_ms, settings.idle_fetch_max_wait_ms)
    events = app.topic(topics.events, value_serializer="raw", key_serializer="raw")
    aggregates = app.topic(topics.aggregates, value_serializer="raw", key_serializer="raw")
    alerts = app.topic(topics.alerts, value_serializer="raw", key_serializer="raw")
    deadletter = app.topic(topics.deadletter, value_serializer="raw", key_serializer="raw")

    def publish(output: Any) -> None:
        # send_soon: into the producer's buffer, no await per record (measured: awaiting
        # send() cost ~2.6 ms per input record and capped the worker at ~28k events/s).
        # Faust flushes its producer before it commits source offsets: still at-least-once.
        for record in output.aggregate_batches():
            key = record["run_id"].encode()
            _track(aggregates.send_soon(key=key, value=encode_aggregates(codec, **record)))
        for alert in output.alerts:
            log.warning(
                "alert %s %s [%s] run %s: %s",
                alert["state"],
                alert["rule"],
                alert["severity"],
                alert["run_id"],
                alert["message"],
            )
            _track(alerts.send_soon(key=alert["run_id"].encode(), value=codec.encode("Alert", alert)))

    metrics = LoopMetrics("worker", group_id(settings))
    counts = dict.fromkeys(metrics.names, 0)  # cheap adds per record; the counters follow each second

    def _track(future: Any) -> None:
        unacked.add(future)
        future.add_done_callback(unacked.discard)

    async def bury(message: Any, why: BaseException) -> None:
        """The record to the dead-letter topic with the reason, counted and said."""
        log.error(
            "record %s[%d]@%d not processed (%s: %s); sent to %s",
            message.topic,
            message.partition,
            message.offset,
            type(why).__name__,
            why,
            topics.deadletter,
            exc_info=not isinstance(why, SchemaError),  # a bug of ours: its traceback
        )
        letter = dead_letter(
            message.value,
            message.key,
            f"{type(why).__name__}: {why}",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            consumer=group_id(settings),
        )
        await deadletter.send(key=letter.key, value=letter.value, headers=dict(letter.headers))
        counts["deadlettered"] += 1

    async def handle(message: Any) -> None:
        """Process one record of the events topic (Faust's message or aiokafka's record) and publish."""
        nonlocal badly_signed
        try:
            signer.check(message.value)
            batch, columns = decode_record(codec, message.value)
            digests.check(message.value, record_span(batch, columns))  # a forged repeat: buried
        except SchemaError as exc:
            badly_signed += isinstance(exc, ForgedSignatureError)
            counts["forged"] = digests.forged + badly_signed
            await bury(message, exc)
        else:
            processor = await state.ensure(message.partition, message.offset)
            started = time.perf_counter()
            forgotten = processor.forgotten_for_memory
            try:
                output = processor.process_record(batch, columns)
            except Exception as exc:  # noqa: BLE001 - one record must not stop the worker
                await bury(message, exc)
            else:
                publish(output)
                metrics.observe(time.perf_counter() - started)
                counts["events"] += len(batch) + (len(columns.seqs) if columns is not None else 0)
                counts["outputs"] += sum(map(len, output.points.values()))
                counts["alerts"] += len(output.alerts)
                counts["forgotten_runs"] += processor.forgotten_for_memory - forgotten
        counts["records"] += 1
        state.advance(message.partition, message.offset)

    @app.agent(events)
    async def derive(stream: Any) -> None:
        async for event in stream.events():
            fetch_wait.saw(1)
            message = event.message
            for skipped in await state.undelivered(message.partition, message.offset):
                await handle(skipped)
            await handle(message)

    @app.timer(1.0)
    async def stalled_runs() -> None:
        fetch_wait.saw(0)  # a second with no record may make the worker idle
        for out in state.tick(int(time.time() * 1000)):
            if out.alerts or out.points or out.closing:
                publish(out)
                counts["alerts"] += len(out.alerts)
        metrics.update(counts)

    writing = asyncio.Lock()  # the timer and a revocation may both checkpoint: one at a time

    async def checkpoint(partitions: list[int], why: str) -> None:
        """Write the partitions' checkpoints once every output so far is acknowledged."""
        if state.directory is None or not partitions:
            return
        async with writing:
            await _checkpoint([p for p in partitions if p in state.processors], why)

    async def _checkpoint(partitions: list[int], why: str) -> None:
        # no await until every snapshot is taken: the agent is parked between two records
        taken = {p: state.snapshot(p) for p in partitions}
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*list(unacked), return_exceptions=True),
                max(settings.checkpoint_interval_s, 5.0),
            )
        except asyncio.TimeoutError:  # the builtin TimeoutError only from Python 3.11
            results = [asyncio.TimeoutError()]
        if any(isinstance(r, BaseException) for r in results):
            log.warning("stream checkpoint skipped (%s): outputs not acknowledged by the broker yet", why)
            return
        loop = asyncio.get_running_loop()
        for p, (data, offset, events) in taken.items():
            await loop.run_in_executor(None, write, state_path(p), data)
            state.checkpointed(p, events)
            log.debug("stream checkpoint (%s): partition %d, %d bytes, offset %d", why, p, len(data), offset)
        metrics.stamp()

    def state_path(partition: int) -> Path:
        assert state.directory is not None
        return partition_path(state.directory, partition)

    if settings.checkpoint_interval_s > 0:

        @app.timer(settings.checkpoint_interval_s)
        async def take_checkpoint() -> None:
            await checkpoint(state.changed(), "timer")

    def events_partitions(tps: Any) -> list[int]:
        return sorted(tp.partition for tp in tps if tp.topic == topics.events)

    @app.on_partitions_revoked.connect
    async def revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Faust flushed our outputs already: checkpoint what leaves us, and forget it."""
        held = [p for p in events_partitions(args[0]) if p in state.processors]
        await checkpoint([p for p in held if p in state.changed()], "revoked")
        for p in held:
            state.drop(p)

    @app.on_before_shutdown.connect
    async def shutting_down(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """The consumer has stopped: checkpoint every partition held.

        So a restart (or ``up``'s planned broker restart) starts from where this worker stopped.
        """
        held = state.changed()
        await checkpoint(held, "shutdown")
        if held:
            log.info("stream checkpoint at shutdown: partitions %s", held)

    @app.on_partitions_assigned.connect
    async def assigned(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Rebuild each partition new to us up to the group's committed offset.

        So the time-driven alerts of its runs go on before any new record arrives.
        """
        new = [p for p in events_partitions(args[0]) if p not in state.processors]
        if not new:
            return
        loop = asyncio.get_running_loop()
        committed = await loop.run_in_executor(None, committed_offsets, settings, group_id(settings))
        for p in new:
            await state.ensure(p, committed.get(p, 0))

    return app
