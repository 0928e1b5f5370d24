"""The Kafka transport's lost-topic check (the broker itself is exercised by the integration tests)."""

import pytest

from metricbus.producers._transport import BrokerRestarting, KafkaTransport
from metricbus.schemas import Settings


class Admin:
    """describe_topics of a broker whose events topic was re-created (a memory-only restart), or
    does not exist (topic_id None); ``restarting``: `metricbus up`'s marker topic exists."""

    def __init__(self, topic_id, restarting=False, carried=False):
        self.topic_id = topic_id
        self.restarting = restarting
        self.carried = carried  # `up` carried the old broker's records into this topic
        self.calls = 0

    def describe_topics(self, topics):
        self.calls += 1
        out = []
        for name in topics:
            if name.endswith("broker-restarting"):
                exists = self.restarting
            elif "broker-carried-" in name:
                exists = self.carried and name.endswith(f"-{self.topic_id}")
            else:
                exists = self.topic_id is not None
            if exists:
                out.append({"name": name, "error_code": 0, "topic_id": self.topic_id or "marker-id"})
            else:  # UNKNOWN_TOPIC_OR_PARTITION
                out.append({"name": name, "error_code": 3, "topic_id": None})
        return out


def test_a_recreated_topic_is_reported_lost_once_then_the_new_one_is_trusted(tmp_path):
    transport = KafkaTransport(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    transport._admin = Admin("new-id")
    transport._topic_id = "old-id"
    transport._unverified = True
    admin = transport._admin
    transport.verify()
    assert transport.take_lost() and not transport.unverified  # resend the retained window once
    assert transport._admin is None  # closed: the next send reconnects, creating the topic first
    transport._admin = admin  # as a reconnect would
    transport._unverified = True
    transport.verify()
    assert not transport.take_lost()  # the same new topic: nothing lost again (it looped before)
    assert admin.calls == 3  # a request per check, and one look for `up`'s carry marker once lost


def test_a_topic_missing_after_acknowledgements_is_lost_every_time_until_it_exists(tmp_path):
    """A producer that reconnected by itself to a restarted broker is acknowledged for a topic the
    broker does not have: a missing topic is never "the same topic" as the last missing one."""
    transport = KafkaTransport(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    for _ in range(2):
        transport._admin = Admin(None)
        transport._unverified = True
        transport.verify()
        assert transport.take_lost() and transport._admin is None


def test_while_the_broker_restarts_nothing_acknowledged_counts_as_checked(tmp_path):
    """`metricbus up` marks a planned restart before its last read of the old broker: records
    acknowledged after that may never reach the new one, so they stay unchecked (held)."""
    transport = KafkaTransport(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    transport._admin = Admin("old-id", restarting=True)
    transport._topic_id = "old-id"
    transport._unverified = True
    with pytest.raises(BrokerRestarting):
        transport.verify()
    assert transport.unverified and not transport.take_lost()
    assert transport._admin is None and transport._client is None  # nothing is sent on meanwhile
    transport._admin = Admin("new-id")  # the new broker: no marker, the topic re-created
    transport.verify()
    assert transport.take_lost() and not transport.unverified  # the held window is resent


def test_a_topic_gone_after_sends_is_left_to_whoever_restarted_the_broker_for_a_few_seconds(
    tmp_path, monkeypatch
):
    """`metricbus up` creates its marker, then the topics, publishes the carry, deletes the
    marker: a producer that created the topic itself first would send ahead of the carry."""
    from metricbus.producers import _transport

    now = [100.0]
    monkeypatch.setattr(_transport.time, "monotonic", lambda: now[0])
    transport = KafkaTransport(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    transport._hold_unless_ready(None, restarting=False)  # a first connect creates the topic
    with pytest.raises(BrokerRestarting, match="restarting"):
        transport._hold_unless_ready("id", restarting=True)
    transport._had_topic = True  # as after a connect
    with pytest.raises(BrokerRestarting, match="gone"):
        transport._hold_unless_ready(None, restarting=False)
    now[0] += _transport.TOPIC_WAIT_S - 0.1
    with pytest.raises(BrokerRestarting, match="gone"):
        transport._hold_unless_ready(None, restarting=False)
    now[0] += 0.2  # nobody created it: a broker restarted by hand, the producer creates it
    transport._hold_unless_ready(None, restarting=False)
    transport._hold_unless_ready("new-id", restarting=False)


def test_a_topic_up_carried_the_old_one_into_is_lost_with_only_the_unchecked_records_to_resend(tmp_path):
    transport = KafkaTransport(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    transport._admin = Admin("new-id", carried=True)
    transport._topic_id = "old-id"
    transport._unverified = True
    transport.verify()
    assert transport.take_lost() and transport.carried_over
    transport._admin = Admin("newer-id")  # restarted again, by hand this time: no marker
    transport._unverified = True
    transport.verify()
    assert transport.take_lost() and not transport.carried_over


def test_records_go_in_kafka_batches_of_at_most_a_megabyte_in_order_a_larger_one_alone(tmp_path):
    """What one send puts in each produce request: the records in order, a batch at most
    BATCH_BYTES before compression (under a broker's default message.max.bytes), a record
    larger than that in a batch of its own (the topic allows up to MAX_RECORD_BYTES)."""
    from kafka.record.memory_records import MemoryRecords

    from metricbus.producers._transport import BATCH_BYTES

    transport = KafkaTransport(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    small = [b"%d" % i * 1000 for i in range(10)]
    big = b"x" * (BATCH_BYTES + 1)
    records = [*small, big, *small, b"y" * (BATCH_BYTES // 2), b"z" * (BATCH_BYTES // 2)]
    batches = list(transport._batches(b"run", records))
    sent = []
    for batch in batches:
        assert batch.size_in_bytes() <= BATCH_BYTES or batch.next_offset() == 1  # compressed: smaller
        found = MemoryRecords(bytes(batch.buffer()))
        while found.has_next():
            sent.extend(r.value for r in found.next_batch())
    assert sent == records
    assert [b.next_offset() for b in batches] == [10, 1, 11, 1]  # big alone; y and z not together
