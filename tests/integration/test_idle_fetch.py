"""A quiet consumer asks the broker with the idle fetch wait, and a record brings the short one
back: checked in both Kafka clients' own fetchers, against the real broker."""

import asyncio
import time

import pytest

from metricbus.schemas import IDLE_AFTER_S, FetchWait, make_consumer, make_producer, topic_reader

pytestmark = pytest.mark.integration


def test_an_aiokafka_consumer_goes_idle_and_back_as_its_fetcher_sees_it(settings):
    topic = settings.topics.events

    async def main():
        consumer = make_consumer(settings, topic, client_id="idle-test")
        producer = make_producer(settings, client_id="idle-test")
        await consumer.start()
        await producer.start()
        try:
            wait = FetchWait.of_aiokafka(consumer, settings)
            deadline = time.monotonic() + IDLE_AFTER_S + 10
            while not wait.idle and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200)
                wait.saw(sum(map(len, batches.values())))
            idle = consumer._fetcher._fetch_max_wait_ms
            await producer.send_and_wait(topic, b"x", key=b"k")
            got = 0
            while not got and time.monotonic() < deadline + 5:
                batches = await consumer.getmany(timeout_ms=200)
                got = sum(map(len, batches.values()))
                wait.saw(got)
            return idle, got, consumer._fetcher._fetch_max_wait_ms
        finally:
            await consumer.stop()
            await producer.stop()

    assert asyncio.run(main()) == (settings.idle_fetch_max_wait_ms, 1, settings.fetch_max_wait_ms)


def test_a_kafka_python_consumer_goes_idle_and_back_as_its_fetcher_sees_it(settings):
    from kafka import TopicPartition

    consumer = topic_reader(settings, "idle-test")
    try:
        tps = [
            TopicPartition(settings.topics.alerts, p)
            for p in consumer.partitions_for_topic(settings.topics.alerts)
        ]
        consumer.assign(tps)
        wait = FetchWait.of_kafka_python(consumer, settings)
        deadline = time.monotonic() + IDLE_AFTER_S + 10
        while not wait.idle and time.monotonic() < deadline:
            wait.saw(sum(map(len, consumer.poll(timeout_ms=200).values())))
        assert consumer._fetcher.config["fetch_max_wait_ms"] == settings.idle_fetch_max_wait_ms

        async def send():
            producer = make_producer(settings, client_id="idle-test")
            await producer.start()
            try:
                await producer.send_and_wait(settings.topics.alerts, b"x", key=b"k")
            finally:
                await producer.stop()

        asyncio.run(send())
        got = 0
        while not got and time.monotonic() < deadline + 5:
            got = sum(map(len, consumer.poll(timeout_ms=200).values()))
            wait.saw(got)
        assert got == 1
        assert consumer._fetcher.config["fetch_max_wait_ms"] == settings.fetch_max_wait_ms
    finally:
        consumer.close()
