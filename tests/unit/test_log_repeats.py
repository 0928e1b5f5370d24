"""A Kafka client's line said again within a minute is counted, not printed (a broker that is
down made kafka-python log two ERROR lines a second in the dashboard), and said once it is back."""

import logging

from metricbus.cli import Repeats


def record(name, msg, *args):
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_a_kafka_clients_repeated_line_is_held_back_and_counted():
    now = [0.0]
    repeats = Repeats(every_s=60.0, clock=lambda: now[0])
    lost = "%s: Connection lost: %s"
    assert repeats.filter(record("kafka.net.connection", lost, "<conn 1>", "ECONNREFUSED"))
    for t in (0.5, 1.0, 30.0):  # the same line, another connection's repr: held back
        now[0] = t
        assert not repeats.filter(record("kafka.net.connection", lost, f"<conn {t}>", "ECONNREFUSED"))
    assert repeats.filter(record("kafka.net.manager", "Connection failed: %s", "x"))  # another line
    assert repeats.filter(record("metricbus.stack", lost, "ours", "always said"))  # not a client's
    assert repeats.filter(record("metricbus.stack", lost, "ours", "always said"))
    now[0] = 61.0
    again = record("kafka.net.connection", lost, "<conn 61>", "ECONNREFUSED")
    assert repeats.filter(again)
    assert again.getMessage() == "<conn 61>: Connection lost: ECONNREFUSED (and 3 more like it held back)"
    now[0] = 62.0
    assert not repeats.filter(record("kafka.net.connection", lost, "<conn 62>", "ECONNREFUSED"))


class Collected(logging.Handler):
    """A program's own handler: keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_main_in_a_program_leaves_the_programs_own_handlers_as_they_were(tmp_path, monkeypatch, capsys):
    """A program (or a test run) that calls main() keeps every kafka line its handlers took."""
    from metricbus.cli import main

    monkeypatch.setenv("METRICBUS_DATA_DIR", str(tmp_path))
    # its own registry of running stacks: another test's `up` killed -9 leaves a stale file in
    # the session's, and main() says so in a WARNING line
    monkeypatch.setenv("METRICBUS_RUNTIME_DIR", str(tmp_path / "runtime"))
    theirs = Collected()
    root = logging.getLogger()
    root.addHandler(theirs)
    try:
        assert main(["runs"]) == 0
        assert theirs.filters == []
    finally:
        root.removeHandler(theirs)
    assert "no run in the archive" in capsys.readouterr().out
