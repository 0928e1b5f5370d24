"""How long the commands people wait on take, cold (a fresh process each time), on long runs.

Two archived runs of BENCH_STEPS steps (default 100,000) of BENCH_METRICS scalars (20), and
the time of `metricbus runs`, `metricbus health <run>`, `metricbus compare <a> <b>` and
`metricbus status` (sampling itself, and asking a running stack's dashboard) in a new process
each (medians of BENCH_REPEATS), beside the peer in the same run: TensorBoard's own
loader (EventAccumulator, its default 1,000 points a tag) reading one of the runs from event
files written with TensorBoard's writer, in a new process too. Targets: runs, health and status
under 1 s, compare under 1.5 s.

Then `status` as an ops engineer runs it against a cluster: a `metricbus up --no-dashboard`
(its broker, worker and four sinks: five consumer groups) with a run logging into it, and
`metricbus status` from a process that knows only the broker's address (no stack file, no
dashboard to ask), beside the peer: what `kafka-consumer-groups --describe --all-groups` asks,
done with kafka-python's admin client directly (ListGroups, DescribeGroups, one OffsetFetch for
all groups, ListOffsets of every partition), in a fresh process too.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_broker, free_port  # noqa: E402

STEPS = int(os.environ.get("BENCH_STEPS", 100_000))
METRICS = int(os.environ.get("BENCH_METRICS", 20))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))
RUNS = ("20261101-000000-bencha00", "20261101-000000-benchb00")


def build(data_dir: Path) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from metricbus.schemas import METRICS as KIND
    from metricbus.schemas import RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started
    from metricbus.sinks import ParquetArchive

    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(data_dir / "archive")
    sink.open()
    for k, rid in enumerate(RUNS):
        sink.write(
            [
                Event(
                    rid, "p", 0, 1_700_000_000_000, RUN_STARTED, run_started("cmd", f"run-{k}", {"lr": k}), fp
                )
            ]
        )
        writer = EventFileWriter(str(data_dir / "tb" / rid)) if k == 0 else None
        for lo in range(0, STEPS, 20_000):
            events = []
            for s in range(lo, min(STEPS, lo + 20_000)):
                scalars = {f"Train/m{j}": 1.0 / (s + j + 1) + 0.01 * k for j in range(METRICS)}
                body = {"step": s, "epoch": s // 1000, "rank": 0, "samples": {}, "scalars": scalars}
                events.append(Event(rid, "p", s + 1, 1_700_000_000_000 + s, KIND, body, fp))
                if writer is not None:
                    values = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()]
                    writer.add_event(
                        event_pb2.Event(
                            wall_time=1.7e9 + s, step=s, summary=summary_pb2.Summary(value=values)
                        )
                    )
            sink.write(events)
            sink.flush()
        finished = {"status": "finished", "summary": {}}
        sink.write([Event(rid, "p", STEPS + 1, 1_700_000_000_000 + STEPS, RUN_FINISHED, finished, fp)])
        sink.flush()
        if writer is not None:
            writer.close()
    sink.close()


@contextlib.contextmanager
def running_stack(data_dir: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A dashboard over ``data_dir`` announced as the running stack (as `metricbus up` does);
    yields the environment of a client that joins it."""
    import psutil

    from metricbus.schemas._stack_file import StackInfo, announce, withdraw

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "metricbus", "dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "healthz", timeout=1).close()  # noqa: S310 - ours
                break
            except OSError:
                time.sleep(0.2)
        os.environ["METRICBUS_RUNTIME_DIR"] = env["METRICBUS_RUNTIME_DIR"]  # where announce() writes
        announce(
            StackInfo(
                pid=proc.pid,
                created=psutil.Process(proc.pid).create_time(),
                data_dir=str(data_dir),
                topic_prefix="metricbus.",
                bootstrap=env["METRICBUS_BOOTSTRAP"],
                dashboard_url=url,
            )
        )
        yield {k: v for k, v in env.items() if k not in ("METRICBUS_BOOTSTRAP", "METRICBUS_DATA_DIR")}
    finally:
        withdraw(proc.pid)
        proc.terminate()
        proc.wait(30)


def timed(argv: list[str], env: dict[str, str], check: bool = True) -> float:
    """Seconds ``argv`` took in a fresh process. ``check=False``: an answer that exits 1 counts
    (``status`` says "unhealthy" of a stack whose consumers are not all running)."""
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return time.perf_counter() - t


PEER = """
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
assert len(acc.Tags()["scalars"]) == int(sys.argv[2])
"""


ADMIN_PEER = """
import sys
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient, OffsetSpec
admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], client_id="peer")
groups = [g["group_id"] for g in admin.list_groups() if g["group_id"].startswith("metricbus.")]
# DescribeGroups as sent by admin.describe_groups, which cannot parse the embedded broker's
# authorized operations in its answer (kafka-python 3.0.12): the same request without them
from kafka.protocol.admin import DescribeGroupsRequest
async def describe():
    nodes = {}
    for group, node in (await admin._find_coordinator_ids(groups)).items():
        nodes.setdefault(node, []).append(group)
    found = []
    for node, mine in nodes.items():
        ask = DescribeGroupsRequest(groups=mine, include_authorized_operations=False, max_version=4)
        found.extend((await admin._manager.send(ask, node_id=node)).groups)
    return found
members = admin._manager.run(describe)
committed = admin.list_group_offsets({g: None for g in groups})
tps = sorted({tp for offsets in committed.values() for tp in offsets})
ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in tps})
lag = sum(ends[tp].offset - om.offset for offsets in committed.values() for tp, om in offsets.items())
assert len(groups) >= 5 and len(members) == len(groups), groups
admin.close()
"""

LIVE_RUN = """
import itertools, math, time
import metricbus
run = metricbus.init(project="ops-bench", name="live")
for step in itertools.count():
    run.log({"Train/Reward": 0.5 + 0.1 * math.sin(step / 50), "Train/Loss": 1.0 / (step + 1)}, step=step)
    time.sleep(0.002)
"""


@contextlib.contextmanager
def cluster_with_a_live_run(tmp: Path) -> Iterator[str]:
    """`metricbus up --no-dashboard` with a run logging into it: yields its broker's address
    once its five consumer groups have members and commits."""
    from metricbus.ops._lag import LagProbe
    from metricbus.schemas import Settings

    port = free_port()
    home = str(tmp / "stack")
    env = {**os.environ, "METRICBUS_DATA_DIR": home, "METRICBUS_RUNTIME_DIR": home}
    env.pop("METRICBUS_BOOTSTRAP", None)
    env["METRICBUS_QUIET"] = "1"
    up = subprocess.Popen(
        [sys.executable, "-m", "metricbus", "up", "--no-dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bootstrap = f"127.0.0.1:{port}"
    run = None
    try:
        probe = LagProbe(Settings(bootstrap=bootstrap))
        deadline = time.monotonic() + 180
        while True:
            if up.poll() is not None:
                raise RuntimeError(f"metricbus up exited {up.returncode}")
            if run is None:
                try:
                    groups = probe.groups()
                except Exception:  # noqa: BLE001 - the broker is not up yet
                    groups = []
                if groups:
                    run = subprocess.Popen(
                        [sys.executable, "-c", LIVE_RUN], env={**env, "METRICBUS_BOOTSTRAP": bootstrap}
                    )
            else:
                samples = probe.sample()
                ready = [s for s in samples.values() if s.members and s.partitions]
                if len(ready) >= 5:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the stack's five groups did not all join and commit within 180 s")
            time.sleep(1.0)
        probe.close()
        yield bootstrap
    finally:
        for proc in (run, up):
            if proc is not None:
                proc.terminate()
                proc.wait(60)


def status_against_a_cluster(tmp: Path) -> None:
    with cluster_with_a_live_run(tmp) as bootstrap:
        elsewhere = tmp / "elsewhere"  # no stack file, no dashboard: only the broker's address
        elsewhere.mkdir()
        env = {
            **os.environ,
            "METRICBUS_BOOTSTRAP": bootstrap,
            "METRICBUS_DATA_DIR": str(elsewhere),
            "METRICBUS_RUNTIME_DIR": str(elsewhere),
        }
        ours, peer = [], []
        for _ in range(REPEATS):  # interleaved: the same load on both
            ours.append(timed([sys.executable, "-m", "metricbus", "status"], env, check=False))
            peer.append(timed([sys.executable, "-c", ADMIN_PEER, bootstrap], env))
    for name, times in (
        ("metricbus status, no local stack", ours),
        ("admin client: kafka-consumer-groups' round", peer),
    ):
        times = sorted(times)
        print(f"  {name:<46}{statistics.median(times):>16.2f}   {', '.join(f'{x:.2f}' for x in times)}")
    ratio = statistics.median(ours) / statistics.median(peer)
    print(f"  ratio of the medians: {ratio:.2f}x (five groups, a live run)")


def compile_package() -> None:
    """Write the package's bytecode, as ``pip install`` does at install time.

    A checkout run with PYTHONDONTWRITEBYTECODE set (this machine's default) would otherwise
    compile every module of the command again in each process (0.1-0.2 s of a status), which
    no installed metricbus does and the peers (kafka-python, TensorBoard: installed) never pay.
    """
    import compileall

    import metricbus

    root = Path(metricbus.__file__).parent
    # compileall skips linked folders: in a checkout metricbus/sinks (and the others) link to
    # the top-level packages
    for folder in [root, *(p.resolve() for p in root.iterdir() if p.is_symlink() and p.is_dir())]:
        compileall.compile_dir(folder, quiet=1)


def main() -> None:
    compile_package()
    print("the metricbus package's bytecode compiled first, as pip install does")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        t = time.perf_counter()
        build(data_dir)
        print(f"two runs of {STEPS:,} steps x {METRICS} scalars archived in {time.perf_counter() - t:.0f} s")
        env = {
            **os.environ,
            "METRICBUS_BOOTSTRAP": "127.0.0.1:1",
            "METRICBUS_DATA_DIR": tmp,
            "METRICBUS_RUNTIME_DIR": tmp,
        }
        mb = [sys.executable, "-m", "metricbus"]
        commands = {
            "metricbus runs": [*mb, "runs"],
            "metricbus health <run>": [*mb, "health", RUNS[0]],
            "metricbus compare <a> <b>": [*mb, "compare", RUNS[0], RUNS[1]],
            "python -c 'import metricbus' (the floor)": [sys.executable, "-c", "import metricbus"],
            "TensorBoard's loader, one run (the peer)": [
                sys.executable,
                "-c",
                PEER,
                str(data_dir / "tb" / RUNS[0]),
                str(METRICS),
            ],
        }
        print(f"  {'command (a fresh process each)':<46}{'seconds, median':>16}   all")
        for name, argv in commands.items():
            times = sorted(timed(argv, env) for _ in range(REPEATS))
            print(f"  {name:<46}{statistics.median(times):>16.2f}   {', '.join(f'{x:.2f}' for x in times)}")
        with bench_broker() as (_, broker):  # a stack: its dashboard, on a broker that answers
            live = {**env, "METRICBUS_BOOTSTRAP": broker.bootstrap}
            times = sorted(timed([*mb, "status"], live, check=False) for _ in range(REPEATS))
            name = "metricbus status, no stack (samples itself)"
            print(f"  {name:<46}{statistics.median(times):>16.2f}   {', '.join(f'{x:.2f}' for x in times)}")
            with running_stack(data_dir, live) as stack_env:  # health and status ask its dashboard
                times = [timed([*mb, "health", RUNS[0]], stack_env) for _ in range(REPEATS)]
                asked = sorted(timed([*mb, "status"], stack_env, check=False) for _ in range(REPEATS))
        name = "metricbus health <run>, a stack running"
        first, rest = times[0], sorted(times[1:])
        print(
            f"  {name:<46}{statistics.median(rest or times):>16.2f}   first {first:.2f} (judged there), then "
            + ", ".join(f"{x:.2f}" for x in rest)
        )
        name = "metricbus status, a stack running"
        print(f"  {name:<46}{statistics.median(asked):>16.2f}   {', '.join(f'{x:.2f}' for x in asked)}")
        status_against_a_cluster(data_dir)


if __name__ == "__main__":
    main()
