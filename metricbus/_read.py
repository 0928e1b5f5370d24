"""Read a whole topic once (the demo's and `status`-style tools' view of derived topics).

The end is the high watermark from Fetch responses: the embedded broker answers ListOffsets
LATEST with the last batch's base offset + 1, which would stop a reader early.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from schemas import MAX_RECORD_BYTES, Settings, client_options, fetch_options


def reach(settings: Settings, timeout_s: float = 2.0) -> None:
    """Raise kafka's KafkaConnectionError now when no bootstrap server accepts a TCP connection.

    kafka-python tries to bootstrap for about 25 s before it gives up: the dashboard's pipeline
    page and ``status`` showed nothing for that long with the broker down, and again at each
    sample. A server that accepts but does not answer as Kafka is still left to kafka-python.
    """
    from kafka.errors import KafkaConnectionError

    refused = []
    for server in settings.bootstrap_servers.split(","):
        host, colon, port = server.strip().rpartition(":")
        if not colon:  # a host alone: Kafka's port, as kafka-python takes it
            host, port = port, "9092"
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return
        except (OSError, ValueError) as exc:
            refused.append(f"{server.strip()} ({exc})")
    raise KafkaConnectionError(f"no broker answers at {'; '.join(refused)}")


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
