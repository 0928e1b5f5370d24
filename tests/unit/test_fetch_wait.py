"""Every consumer asks the broker for a short fetch wait (the embedded broker holds a fetch for
the whole wait whenever one of its partitions has nothing new)."""

import asyncio

from metricbus.schemas import Settings, fetch_options


def test_the_fetch_wait_is_short_by_default_and_configurable():
    assert fetch_options(Settings()) == {"fetch_max_wait_ms": 100}
    settings = Settings.from_env({"METRICBUS_FETCH_MAX_WAIT_MS": "500"})
    assert fetch_options(settings) == {"fetch_max_wait_ms": 500}
    assert Settings.from_env(settings.to_env()).fetch_max_wait_ms == 500


def test_the_faust_worker_consumer_uses_its_own_instead_of_fausts_fixed_1500_ms():
    """The worker's wait is its own (shorter: it stands between log() and every derived point)."""
    from metricbus.stream_jobs import build_app

    async def main(settings):
        app = build_app(settings)
        consumer = app.consumer._thread._create_worker_consumer(app.transport)
        try:
            return consumer._fetch_max_wait_ms
        finally:
            await consumer.stop()

    assert asyncio.run(main(Settings(bootstrap="127.0.0.1:9"))) == 50
    settings = Settings.from_env(
        {"METRICBUS_WORKER_FETCH_MAX_WAIT_MS": "70", "METRICBUS_BOOTSTRAP": "127.0.0.1:9"}
    )
    assert asyncio.run(main(settings)) == 70


def test_the_faust_worker_producer_compresses_as_the_training_jobs_do():
    """Aggregates, alerts and dead letters go out zstd-compressed by default (the embedded
    broker keeps every byte in memory), uncompressed with METRICBUS_COMPRESSION=none."""
    from metricbus.stream_jobs import build_app

    async def codec(settings):
        producer = build_app(settings).producer._new_producer()  # aiokafka's: refuses a codec it lacks
        try:
            return producer._compression_type
        finally:
            await producer.stop()

    assert asyncio.run(codec(Settings(bootstrap="127.0.0.1:9"))) == "zstd"
    assert asyncio.run(codec(Settings(bootstrap="127.0.0.1:9", compression="none"))) is None


def test_a_consumer_asks_with_the_idle_wait_after_a_quiet_spell_and_the_short_one_at_its_next_record():
    from metricbus.schemas import FetchWait

    now, set_to = [0.0], []
    wait = FetchWait(set_to.append, busy_ms=100, idle_ms=500, idle_after_s=2.0, clock=lambda: now[0])
    for t in (0.5, 1.0, 1.9):  # quiet, but not for long enough
        now[0] = t
        wait.saw(0)
    assert set_to == [] and not wait.idle
    now[0] = 2.0
    wait.saw(0)
    now[0] = 3.0
    wait.saw(0)
    assert set_to == [500] and wait.idle  # said once
    now[0] = 3.1
    wait.saw(7)
    wait.saw(3)
    assert set_to == [500, 100] and not wait.idle
    now[0] = 4.9
    wait.saw(0)  # quiet again, counted from the last record
    assert set_to == [500, 100]
    now[0] = 5.2
    wait.saw(0)
    assert set_to == [500, 100, 500]
    # an idle wait no longer than the short one is never used
    never = FetchWait(set_to.append, busy_ms=500, idle_ms=500, clock=lambda: now[0])
    now[0] = 100.0
    never.saw(0)
    assert set_to == [500, 100, 500] and not never.idle

