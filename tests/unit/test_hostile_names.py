"""Issue 13: run ids, projects and metric names from a topic are untrusted.

Hostile ids never get past decoding (dead-lettered by every consumer with the reason); hostile
projects and metric names reach each sink, which writes them under its own directory or
refuses the event with a reason, and goes on. Nothing appears outside the data directory.
"""

import os

import pytest

from metricbus.schemas import (
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    UnsafeRecordError,
    decode_aggregates,
    decode_events,
    default_codec,
    encode_aggregates,
    encode_events,
    run_started,
)
from metricbus.sinks import Feeder, make_sink

HOSTILE = [
    "",
    ".",
    "..",
    "../../etc",
    "x/y",
    "a\x00b",
    "x" * 10_000,
    "run=x",
    "-rf",
    "*",
    "émoji🚀",
    "a\tb\nc",
]
HOSTILE_METRICS = ["", "x" * 10_000, "/../../etc", "nul\x00here", "tab\there", "new\nline", "🚀/loss"]


@pytest.mark.parametrize("bad", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_run_or_producer_id_is_refused_at_decode(bad):
    codec = default_codec()
    body = {"step": 0, "epoch": None, "rank": 0, "scalars": {"x": 1.0}, "samples": {}}
    for run_id, producer in ((bad, "p1"), ("run-1", bad)):
        record = encode_events(codec, run_id, producer, [(0, 1, METRICS, body)])
        with pytest.raises(UnsafeRecordError, match="not usable"):
            decode_events(codec, record)
    derived = encode_aggregates(codec, bad, [], first_seq=0)
    with pytest.raises(UnsafeRecordError):
        decode_aggregates(codec, derived)


def _files_under(root):
    return {os.path.join(d, f) for d, _, files in os.walk(root) for f in files}


@pytest.mark.parametrize("kind", ["parquet", "tensorboard", "wandb"])
def test_hostile_projects_and_metric_names_stay_inside_the_sink_directory(kind, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # anything written relative to the working directory would show here
    out = tmp_path / "data" / kind
    sink = make_sink(kind, out)
    sink.open()
    feeder = Feeder(sink)
    codec = default_codec()
    projects = HOSTILE
    rejected = written = 0
    for i, project in enumerate(projects):
        run_id = f"run-{i}"
        events = [(0, 1, RUN_STARTED, run_started(project, project or "n"))]
        events += [
            (
                1 + j,
                2 + j,
                METRICS,
                {"step": j, "epoch": None, "rank": 0, "scalars": {name: 1.0}, "samples": {}},
            )
            for j, name in enumerate(HOSTILE_METRICS)
        ]
        events.append((1 + len(HOSTILE_METRICS), 99, RUN_FINISHED, {"status": "finished", "summary": {}}))
        fresh = feeder.fresh(decode_events(codec, encode_events(codec, run_id, f"p{i}", events)))
        refused = feeder.write(fresh)
        assert all(reason for _, reason in refused)  # every refusal says why
        rejected += len(refused)
        written += len(fresh) - len(refused)
        sink.derived_complete(run_id)
    sink.flush()
    sink.close()
    outside = {f for f in _files_under(tmp_path) if not f.startswith(str(tmp_path / "data") + os.sep)}
    assert outside == set()
    assert rejected == 0  # every hostile project and metric name is kept, under a safe path or name
    assert written == len(projects) * (len(HOSTILE_METRICS) + 2)
