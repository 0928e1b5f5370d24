"""kafka-python's IO thread reading a socket that close() took away is not an error of ours."""

import logging
import socket
import threading

import pytest

import metricbus.schemas._kafka  # noqa: F401 - installs the filter on kafka-python's transport logger

pytest.importorskip("kafka.net.transport", reason="kafka-python 3's network layer")
from kafka.net.transport import KafkaTCPTransport  # noqa: E402


def here(caplog) -> list[logging.LogRecord]:
    """The records this test's thread logged: kafka-python IO threads another test left closing
    in the same worker log into the same capture."""
    return [r for r in caplog.records if r.thread == threading.get_ident()]


def _transport(sock) -> KafkaTCPTransport:
    t = KafkaTCPTransport.__new__(KafkaTCPTransport)  # no event loop: only the read path runs
    t._sock, t.host, t._closed = sock, "127.0.0.1", False
    return t


def test_a_read_of_a_socket_close_took_away_logs_no_traceback(caplog):
    t = _transport(None)
    t._closed = True  # what close() leaves behind while the IO thread is between wait and read
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        data, err = t._sock_recv()
    assert data == b"" and err is not None  # kafka-python's own code ran the failing read
    assert [r for r in here(caplog) if r.exc_info] == []


def test_a_read_error_on_an_open_socket_is_still_logged(caplog):
    a, b = socket.socketpair()
    b.close()
    a.close()  # recv on a closed socket object: OSError (bad file descriptor)
    t = _transport(a)
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        _, err = t._sock_recv()
    assert err is not None
    logged = [r.getMessage() for r in here(caplog) if r.exc_info]
    assert len(logged) == 1 and logged[0].endswith("Error receiving network data closing socket")


def test_a_task_waiting_on_a_socket_close_took_away_logs_no_traceback_and_other_task_errors_do(caplog):
    import selectors

    log = logging.getLogger("kafka.net.selector")  # where kafka-python's scheduler says it
    sock = socket.socket()
    sock.close()  # what close() leaves: fd -1
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        try:  # the exception kafka-python's scheduler meets when it registers that socket
            selectors.DefaultSelector().register(sock, selectors.EVENT_READ)
        except ValueError:
            log.exception("Unhandled exception in task %s:", "task-1")
        try:
            raise ValueError("something else went wrong")
        except ValueError:
            log.exception("Unhandled exception in task %s:", "task-2")
    assert [r.getMessage() for r in here(caplog)] == ["Unhandled exception in task task-2:"]


def test_a_read_that_close_detached_the_protocol_from_logs_no_traceback(caplog):
    """The read task woken with data just as close() took the transport's protocol away."""
    import asyncio

    log = logging.getLogger("kafka.net.selector")
    t = _transport(None)
    t._protocol, t._read = None, True  # what close() leaves behind
    t._net = type("Net", (), {"wait_read": staticmethod(lambda sock: asyncio.sleep(0))})()
    t._sock_recv = lambda: (b"data", None)  # noqa: SLF001 - the data the socket held
    raised = False
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        try:  # kafka-python's own read coroutine, as its scheduler runs it
            asyncio.run(t._read_from_sock())
        except AttributeError:
            raised = True
            log.exception("Unhandled exception in task %s:", "task-3")
        try:
            raise AttributeError("'NoneType' object has no attribute 'something_else'")
        except AttributeError:
            log.exception("Unhandled exception in task %s:", "task-4")
    assert raised  # kafka-python's code met the detached protocol
    assert [r.getMessage() for r in here(caplog) if r.exc_info] == ["Unhandled exception in task task-4:"]
