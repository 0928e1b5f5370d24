"""The planned restart of the embedded broker, in process and without consumers: what it carries
over, and that a restart that fails leaves the stack running (bench/soak.py saw `up` die of it).

The whole of `metricbus up` going through a planned restart under a training job is
tests/integration/test_stack.py's.
"""

import time

import pytest

from metricbus import _carry
from metricbus._broker import port_open
from metricbus._read import read_topic
from metricbus._stack import Stack
from producers import Run
from schemas import Settings

from .conftest import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path, monkeypatch):
    # the stack points prometheus_client at its directory for its restart counter: this
    # test's own, put back afterwards
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prometheus"))
    lines: list[str] = []
    s = Stack(Settings(data_dir=tmp_path, local_port=free_port()), consumers={}, report=lines.append).start()
    s.lines = lines
    yield s
    s.stop()


def logged(stack: Stack, n: int) -> str:
    run = Run("carry", settings=stack.settings, system_metrics=False)
    for step in range(n):
        run.log({"Train/Loss": 1.0 / (step + 1)}, step=step)
    assert run.finish(timeout=30)
    return run.run_id


def test_what_no_group_has_read_is_carried_over_to_the_restarted_broker(stack):
    run_id = logged(stack, 50)
    events = stack.settings.topics.events
    before = [(r.partition, r.value) for r in read_topic(stack.settings, events)]
    old_pid = stack.broker.proc.pid
    stack._planned_restart(stack.broker, rss_mb=100.0, now=time.monotonic())
    assert stack.broker.proc.pid != old_pid and stack.planned_restarts == 1
    after = [(r.partition, r.value) for r in read_topic(stack.settings, events)]
    assert after == before and any(run_id.encode() in value for _, value in after)  # same partitions, order


def test_a_planned_restart_that_fails_is_reported_and_the_stack_goes_on(stack, monkeypatch):
    logged(stack, 10)

    def refused(settings, records, attempts=5):
        raise RuntimeError("[Error -1] UnknownError")

    monkeypatch.setattr(_carry, "publish", refused)
    stack._planned_restart(stack.broker, rss_mb=100.0, now=time.monotonic())  # must not raise
    assert any("planned broker restart failed (RuntimeError" in line for line in stack.lines), stack.lines
    assert stack.broker.proc.poll() is None and port_open("127.0.0.1", stack.settings.local_port)
    stack.supervise_once()  # and supervision goes on
    assert logged(stack, 5)  # a training job delivers to the restarted broker
