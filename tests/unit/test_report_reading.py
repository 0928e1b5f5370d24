"""`metricbus report` reads a run once, a chunk at a time (a 200,000-step run's events held whole
took 1.32 GB): the page is the same however the run is cut into chunks, and says what it must."""

import math

from metricbus.diagnostics._backtest import raising, rule_alerts
from metricbus.diagnostics._report import build, read_run
from metricbus.schemas import (
    DERIVED_PRODUCER,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    default_codec,
    run_started,
)
from metricbus.sinks import ParquetArchive, iter_events, read_events
from metricbus.stream_jobs import DEFAULT_RULES, StreamProcessor, load_rules

FP = default_codec().newest("EventBatch").fingerprint
T0 = 1_700_000_000_000


def archive_run(root, run, steps=300):
    events = [Event(run, "p", 0, T0, RUN_STARTED, run_started("proj", f"name-{run}", {"lr": 0.1}), FP)]
    for s in range(steps):
        scalars = {
            "Train/Loss": math.nan if s in (150, steps - 1) else 1.0 / (s + 1),
            "Train/AvgReward": s / steps,
            "grad/total_norm": 1.0 + s % 5,
        }
        body = {
            "step": s,
            "epoch": s // 100,
            "rank": 0,
            "scalars": scalars,
            "samples": {"Train/Reward": [s, -s]},
        }
        events.append(Event(run, "p", s + 1, T0 + s * 1000, METRICS, body, FP))
        point = {"Train/Loss_recent_mean": scalars["Train/Loss"]}
        if s % 100 == 99:
            point["Epoch/AvgReward"] = s / steps
        derived = {"step": s, "epoch": s // 100, "rank": 0, "scalars": point, "samples": {}}
        events.append(Event(run, DERIVED_PRODUCER, s, T0 + s * 1000, METRICS, derived, FP))
    events.append(Event(run, "p", steps + 1, T0 + steps * 1000, RUN_FINISHED, {"status": "finished"}, FP))
    archive = ParquetArchive(root)
    archive.open()
    archive.write(events)
    archive.flush()


def report(root, rows):
    """The report's page and alerts, the run read in chunks of about ``rows`` archive rows."""
    alerts: list = []
    chunks = list(iter_events(root, "run-a", derived=True, rows=rows))
    once = iter(chunks)  # an iterator: a second pass over it would find nothing
    reading = read_run(once, lambda logged: raising(logged, alerts, DEFAULT_RULES))
    others = {"run-b": read_run(iter_events(root, "run-b", derived=True, rows=rows))}
    return build("run-a", reading, others, alerts), alerts, len(chunks)


def test_the_report_reads_a_run_once_and_any_chunking_makes_the_same_page(tmp_path):
    archive_run(tmp_path, "run-a")
    archive_run(tmp_path, "run-b")
    page, alerts, chunks = report(tmp_path, rows=7)
    assert chunks > 100  # cut into many chunks, Metrics events across their edges
    for rows in (64, 1 << 15):
        other_page, other_alerts, _ = report(tmp_path, rows)
        assert other_page == page and repr(other_alerts) == repr(alerts)  # repr: NaN == NaN
    # the alerts as the stream's processor raises them on the logged events, in records of 100
    processor, logged, expected = (
        StreamProcessor(rules=load_rules(DEFAULT_RULES)),
        read_events(tmp_path, "run-a"),
        [],
    )
    for i in range(0, len(logged), 100):
        expected += processor.process(logged[i : i + 100]).alerts
    assert repr(alerts) == repr(expected) == repr(rule_alerts(logged, DEFAULT_RULES))
    nans = [a["step"] for a in alerts if a["rule"] == "nan_loss" and a["state"] == "firing"]
    assert nans == [150, 299]  # 299: in the last, short record
    assert "name-run-a (run-a)" in page and "finished" in page
    assert page.count("<tr><td>") >= 3 + 3 + 3  # epochs, gradient phases, rewards per epoch
    assert '"Train/Loss_recent_mean"' in page and '"Train/Loss (run-b)"' in page
    # three scalars a step and the per-step mean of its sample array; the stream's not counted
    assert "4 logged series, 1200 points" in page


def test_the_report_goes_into_the_data_directory_unless_told_where(tmp_path, capsys):
    from metricbus.cli import main

    archive_run(tmp_path / "archive", "run-a", steps=20)
    assert main(["--data-dir", str(tmp_path), "report", "run-a"]) == 0
    out = tmp_path / "reports" / "run-a.html"
    assert f"wrote {out}" in capsys.readouterr().out
    assert "name-run-a (run-a)" in out.read_text()
