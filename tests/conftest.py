"""Every test process (each xdist worker too) gets a runtime dir of its own for stack files.

Without it a test that starts `metricbus up` would announce its stack where a developer's own
stack is announced, and a test's client with no broker given would join whichever is newest.
"""

import os
import tempfile

os.environ["METRICBUS_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="metricbus-stacks-")


import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MB tmpfs at ``tmp_path / "disk"``: a disk that fills up (ENOSPC) as a full one does.

    Mounting needs root (CAP_SYS_ADMIN), as in the CI container; where the machine cannot, the
    test is skipped with that reason.
    """
    where = Path(tmp_path) / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
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
