"""metricbus.history() and metricbus.runs(): the archive as pandas DataFrames."""

import math

import pytest

import metricbus
from metricbus.replay import archived_runs
from metricbus.schemas import (
    CONFIG_UPDATE,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    MetricbusError,
    Settings,
    config_update,
    default_codec,
    run_started,
)
from metricbus.sinks import ParquetArchive

FP = default_codec().newest("EventBatch").fingerprint


def ev(run, seq, kind, body, producer="p1"):
    return Event(run, producer, seq, 1_700_000_000_000 + seq * 1000, kind, body, FP)


@pytest.fixture
def settings(tmp_path):
    archive = ParquetArchive(tmp_path / "archive")
    archive.open()
    for run, project, lr in (("run-a", "ppo", 0.1), ("run-b", "ppo", 0.2), ("run-c", "sft", 0.3)):
        events = [ev(run, 0, RUN_STARTED, run_started(project, f"name-{run}", {"lr": lr}))]
        for step in range(5):
            body = {"step": step, "epoch": None, "rank": 0, "samples": {}}
            body["scalars"] = {
                "Train/Loss": 1.0 / (step + 1),
                "Train/AvgReward": math.nan if step == 2 else step,
            }
            events.append(ev(run, step + 1, METRICS, body))
        events.append(ev(run, 6, CONFIG_UPDATE, config_update({"warmup": 5}, 4)))
        if run != "run-b":
            events.append(ev(run, 7, RUN_FINISHED, {"status": "finished", "summary": {"best": 4.0}}))
        derived = {"step": 4, "epoch": None, "rank": 0, "scalars": {"Train/Loss_ema": 0.5}, "samples": {}}
        events.append(Event(run, "metricbus.stream", 0, 1_700_000_009_000, METRICS, derived, FP))
        archive.write(events)
    archive.flush()
    return Settings(data_dir=tmp_path)


def test_history_is_a_wide_frame_by_step_or_tidy_rows(settings):
    wide = metricbus.history("run-a", settings=settings)
    assert list(wide.index) == [0, 1, 2, 3, 4] and wide.index.name == "step"
    assert wide.loc[3, "Train/Loss"] == 0.25 and math.isnan(wide.loc[2, "Train/AvgReward"])
    assert wide.loc[4, "Train/Loss_ema"] == 0.5  # derived beside logged
    logged = metricbus.history("run-a", derived=False, settings=settings)
    assert "Train/Loss_ema" not in logged.columns
    only = metricbus.history("run-a", metrics=["Train/Loss"], settings=settings)
    assert list(only.columns) == ["Train/Loss"]
    tidy = metricbus.history("run-a", wide=False, settings=settings)
    assert list(tidy.columns) == ["run", "step", "name", "value", "wall_time", "labels"] and len(tidy) == 11


def test_runs_lists_every_run_with_its_config_and_state(settings):
    frame = metricbus.runs(settings=settings)
    assert list(frame["run_id"]) == ["run-a", "run-b", "run-c"]
    row = frame.set_index("run_id").loc["run-b"]
    assert row["state"] == "running or crashed" and row["last_step"] == 4 and row["name"] == "name-run-b"
    assert row["config"] == {"lr": 0.2, "warmup": 5}  # the start's config with its update
    assert frame.set_index("run_id").loc["run-a", "summary"] == {"best": 4.0}
    assert list(metricbus.runs(project="sft", settings=settings)["run_id"]) == ["run-c"]
    # counted from the archive's columns (a run's metrics never become Python objects here);
    # the stream's derived events are not the run's
    a = frame.set_index("run_id").loc["run-a"]
    assert (a["events"], a["first_step"], a["last_step"]) == (8, 0, 4)
    assert a["started"].value // 10**6 == 1_700_000_000_000 and a["ended"].value // 10**6 == 1_700_000_007_000
    assert row["events"] == 7 and str(row["ended"]) == "NaT"  # run-b: no RunFinished


def test_runs_shows_a_run_once_in_its_own_project_whatever_folders_hold_it(tmp_path):
    """Filtering by a project with a slash found nothing (the folder's name is percent-encoded,
    and so was the column), and a run with rows in a placeholder folder (its derived series
    before its start, or the archive's fallback) was listed once per folder."""
    archive = ParquetArchive(tmp_path / "archive")
    archive.open()
    body = {"step": 1, "epoch": None, "rank": 0, "scalars": {"x": 1.0}, "samples": {}}
    archive.write([Event("run-d", "metricbus.stream", 0, 1_700_000_000_000, METRICS, body, FP)])
    archive.flush()  # a derived point before its RunStarted: project=_unknown
    archive = ParquetArchive(tmp_path / "archive")  # restarted: the start goes to its project's
    archive.write(
        [ev("run-d", 0, RUN_STARTED, run_started("grpo/gemma", "d")), ev("run-d", 1, METRICS, body)]
    )
    archive.flush()
    assert len(list((tmp_path / "archive").glob("project=*/run=run-d"))) == 2
    # run-e: its own folder refused its only flush (a file in the way): all of it in the fallback
    in_the_way = tmp_path / "archive" / "project=grpo%2Fgemma" / "run=run-e"
    in_the_way.write_bytes(b"")
    archive.write(
        [ev("run-e", 0, RUN_STARTED, run_started("grpo/gemma", "e")), ev("run-e", 1, METRICS, body)]
    )
    archive.flush()
    in_the_way.unlink()  # mended; the run's rows stay where they went
    settings = Settings(data_dir=tmp_path)
    frame = metricbus.runs(settings=settings)
    assert list(frame["run_id"]) == ["run-d", "run-e"] and set(frame["project"]) == {"grpo/gemma"}
    assert list(metricbus.runs(project="grpo/gemma", settings=settings)["run_id"]) == ["run-d", "run-e"]
    with pytest.raises(MetricbusError, match=r"no run of project 'grpo' .* \(its projects: grpo/gemma\)"):
        metricbus.runs(project="grpo", settings=settings)  # a project's prefix is not the project
    assert archived_runs(settings.archive_dir, None, "grpo/gemma") == ["run-d", "run-e"]  # replay --project


def test_labelled_values_get_their_labels_in_tidy_rows_and_a_column_per_label_when_wide(tmp_path):
    archive = ParquetArchive(tmp_path / "archive")
    archive.open()
    events = [ev("run-l", 0, RUN_STARTED, run_started("p", "labelled", {}))]
    for step in range(4):
        body = {"step": step, "epoch": None, "rank": 0, "samples": {}, "labels": {"task": "ab"[step % 2]}}
        body["scalars"] = {"episode/reward": float(step)}
        events.append(ev("run-l", step + 1, METRICS, body))
    archive.write(events)
    archive.flush()
    settings = Settings(data_dir=tmp_path)
    tidy = metricbus.history("run-l", wide=False, settings=settings)
    assert list(tidy["labels"]) == [{"task": "a"}, {"task": "b"}, {"task": "a"}, {"task": "b"}]
    wide = metricbus.history("run-l", settings=settings)
    assert list(wide.columns) == ["episode/reward", "episode/reward [task=a]", "episode/reward [task=b]"]
    assert wide["episode/reward"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert wide["episode/reward [task=a]"].tolist()[::2] == [0.0, 2.0]
    assert math.isnan(wide["episode/reward [task=a]"][1])


def test_the_api_finds_a_run_as_every_command_does_and_says_when_it_cannot(settings):
    """By id, unique id prefix, name or the start of a name; an unknown or ambiguous one is an error."""
    whole = metricbus.history("run-a", settings=settings)
    for ref in ("name-run-a", "name-run-a"[:8] + "-a", "run-a"):
        assert metricbus.history(ref, settings=settings).equals(whole), ref
    with pytest.raises(
        MetricbusError, match=r"no run 'nope' in the archive .*archive.*`metricbus runs` lists them"
    ):
        metricbus.history("nope", settings=settings)
    with pytest.raises(MetricbusError, match=r"'run-' names 3 runs: run-a, run-b, run-c"):
        metricbus.history("run-", settings=settings)
    with pytest.raises(
        MetricbusError, match=r"no run of project 'dqn' in the archive .* \(its projects: ppo, sft\)"
    ):
        metricbus.runs(project="dqn", settings=settings)
    with pytest.raises(MetricbusError, match="no run 'nope'"):
        metricbus.curves("ppo", "Train/Loss", runs=["nope"], settings=settings)


def test_a_missing_pandas_names_the_function_that_needs_it(settings, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("no pandas here")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    for call, name in (
        (lambda: metricbus.runs(settings=settings), "runs"),
        (lambda: metricbus.history("run-a", settings=settings), "history"),
    ):
        with pytest.raises(
            MetricbusError, match=rf"metricbus\.{name}\(\) needs pandas: pip install 'metricbus\[analysis\]'"
        ):
            call()
