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


def test_a_consumer_waiting_for_a_broker_says_so_gives_up_at_its_limit_and_never_loads_kafka_python(tmp_path):
    """`metricbus sink --wait-s`: said once, exit 2 with the address and why; the sinks and the
    alert consumers read with aiokafka, so their start never imports kafka-python (~0.4 s of CPU)."""
    import subprocess
    import sys

    dead = f"127.0.0.1:{closed_port()}"
    script = (
        "import sys, runpy; sys.argv = sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_module('metricbus', run_name='__main__')\n"
        "finally:\n"
        "    print('kafka-python loaded' if 'kafka' in sys.modules else 'kafka-python never loaded', file=sys.stderr)\n"
    )
    argv = ["metricbus", "--bootstrap", dead, "--data-dir", str(tmp_path), "sink", "parquet", "--wait-s", "1"]
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("no broker answers at") == 1, done.stderr  # the wait, said once
    assert f"no broker answered at {dead} (" in done.stderr and "within 1s" in done.stderr, done.stderr
    assert "kafka-python never loaded" in done.stderr, done.stderr
