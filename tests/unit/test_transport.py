"""The Kafka transport's lost-topic check (the broker itself is exercised by the integration tests)."""

from producers._transport import KafkaTransport
from schemas import Settings


class Admin:
    """describe_topics of a broker whose events topic was re-created (a memory-only restart)."""

    def __init__(self, topic_id):
        self.topic_id = topic_id
        self.calls = 0

    def describe_topics(self, topics):
        self.calls += 1
        return [{"error_code": 0, "topic_id": self.topic_id}]


def test_a_recreated_topic_is_reported_lost_once_then_the_new_one_is_trusted(tmp_path):
    transport = KafkaTransport(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    transport._admin = Admin("new-id")
    transport._topic_id = "old-id"
    transport._unverified = True
    transport.verify()
    assert transport.take_lost() and not transport.unverified  # resend the retained window once
    transport._unverified = True
    transport.verify()
    assert not transport.take_lost()  # the same new topic: nothing lost again (it looped before)
    assert transport._admin.calls == 2
