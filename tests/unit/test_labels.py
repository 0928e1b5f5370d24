"""Labels and episode outcomes: from run.log_episode through the codec, the stream and the archive."""

import logging
from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metricbus.producers import Run
from metricbus.schemas import METRICS, RUN_FINISHED, Event, Settings, decode_events, default_codec
from metricbus.sinks import ParquetArchive, read_events
from metricbus.sinks._archive import SCHEMA
from metricbus.stream_jobs import StreamConfig, StreamProcessor
from metricbus.stream_jobs._derive import RunDeriver
from metricbus.stream_jobs._rules import parse_rules
from tests.fakes import FakeTransport

FP = default_codec().newest("EventBatch").fingerprint
TASKS = ("logo_a", "logo_b", "logo_c")


def episodes(n=300, seed=0):
    """n episodes over three tasks: logo_c is hard (lower reward, rarer success)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        task = TASKS[i % 3]
        hard = task == "logo_c"
        reward = float(rng.normal(0.2 if hard else 0.8, 0.1))
        success = bool(rng.random() < (0.2 if hard else 0.9))
        reason = "solved" if success else str(rng.choice(["timeout", "invalid_svg"]))
        out.append((i, task, reward, success, reason))
    return out


def quiet_run(tmp_path):
    """A Run on a fake transport (no broker), and the transport holding what it sent."""
    fake = FakeTransport()
    settings = Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1")
    return fake, Run("p", settings=settings, transport=fake, system_metrics=False)


def logged(settings, n=300):
    fake = FakeTransport()
    run = Run("p", settings=settings, transport=fake, system_metrics=False)
    for i, task, reward, success, reason in episodes(n):
        run.log_episode(
            reward, length=10 + i % 7, success=success, reason=reason, labels={"task": task}, step=i
        )
    assert run.finish(timeout=10)
    return [body for _, _, (kind, body) in fake.events() if kind == METRICS]


def test_log_episode_logs_the_outcome_with_its_labels(tmp_path):
    bodies = logged(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"), n=3)
    assert bodies[0]["scalars"] == {
        "episode/reward": pytest.approx(episodes(3)[0][2]),
        "episode/length": 10.0,
        "episode/success": 1.0 if episodes(3)[0][3] else 0.0,
    }
    assert bodies[0]["labels"] == {"task": "logo_a", "termination": episodes(3)[0][4]}
    assert [b["step"] for b in bodies] == [0, 1, 2]


def test_labels_survive_the_codec_and_bad_labels_never_reach_the_loop(tmp_path, caplog):
    fake, run = quiet_run(tmp_path)
    run.log({"r": 1.0}, step=0, labels={"task": "a", "level": 3})  # a non-str value is its str
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        run.log({"r": 2.0}, step=1, labels={f"k{i}": "v" for i in range(17)})  # over the limit
        run.log({"r": 3.0}, step=2, labels={"task": "x" * 129})  # too long
    assert run.finish(timeout=10)
    events = [e for rec in fake.records for e in decode_events(default_codec(), rec) if e.kind == METRICS]
    assert [e.body["labels"] for e in events] == [{"task": "a", "level": "3"}, {}, {}]
    assert [e.body["scalars"]["r"] for e in events] == [1.0, 2.0, 3.0]  # the values are kept
    assert run.stats()["dropped_values"] == 2
    assert sum("labels" in r.getMessage() for r in caplog.records) == 1  # said once


def test_the_stream_derives_per_label_means_success_rates_and_shares(tmp_path):
    bodies = logged(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    cfg = StreamConfig(label_window=50)
    events = [Event("r", "p", i, 1000 + i, METRICS, b, FP) for i, b in enumerate(bodies)]
    deriver = RunDeriver("r", cfg)
    points = []
    for i in range(0, len(events), 7):  # input records of 7 events, as the worker takes them
        points += deriver.feed_many(events[i : i + 7])[0]
    points += deriver.feed_many(
        [Event("r", "p", len(events), 9999, RUN_FINISHED, {"status": "finished"}, FP)]
    )[0]
    last = {p.name: p.value for p in points}
    for task in TASKS:
        mine = [e for e in episodes() if e[1] == task][-50:]
        assert last[f"by_task/{task}/episode/reward_recent_mean"] == pytest.approx(
            np.mean([e[2] for e in mine])
        )
        assert last[f"by_task/{task}/episode/success_recent_mean"] == pytest.approx(
            np.mean([e[3] for e in mine])
        )
    assert (
        last["by_task/logo_c/episode/success_recent_mean"]
        < last["by_task/logo_a/episode/success_recent_mean"]
    )
    reasons = [e[4] for e in episodes()][-50:]
    for reason in set(reasons):
        assert last[f"by_termination/{reason}/share"] == pytest.approx(reasons.count(reason) / 50)
    assert last["by_task/logo_b/share"] == pytest.approx(1 / 3, abs=0.02)
    # once per step a series was fed at (its value after the step's last event): never two
    # points of one name at one step (an aggregate record holds one value per name and step)
    seen = Counter((p.name, p.step) for p in points)
    assert max(seen.values()) == 1
    fed = {e.body["step"] for e in events if e.body.get("labels", {}).get("task") == "logo_a"}
    assert {p.step for p in points if p.name == "by_task/logo_a/episode/reward_recent_mean"} == fed
    # fed one record per event, the same points, bit for bit
    one = RunDeriver("r", cfg)
    single = [p for e in events for p in one.feed(e.kind, e.body, e.ts_ms)]
    single += one.feed(RUN_FINISHED, {"status": "finished"}, 9999)
    labelled = sorted(p for p in points if p.name.startswith("by_"))
    assert sorted(p for p in single if p.name.startswith("by_")) == labelled and labelled


def test_a_rule_watches_a_labels_success_rate(tmp_path):
    bodies = logged(Settings(data_dir=tmp_path, bootstrap="127.0.0.1:1"))
    rules = parse_rules(
        """
rules:
  - name: category_failing
    kind: threshold
    metric: "by_task/*/episode/success_recent_mean"
    op: "<"
    value: 0.5
    warmup: 20
    severity: warning
    message: "a task's success rate is under 50%"
"""
    )
    processor = StreamProcessor(StreamConfig(label_window=30), rules)
    fired = []
    for i in range(0, len(bodies), 10):
        out = processor.process(
            Event("r", "p", j, 1000 + j, METRICS, bodies[j], FP) for j in range(i, i + 10)
        )
        fired += [a for a in out.alerts if a["state"] == "firing"]
    assert [a["metric"] for a in fired] == ["by_task/logo_c/episode/success_recent_mean"]


def test_hostile_labels_become_safe_names_and_their_number_is_bounded(caplog):
    deriver = RunDeriver("r", StreamConfig(label_values=4, label_keys=2))
    with caplog.at_level(logging.WARNING, logger="metricbus.stream"):
        names = set()
        for i in range(10):
            body = {
                "step": i,
                "epoch": None,
                "rank": 0,
                "scalars": {"x": 1.0},
                "samples": {},
                "labels": {"../../etc": f"v {i}/..", "b": "1", "c": "2"},
            }
            names |= {p.name for p in deriver.feed(METRICS, body, i)}
        names |= {p.name for p in deriver.feed(RUN_FINISHED, {"status": "finished"}, 10)}
    assert "by_.._.._etc/v_0_../x_recent_mean" in names
    assert not any(n.startswith("by_c/") for n in names)  # a third key: over label_keys
    assert len({n.split("/")[1] for n in names if n.startswith("by_.._.._etc/")}) == 4
    assert deriver.labels.refused == 10 + 6
    assert sum("not derived" in r.getMessage() for r in caplog.records) == 1


def test_the_archive_keeps_labels_in_a_column_duckdb_and_old_files_read(tmp_path):
    sink = ParquetArchive(tmp_path / "archive")
    sink.open()
    body = {"step": 3, "epoch": None, "rank": 0, "scalars": {"episode/reward": 0.5, "episode/success": 1.0}}
    sink.write(
        [
            Event("run-1", "p1", 0, 1, METRICS, {**body, "samples": {}, "labels": {"task": "logo_a"}}, FP),
            Event("run-1", "p1", 1, 2, METRICS, {**body, "samples": {}, "labels": {}}, FP),
        ]
    )
    sink.flush()
    (path,) = sink.archive_dir.glob("project=*/run=run-1/*.parquet")
    rows = duckdb.sql(
        f"select seq, name, labels['task'] as task from read_parquet('{path}') order by seq, name"
    ).fetchall()
    assert rows == [
        (0, "episode/reward", "logo_a"),
        (0, "episode/success", "logo_a"),
        (1, "episode/reward", None),
        (1, "episode/success", None),
    ]
    assert [e.body["labels"] for e in read_events(sink.archive_dir, "run-1")] == [{"task": "logo_a"}, {}]
    # a file written before the labels column (format 1) reads with no labels
    old = pa.schema([f for f in SCHEMA if f.name != "labels"])
    row = {
        "run_id": ["run-2"],
        "producer_id": ["p1"],
        "seq": [0],
        "ts_ms": [1],
        "kind": [METRICS],
        "step": [0],
    }
    row |= {"epoch": [None], "rank": [0], "name": ["a"], "value": [1.0], "samples": [None], "payload": [None]}
    directory = sink.archive_dir / "project=p" / "run=run-2"
    directory.mkdir(parents=True)
    pq.write_table(pa.table({**row, "fingerprint": [FP.hex()]}, schema=old), directory / "part-0.parquet")
    (event,) = read_events(sink.archive_dir, "run-2")
    assert event.body["labels"] == {} and event.body["scalars"] == {"a": 1.0}


def test_the_demo_ppo_logs_each_cartpole_episode_with_its_outcome(tmp_path):
    from metricbus.demo._ppo import PPOConfig, train

    fake, run = quiet_run(tmp_path)
    train(run, PPOConfig(updates=4, seed=1))
    assert run.finish(timeout=10)
    episodes = [
        b for _, _, (kind, b) in fake.events() if kind == METRICS and "episode/reward" in b["scalars"]
    ]
    assert len(episodes) > 20
    for body in episodes:
        scalars, labels = body["scalars"], body["labels"]
        # CartPole pays 1 per step: an episode's length is its return (the vector env's reset
        # step after an episode ends belongs to no episode), and the time limit is 500 steps
        assert scalars["episode/length"] == scalars["episode/reward"] <= 500
        assert labels["termination"] in ("pole_fell", "time_limit")
        assert scalars["episode/success"] == float(labels["termination"] == "time_limit")
        assert body["epoch"] == body["step"] // 5
