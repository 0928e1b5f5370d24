import pytest

from metricbus.producers import Spool, SpoolBusyError, pending_spools


def test_append_read_commit_and_rotation(tmp_path):
    spool = Spool(tmp_path / "run" / "p.spool")
    spool.append([b"a", b"bb"])
    spool.append([b"ccc"])
    got = spool.read_unsent(2)
    assert [r for r, _ in got] == [b"a", b"bb"]
    spool.commit(got[-1][1])
    assert [r for r, _ in spool.read_unsent(10)] == [b"ccc"]
    assert pending_spools(tmp_path) == [tmp_path / "run" / "p.spool"]
    spool.commit(spool.read_unsent(10)[-1][1])
    assert spool.unsent_bytes == 0 and (tmp_path / "run" / "p.spool").stat().st_size == 0  # rotated
    spool.close()
    assert not (tmp_path / "run").exists()  # nothing left: files and folder removed


def test_unsent_records_survive_a_reopen_from_the_cursor(tmp_path):
    path = tmp_path / "run" / "p.spool"
    spool = Spool(path)
    spool.append([b"one", b"two", b"three"])
    spool.commit(spool.read_unsent(1)[0][1])
    spool.close()
    again = Spool(path)
    assert [r for r, _ in again.read_unsent(10)] == [b"two", b"three"]
    again.close()


def test_a_torn_tail_is_reported_and_not_sent(tmp_path, caplog):
    path = tmp_path / "run" / "p.spool"
    spool = Spool(path)
    spool.append([b"good", b"also good"])
    spool.close()
    with open(path, "ab") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00half")  # a frame cut short by a crash
    again = Spool(path)
    assert [r for r, _ in again.read_unsent(10)] == [b"good", b"also good"]
    assert again.torn_at is not None and "torn" in caplog.text
    again.commit(again.read_unsent(10)[-1][1])
    again.close()
    assert path.exists()  # kept for a person to inspect


def test_a_corrupt_frame_is_not_decoded(tmp_path):
    path = tmp_path / "run" / "p.spool"
    spool = Spool(path)
    spool.append([b"first", b"second"])
    spool.close()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # flip a bit in the second payload: its CRC no longer matches
    path.write_bytes(bytes(data))
    again = Spool(path)
    assert [r for r, _ in again.read_unsent(10)] == [b"first"]
    again.close()


def test_one_owner_at_a_time(tmp_path):
    spool = Spool(tmp_path / "r" / "p.spool")
    with pytest.raises(SpoolBusyError):
        Spool(tmp_path / "r" / "p.spool")
    spool.close()
