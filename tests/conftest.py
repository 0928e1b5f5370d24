"""Every test process (each xdist worker too) gets a runtime dir of its own for stack files,
removed when it exits.

Without it a test that starts `metricbus up` would announce its stack where a developer's own
stack is announced, and a test's client with no broker given would join whichever is newest.
"""

import atexit
import os
import shutil
import tempfile

_RUNTIME = tempfile.mkdtemp(prefix="metricbus-stacks-")
os.environ["METRICBUS_RUNTIME_DIR"] = _RUNTIME
# Stable-Baselines3 makes its logger's folder at each learn(): here, not a new /tmp/SB3-<time>
os.environ["SB3_LOGDIR"] = os.path.join(_RUNTIME, "sb3")
atexit.register(shutil.rmtree, _RUNTIME, ignore_errors=True)


import json  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def _tmpfs_refused() -> str:
    """Why a tmpfs cannot be mounted here ("" when it can): mounting needs root (CAP_SYS_ADMIN)."""
    where = Path(tempfile.mkdtemp(prefix="metricbus-tmpfs-probe-"))
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True, text=True
        )
    except OSError as exc:  # no mount(8) at all
        where.rmdir()
        return str(exc)
    if done.returncode == 0:
        subprocess.run(["umount", str(where)], check=False)
    where.rmdir()
    return "" if done.returncode == 0 else done.stderr.strip() or f"mount exited {done.returncode}"


def pytest_collection_modifyitems(config, items):
    _longest_first_on_every_worker(items)
    _small_disk_where_a_tmpfs_mounts(items)


def _longest_first_on_every_worker(items: list) -> None:
    """Order the tests so that each xdist worker's first share starts with its long tests.

    pytest-xdist's work stealing hands each of its N workers a contiguous share of the
    collection (sizes ``len // N``, then of what remains) and lets a worker that runs out take
    the back half of the fullest queue. The suite's wall time is then set by a long test that
    starts late. Here the long tests (``durations.json``: the seconds each took in a full run,
    those of 3 s or more, written by ``python -m tests.durations`` from JUnit reports) are
    shared among the workers, longest first, each to the share with the least expected time,
    and every share runs its long tests first: the back of each queue, which others take, holds
    the short ones. The tests marked ``frameworks`` all go to the first share. Without xdist,
    no change.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or len(items) < workers:
        return
    expected = json.loads((Path(__file__).parent / "durations.json").read_text())
    sizes, left = [], len(items)
    for i in range(workers):  # xdist's own split of the collection
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    seconds = {id(item): expected.get(item.nodeid, 0.5) for item in items}
    shares: list[list] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    # the tests of the training frameworks share one worker, which imports each framework once
    # (Lightning, transformers and TRL cost 5-11 s of CPU to import, SB3 3 s)
    together = [item for item in items if item.get_closest_marker("frameworks")][: sizes[0]]
    shares[0] = together
    loads[0] = sum(seconds[id(item)] for item in together)
    chosen = {id(item) for item in together}
    for item in sorted(items, key=lambda item: -seconds[id(item)]):  # stable: short ones keep their order
        if id(item) in chosen:
            continue
        share = min((w for w in range(workers) if len(shares[w]) < sizes[w]), key=lambda w: loads[w])
        shares[share].append(item)
        loads[share] += seconds[id(item)]
    items[:] = [item for share in shares for item in sorted(share, key=lambda item: -seconds[id(item)])]


def _small_disk_where_a_tmpfs_mounts(items: list) -> None:
    """Tests on a real small disk (the ``small_disk`` fixture) run where a tmpfs can be mounted,
    as in the CI container; elsewhere they are skipped with the reason, decided once."""
    users = [item for item in items if "small_disk" in getattr(item, "fixturenames", ())]
    if not users:
        return
    refused = _tmpfs_refused()
    if refused:
        marker = pytest.mark.skipif(True, reason=f"cannot mount a tmpfs here (needs root): {refused}")
        for item in users:
            item.add_marker(marker)


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MB tmpfs at ``tmp_path / "disk"``: a disk that fills up (ENOSPC) as a full one does."""
    where = Path(tmp_path) / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` but ``leave`` bytes with one file; remove it to give the room back."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave))
        except OSError:
            pass  # full: that is the point
    return filler
