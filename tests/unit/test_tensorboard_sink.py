import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metricbus.schemas import (
    HISTOGRAM,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    Event,
    default_codec,
    run_started,
)
from metricbus.sinks.tensorboard import TensorBoardSink, tag

FP = default_codec().newest("EventBatch").fingerprint


def ev(seq, kind, body, run="run-1"):
    return Event(run, "p1", seq, 1_700_000_000_000 + seq * 1000, kind, body, FP)


def started(config=None):
    return ev(
        0, RUN_STARTED, run_started("grpo", "gemma", config or {"lr": 1e-4}, host="h", pid=1, git="abc")
    )


def accumulate(path):
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_every_logged_value_is_read_back_at_its_step_by_tensorboards_reader(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.open()
    values = {step: {"Train/Loss": 1 / (step + 1), "rewards/total_mean": step * 0.1} for step in range(50)}
    events = [started({"lr": 1e-4, "model": {"id": "gemma", "lora_rank": 8}})]
    events += [
        ev(step + 1, METRICS, {"step": step, "epoch": None, "rank": 0, "scalars": v, "samples": {}})
        for step, v in values.items()
    ]
    sink.write(events)
    sink.flush()
    run_dir = tmp_path / "tb" / "grpo" / "gemma-run-1"
    acc = accumulate(run_dir)
    for name in ("Train/Loss", "rewards/total_mean"):
        got = [(s.step, s.value, s.wall_time) for s in acc.Scalars(name)]
        assert [g[0] for g in got] == list(range(50))
        assert [g[1] for g in got] == pytest.approx([np.float32(values[s][name]) for s in range(50)])
        assert got[3][2] == pytest.approx(1_700_000_000 + 4)
    assert {"run/config", "custom_scalars__config__", "_hparams_/session_start_info"} <= set(
        acc.Tags()["tensors"]
    )
    sink.close()


def test_histograms_tables_and_unmappable_names(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.open()
    sink.write(
        [
            started(),
            ev(
                1,
                METRICS,
                {
                    "step": 5,
                    "epoch": None,
                    "rank": 0,
                    "scalars": {"loss (nats)": 2.0, "loss_(nats)": 3.0},
                    "samples": {"rewards/format_exact": [0.0, 1.0, 1.0, 0.5]},
                },
            ),
            ev(
                2,
                HISTOGRAM,
                {
                    "step": 6,
                    "name": "rewards/answer_check_hist",
                    "edges": [0.0, 0.5, 1.0],
                    "counts": [3, 7],
                    "rank": 0,
                },
            ),
            ev(
                3,
                TABLE,
                {
                    "step": 7,
                    "name": "rubric_criteria_summary",
                    "columns": ["criterion", "mean"],
                    "rows": [["clarity", 0.75]],
                },
            ),
            ev(4, RUN_FINISHED, {"status": "finished", "summary": {"final/x_mean": 1.0}}),
        ]
    )
    sink.close()
    acc = accumulate(tmp_path / "tb" / "grpo" / "gemma-run-1")
    tags = acc.Tags()
    a, b = tag("loss (nats)"), tag("loss_(nats)")
    assert a != b and a.startswith("loss__nats_~") and b.startswith("loss__nats_~")  # mapped, still distinct
    assert tag("Train/Loss") == "Train/Loss" and tag("a~b") != "a~b"
    assert {a, b} <= set(tags["scalars"])  # both kept, none dropped
    assert acc.Scalars(a)[0].value == 2.0 and acc.Scalars(b)[0].value == 3.0
    (h,) = acc.Histograms("rewards/answer_check_hist")
    assert h.step == 6 and h.histogram_value.bucket == [3.0, 7.0]
    assert acc.Histograms("rewards/format_exact")[0].histogram_value.num == 4
    (table,) = acc.Tensors("rubric_criteria_summary")
    assert b"| clarity | 0.75 |" in table.tensor_proto.string_val[0]


def test_a_restarted_sink_knows_which_seqs_it_wrote(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.open()
    sink.write(
        [
            started(),
            ev(1, METRICS, {"step": 0, "epoch": None, "rank": 0, "scalars": {"x": 1.0}, "samples": {}}),
        ]
    )
    sink.flush()
    again = TensorBoardSink(tmp_path / "tb")
    assert again.recover("run-1") == {"p1": [(0, 1)]}


def test_a_killed_sinks_unflushed_tail_is_cut_so_redelivery_writes_it_once(tmp_path):
    """What was appended after the last flush (and ledger save) is re-delivered: it is cut first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from metricbus.schemas import METRICS, Event, default_codec
    from metricbus.sinks import TensorBoardSink

    fp = default_codec().newest("EventBatch").fingerprint

    def ev(seq):
        body = {"step": seq, "epoch": None, "rank": 0, "scalars": {"loss": float(seq)}, "samples": {}}
        return Event("run-cut", "p", seq, 1_700_000_000_000 + seq, METRICS, body, fp)

    first = TensorBoardSink(tmp_path)
    first.open()
    first.write([ev(s) for s in range(5)])
    first.flush()
    first.write([ev(s) for s in range(5, 8)])  # written, never flushed: the process is killed here
    first._writers["run-cut"]._file.flush()

    second = TensorBoardSink(tmp_path)
    second.open()
    held = second.recover("run-cut")
    assert held == {"p": [(0, 4)]}
    second.write([ev(s) for s in range(5, 10)])  # the re-delivery from the committed offset
    second.close()
    (directory,) = tmp_path.glob("*/*run-cut")
    acc = EventAccumulator(str(directory))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(10))


def test_hostile_histograms_and_configs_are_refused_with_their_reason_and_the_run_goes_on(tmp_path):
    """A topic is untrusted: what cannot be drawn comes back with a reason a user can act on."""
    sink = TensorBoardSink(tmp_path / "tb")
    sink.open()
    bad_config = ev(0, RUN_STARTED, {**run_started("grpo", "gemma", {}), "config_json": "[1]"})
    hist = {"step": 1, "name": "h", "rank": 0}
    bad = [
        bad_config,
        ev(1, HISTOGRAM, {**hist, "edges": [], "counts": []}),
        ev(2, HISTOGRAM, {**hist, "edges": [0.0, float("nan"), 1.0], "counts": [1, 2]}),
        ev(3, HISTOGRAM, {**hist, "edges": [0.0, 1.0], "counts": [-5]}),
    ]
    good = ev(
        4, METRICS, {"step": 9, "epoch": None, "rank": 0, "scalars": {"Train/Loss": 0.5}, "samples": {}}
    )
    rejected: list[str] = []
    for e in [*bad, good]:
        rejected += [why for _, why in (sink.write([e]) or [])]
    sink.close()
    assert rejected == [
        "tensorboard cannot take this metricbus.RunStarted event: "
        "ValueError: config_json must be a JSON object, got list",
        "tensorboard cannot take this metricbus.Histogram event: "
        "ValueError: a histogram needs one edge more than counts: 0 for 0",
        "tensorboard cannot take this metricbus.Histogram event: "
        "ValueError: a histogram's edges must be finite and ascending",
        "tensorboard cannot take this metricbus.Histogram event: "
        "ValueError: a histogram's counts must not be negative",
    ]
    (run_dir,) = [p for p in (tmp_path / "tb").rglob("*run-1") if p.is_dir()]
    assert [(s.step, s.value) for s in accumulate(run_dir).Scalars("Train/Loss")] == [(9, 0.5)]


def test_runs_whose_directory_names_coincide_keep_their_own_directories(tmp_path):
    """Run "1" named "x" and run "x-1" (named as its id) were both <project>/x-1.

    And run "1" took the directory of any run whose name ended in "-1" (its ledger too: seqs it
    never wrote).
    """

    def run(run_id, name, loss, root=tmp_path / "tb"):
        sink = TensorBoardSink(root)
        sink.open()
        body = {"step": 0, "epoch": None, "rank": 0, "scalars": {"Train/Loss": loss}, "samples": {}}
        sink.write(
            [ev(0, RUN_STARTED, run_started("grpo", name), run=run_id), ev(1, METRICS, body, run=run_id)]
        )
        sink.close()
        return sink

    run("x-1", "x-1", 0.5)
    run("1", "x", 0.25)  # a sink restarted between them, as after a crash
    run("run-1", "y", 0.125)
    dirs = sorted(p.parent for p in (tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert len(dirs) == 3
    losses = sorted(s.value for d in dirs for s in accumulate(d).Scalars("Train/Loss"))
    assert losses == [0.125, 0.25, 0.5]  # each in a directory of its own
    sink = TensorBoardSink(tmp_path / "tb")
    assert {run_id: dict(sink.recover(run_id)) for run_id in ("1", "x-1", "run-1")} == {
        run_id: {"p1": [(0, 1)]} for run_id in ("1", "x-1", "run-1")
    }
    assert TensorBoardSink(tmp_path / "tb").recover("2") == {}


def test_a_run_whose_directory_cannot_be_written_goes_to_the_fallback_and_the_others_go_on(tmp_path):
    """A file where a run's directory goes: every event of that run was dead-lettered."""
    root = tmp_path / "tb"
    (root / "grpo").mkdir(parents=True)
    (root / "grpo" / "gemma-run-1").write_bytes(b"")  # in the way (as a directory of another user)
    sink = TensorBoardSink(root)
    sink.open()
    body = {"step": 0, "epoch": None, "rank": 0, "scalars": {"Train/Loss": 0.5}, "samples": {}}
    other = [ev(0, RUN_STARTED, run_started("grpo", "n"), run="run-2"), ev(1, METRICS, body, run="run-2")]
    assert sink.write([started(), ev(1, METRICS, body), *other]) == []
    sink.close()
    (fallback,) = sink.run_dirs("run-1")
    assert fallback == root / "_fallback" / "gemma-run-1"
    assert [s.value for s in accumulate(fallback).Scalars("Train/Loss")] == [0.5]
    assert [s.value for s in accumulate(root / "grpo" / "n-run-2").Scalars("Train/Loss")] == [0.5]
    assert dict(TensorBoardSink(root).recover("run-1")) == {"p1": [(0, 1)]}  # a restart knows
    (root / "grpo" / "gemma-run-1").unlink()  # mended: a restarted sink writes the run at home
    again = TensorBoardSink(root)
    again.write([ev(0, RUN_STARTED, run_started("grpo", "gemma"), run="run-1")])
    again.close()
    assert again.run_dirs("run-1") == [root / "grpo" / "gemma-run-1", fallback]  # its own first


def test_the_least_recently_written_runs_are_closed_and_go_on_in_their_own_file(tmp_path, monkeypatch):
    """The sink held every run it ever wrote open: past ~1,000 runs a usual limit of 1,024
    descriptors made each new run's open fail (Errno 24, measured)."""
    from metricbus.sinks import tensorboard

    monkeypatch.setattr(tensorboard, "OPEN_RUNS", 2)
    sink = TensorBoardSink(tmp_path / "tb")
    sink.open()
    runs = [f"run-{i}" for i in range(5)]
    for r in runs:
        sink.write([Event(r, "p1", 0, 1_700_000_000_000, RUN_STARTED, run_started("p", r), FP)])
    listed = []
    run_dirs = sink.run_dirs
    monkeypatch.setattr(sink, "run_dirs", lambda run_id: listed.append(run_id) or run_dirs(run_id))
    for step in range(3):  # round robin: every run is closed, and reopened, at each flush
        for r in runs:
            body = {"step": step, "epoch": None, "rank": 0, "scalars": {"x": step + 0.5}, "samples": {}}
            sink.write([Event(r, "p1", step + 1, 1_700_000_001_000 + step, METRICS, body, FP)])
        sink.flush()
        assert len(sink._writers) == 2  # the two last written stay open
    assert listed == []  # a run reopened is found where it was closed, without listing the root
    sink.close()
    for r in runs:
        directory = tmp_path / "tb" / "p" / r
        assert len(list(directory.glob("events.out.tfevents.*"))) == 1  # reopened, it went on
        assert [(s.step, s.value) for s in accumulate(directory).Scalars("x")] == [
            (0, 0.5),
            (1, 1.5),
            (2, 2.5),
        ]
    again = TensorBoardSink(tmp_path / "tb")  # a restart knows what each run holds
    assert again.recover("run-0") == {"p1": [(0, 3)]}


def test_a_sink_writes_more_runs_than_its_limit_of_open_files_allows(tmp_path):
    """Through the sink runner, more runs than a soft limit of 640 open files allows at once
    (the sink holds up to twice its OPEN_RUNS, 256, within a batch)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import asyncio, resource, types
        from pathlib import Path
        from metricbus.schemas import Settings, encode_events, default_codec, RUN_STARTED, RUN_FINISHED, METRICS, run_started
        from metricbus.sinks import SinkRunner
        from metricbus.sinks.tensorboard import TensorBoardSink

        resource.setrlimit(resource.RLIMIT_NOFILE, (640, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        codec = default_codec()
        settings = Settings(data_dir=Path({str(tmp_path)!r}))
        runner = SinkRunner(TensorBoardSink(settings.data_dir / "tb"), settings)
        runner.open()
        for r in range(800):
            body = {{"step": 0, "epoch": None, "rank": 0, "scalars": {{"x": float(r)}}, "samples": {{}}}}
            events = [(0, 1, RUN_STARTED, run_started("p", f"r{{r}}")), (1, 2, METRICS, body)]
            value = encode_events(codec, f"r{{r}}", f"p{{r}}", events)
            record = types.SimpleNamespace(topic=settings.topics.events, partition=0, offset=r, value=value, key=None)
            asyncio.run(runner._process([record]))
            if r % 100 == 99:
                runner.flush()
        runner.flush()
        runner.close()
        print(runner.stats.written, runner.stats.rejected)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1600", "0"]
    for r in (0, 555, 799):
        assert [s.value for s in accumulate(tmp_path / "tb" / "p" / f"r{r}").Scalars("x")] == [float(r)]


def test_include_and_exclude_choose_the_metrics_tensorboard_gets(tmp_path):
    from metricbus.sinks import make_sink

    sink = make_sink("tensorboard", tmp_path / "tb", include=["Train/*", "debug/*"], exclude=["debug/*"])
    sink.open()
    body = {
        "step": 3,
        "epoch": None,
        "rank": 0,
        "scalars": {"Train/Loss": 0.5, "debug/grad": 1.0, "System/CPU": 9.0},
        "samples": {"Train/Reward": [0.1, 0.2], "other/samples": [1.0]},
    }
    hist = {"step": 3, "name": "debug/hist", "edges": [0.0, 1.0], "counts": [2], "rank": 0}
    assert sink.write([started(), ev(1, METRICS, body), ev(2, HISTOGRAM, hist)]) == []
    sink.flush()
    acc = accumulate(tmp_path / "tb" / "grpo" / "gemma-run-1")
    assert acc.Tags()["scalars"] == ["Train/Loss"]
    assert acc.Tags()["histograms"] == ["Train/Reward"]
    sink.close()


def test_the_archive_refuses_include_and_exclude_and_only_tensorboard_takes_a_layout(tmp_path):
    from metricbus.schemas import MetricbusError
    from metricbus.sinks import make_sink

    with pytest.raises(MetricbusError, match="keeps every event"):
        make_sink("parquet", tmp_path, exclude=["debug/*"])
    with pytest.raises(MetricbusError, match="--layout is the tensorboard sink's"):
        make_sink("wandb", tmp_path, layout=tmp_path / "layout.yaml")


def test_a_sink_must_implement_the_contract_and_gets_the_optional_members_as_no_ops():
    from metricbus.sinks import Sink

    class Half(Sink):
        name = "half"

        def open(self) -> None: ...

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]

    class Whole(Half):
        def recover(self, run_id):
            return {}

        def write(self, events):
            return []

        def pending(self):
            return 0

        def flush(self) -> None: ...

    sink = Whole()
    assert not sink.columnar
    sink.release(), sink.derived_complete("r"), sink.close()  # no-ops
    with pytest.raises(NotImplementedError):
        sink.write_columns(None)  # type: ignore[arg-type]


def test_a_full_disk_fails_the_flush_not_the_events_and_the_next_flush_writes_each_once(small_disk):
    """A real tmpfs that fills: nothing is refused as a bad event, the file is cut back to what
    the ledger records, and once there is room the retried flush writes every event once."""
    import errno

    from tests.conftest import fill

    sink = TensorBoardSink(small_disk / "tb")
    sink.open()
    sink.write([started()])
    sink.flush()
    filler = fill(small_disk, leave=2048)
    events = [
        ev(
            step + 1,
            METRICS,
            {"step": step, "epoch": None, "rank": 0, "scalars": {"Train/Loss": step / 7}, "samples": {}},
        )
        for step in range(2000)
    ]
    assert sink.write(events) == []  # nothing refused: a full disk is not a bad event
    with pytest.raises(OSError) as refused:
        sink.flush()
    assert refused.value.errno == errno.ENOSPC
    with pytest.raises(OSError):
        sink.flush()  # still full: refused again, the file still cut back
    filler.unlink()
    sink.flush()
    sink.close()
    acc = accumulate(small_disk / "tb" / "grpo" / "gemma-run-1")
    assert [s.step for s in acc.Scalars("Train/Loss")] == list(range(2000))
