"""A project that signs its events (METRICBUS_SIGNING_KEY): a forged copy never displaces the
genuine one, even when it arrives first, in the archive sink and in the stream worker."""

import uuid

import pytest

from metricbus.producers import Run
from metricbus.schemas import (
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    Settings,
    Signer,
    client_options,
    default_codec,
    encode_events,
    ensure_topics,
    run_started,
)

from .conftest import read_topic
from .test_archive_e2e import held_seqs, wait_for_rows

pytestmark = pytest.mark.integration

KEY = "the project's secret"


@pytest.fixture
def settings(broker, tmp_path) -> Settings:  # the sink and worker fixtures run under these
    s = Settings(
        bootstrap=broker.bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:8]}.",
        data_dir=tmp_path,
        partitions=2,
        signing_key=KEY,
    )
    ensure_topics(s)
    return s


def test_a_forged_copy_that_arrives_first_is_dead_lettered_and_the_genuine_one_is_taken(
    settings, sink, worker
):
    from kafka import KafkaProducer

    codec = default_codec()
    body = {"step": 0, "epoch": None, "rank": 0, "samples": {}}

    def record(x: float) -> bytes:
        events = [(0, 1, RUN_STARTED, run_started("p", "n")), (1, 2, METRICS, {**body, "scalars": {"x": x}})]
        return encode_events(codec, "signed-run", "prod", events)

    signer = Signer(KEY)
    unsigned = record(666.5)  # written by someone without the key
    other_key = Signer("a guess").sign(record(666.5))
    genuine = signer.sign(record(1.5))
    end = signer.sign(
        encode_events(
            codec, "signed-run", "prod", [(2, 3, RUN_FINISHED, {"status": "finished", "summary": {}})]
        )
    )
    proc = sink(flush_interval=0.2)
    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    for value in (unsigned, other_key, genuine, end):  # the forged copies first
        producer.send(settings.topics.events, key=b"signed-run", value=value)
    producer.flush()
    producer.close()

    run = Run("signed", settings=settings, system_metrics=False)  # the producer hook signs
    for step in range(20):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    assert run.finish(timeout=30)

    table = wait_for_rows(settings.archive_dir, "signed-run", lambda t: len(held_seqs(t)) >= 3)
    assert held_seqs(table) == [("prod", 0), ("prod", 1), ("prod", 2)]
    values = [
        v for n, v in zip(table["name"].to_pylist(), table["value"].to_pylist(), strict=True) if n == "x"
    ]
    assert values == [1.5]
    logged = wait_for_rows(
        settings.archive_dir, run.run_id, lambda t: t is not None and "loss" in t["name"].to_pylist()
    )
    steps = [
        s for n, s in zip(logged["name"].to_pylist(), logged["step"].to_pylist(), strict=True) if n == "loss"
    ]
    assert sorted(steps) == list(range(20))  # the hook's own records pass the check

    dead = read_topic(settings, settings.topics.deadletter, 4)
    assert sorted(r.value for r in dead) == sorted([unsigned, other_key] * 2)  # the sink's and the worker's
    reasons = {(r.value, dict(r.headers)["metricbus.reason"].decode().split(":")[0]) for r in dead}
    assert reasons == {(unsigned, "ForgedSignatureError"), (other_key, "ForgedSignatureError")}
    derived = wait_for_rows(
        settings.archive_dir, "signed-run", lambda t: "x_recent_mean" in t["name"].to_pylist()
    )
    means = [
        v
        for n, v in zip(derived["name"].to_pylist(), derived["value"].to_pylist(), strict=True)
        if n == "x_recent_mean"
    ]
    assert means == [1.5]  # the worker derived from the genuine value only
    assert proc.proc.poll() is None and worker.poll() is None
