"""The ops tools' quick check that something listens at a bootstrap address (``_read.reach``)."""

import socket

import pytest
from kafka.errors import KafkaConnectionError

from metricbus.schemas import Settings, reach, unreachable


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_one_listening_server_of_the_list_is_enough():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        settings = Settings(bootstrap=f"127.0.0.1:{closed_port()}, 127.0.0.1:{port}")
        reach(settings)  # no error: the listening one answered
        assert not unreachable(settings)  # what reach() decides on: nothing to say


def test_none_listening_names_every_address_and_why():
    dead = [f"127.0.0.1:{closed_port()}", "[::1]:notaport"]
    with pytest.raises(KafkaConnectionError) as raised:
        reach(Settings(bootstrap=",".join(dead)), timeout_s=1.0)
    text = str(raised.value)
    assert f"no broker answers at {dead[0]} (" in text and "Connection refused" in text
    assert f"{dead[1]} (invalid literal" in text
