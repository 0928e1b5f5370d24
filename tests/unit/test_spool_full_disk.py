"""A full spool disk loses nothing the process keeps: the spool stays consistent, what it refused
is held and written once there is room, and finish() says False while anything is unwritten."""

from __future__ import annotations

import errno
import time

import pytest

from metricbus.producers import Run
from metricbus.producers._spool import Spool
from metricbus.schemas import Settings
from tests.fakes import FakeTransport

from .test_run import metrics, wait_for


@pytest.fixture
def settings(tmp_path):
    return Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1")


class FillingDisk:
    """A spool file whose disk refuses writes while ``full`` (a partial write first, as a real disk)."""

    def __init__(self, file) -> None:
        self.file, self.full, self.refused = file, False, 0

    def write(self, data) -> int:
        if self.full:
            self.refused += 1
            if len(data) > 8:  # part of it lands, then the disk is out of room
                self.file.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_a_refused_append_leaves_the_file_as_it_was(tmp_path):
    spool = Spool(tmp_path / "s.spool")
    spool.append([b"first"])
    disk = spool._file = FillingDisk(spool._file)
    disk.full = True
    with pytest.raises(OSError):
        spool.append([b"x" * 1000])
    disk.full = False
    spool.append([b"second"])
    assert [r for r, _ in spool.read_unsent(10)] == [b"first", b"second"] and spool.torn_at is None
    assert (tmp_path / "s.spool").stat().st_size == spool._size


def test_events_logged_while_the_spool_disk_is_full_are_all_sent_once_it_has_room(settings, caplog):
    fake = FakeTransport()
    fake.down = True  # nothing leaves the spool meanwhile: every event must go through the disk
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    disk = run._publisher.spool._file = FillingDisk(run._publisher.spool._file)
    for i in range(100):
        run.log({"x": float(i)}, step=i)
    wait_for(lambda: run._publisher.events_spooled == 101)
    disk.full = True
    for i in range(100, 300):
        run.log({"x": float(i)}, step=i)
    wait_for(lambda: disk.refused >= 2)  # two spooler passes, each refused
    assert run._publisher.backlog > 0
    disk.full = False
    fake.down = False
    assert run.finish(timeout=10)
    got = metrics(fake.events())
    assert [seq for seq, _ in got] == list(range(1, 301)) and [b["step"] for _, b in got] == list(range(300))
    assert run._publisher.lost_events == 0
    assert "held in memory" in caplog.text and "has room again" in caplog.text
    assert "corrupt or torn" not in caplog.text


def test_finish_says_false_while_the_disk_still_refuses(settings, caplog):
    fake = FakeTransport()
    fake.down = True
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    disk = run._publisher.spool._file = FillingDisk(run._publisher.spool._file)
    disk.full = True
    for i in range(50):
        run.log({"x": float(i)}, step=i)
    started = time.monotonic()
    assert run.finish(timeout=1) is False
    assert time.monotonic() - started < 5
    assert "could not be written to the spool" in caplog.text


def test_a_cursor_the_full_disk_refuses_is_kept_in_memory_and_saved_later(small_disk, caplog):
    """The sender's commit on a real full tmpfs: before, the cursor's write raised into the sender
    thread, which died (nothing more was sent for the rest of the run); now sending goes on, it is
    said once, no temporary is left, and the cursor is saved once there is room."""
    from tests.conftest import fill

    spool = Spool(small_disk / "s.spool")
    spool.append([b"a" * 100, b"b" * 100])
    first = spool.read_unsent(1)[0][1]
    filler = fill(small_disk)
    spool.commit(first)  # refused on disk: no exception
    assert [r for r, _ in spool.read_unsent(10)] == [b"b" * 100]  # the cursor moved in memory
    assert "cannot save the spool's cursor" in caplog.text
    assert not list(small_disk.glob("*.tmp"))
    filler.unlink()
    spool.commit(first)
    assert int((small_disk / "s.cursor").read_text()) == first
    spool.close()


def test_every_event_a_full_spool_loses_is_counted_where_callers_read_it(settings, caplog):
    """The log named them lost and finish() said False, but stats() said lost_events 0."""
    import re

    fake = FakeTransport()
    fake.down = True  # no broker answers: everything must go through the spool, whose disk is full
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    disk = run._publisher.spool._file = FillingDisk(run._publisher.spool._file)
    disk.full = True
    for i in range(500):
        run.log({"x": float(i)}, step=i)
    assert run.finish(timeout=1) is False
    (named,) = re.findall(r"(\d+) events could not be written to the spool", caplog.text)
    stats = run.stats()
    assert int(named) > 0 and stats["lost_events"] == int(named)
    assert stats["lost_events"] + stats["dropped_events"] <= stats["events"]
