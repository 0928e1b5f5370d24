"""The processes' shared metrics files on a data disk that fills (a real tmpfs): no SIGBUS.

prometheus_client writes them through mmap as sparse files; a write to a page the disk has no
block for kills the process with SIGBUS. `metricbus up` died that way (and every child with it)
the first time a full data disk met a restart to count.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from metricbus.schemas import LoopMetrics, count_restart
    from tests.conftest import fill

    names = ["sink-parquet", "sink-wandb", "stream-worker"]
    for name in names:
        count_restart(name, 0)  # as `metricbus up` does at its start
    loop = LoopMetrics("consumer", "metricbus.sink.parquet")
    fill(Path(sys.argv[1]))  # the disk is full now
    for i in range(200):
        count_restart(names[i % 3])
        loop.update({"records": i, "flush_failures": i, "unavailable": i})
        loop.observe(0.01 * i)
        loop.failing(i % 2 == 0)
        loop.stamp()
    for i in range(100):  # samples new since the disk filled: into the blocks backed at the start
        count_restart(f"a child started later {i}")
    print("alive")
    """
)


def test_metrics_written_after_the_data_disk_filled_do_not_kill_the_process(small_disk, tmp_path):
    shared = small_disk / "prometheus"
    shared.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(shared), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(small_disk)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=str(Path(__file__).resolve().parents[2]),  # the script imports tests.conftest
    )
    assert done.returncode == 0 and "alive" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert (small_disk / "filler").exists()  # it was full throughout
