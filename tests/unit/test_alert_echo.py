"""`metricbus up` says every alert on its own terminal, with the run's name (the console consumer's lines)."""

from metricbus.schemas import RUN_STARTED, Event, default_codec, format_alert, run_started
from metricbus.sinks import ParquetArchive
from metricbus.stack._echo import NAME_WAIT_S, AlertEcho

FP = default_codec().newest("EventBatch").fingerprint


def alert(run_id, state="firing"):
    return {
        "run_id": run_id, "state": state, "severity": "critical", "rule": "nan_loss", "metric": "Train/Loss",
        "step": 7, "message": "loss is NaN or infinite: training has diverged: value nan", "ts_ms": 1,
    }  # fmt: skip


def test_each_alert_line_is_said_once_with_its_runs_name_and_nothing_else_is(tmp_path):
    archive = tmp_path / "archive"
    sink = ParquetArchive(archive)
    sink.open()
    sink.write([Event("run-1", "p", 0, 1, RUN_STARTED, run_started("proj", "my-run"), FP)])
    sink.flush()
    log = tmp_path / "alerts-console.log"
    log.write_text(format_alert(alert("run-0")) + "\n")  # an earlier `up`'s: said then, not now
    said: list[str] = []
    now = [0.0]
    echo = AlertEcho(log, archive, said.append, clock=lambda: now[0])
    with open(log, "a") as f:
        f.write("2026 INFO metricbus.alerts: consumer started\n")
        f.write(format_alert(alert("run-1")) + "\n" + format_alert(alert("run-2", "resolved"))[:20])
    echo.poll()
    assert said == ["metricbus alert: [FIRING] critical nan_loss: run my-run (run-1) Train/Loss step 7: "
                    "loss is NaN or infinite: training has diverged: value nan"]  # fmt: skip
    with open(log, "a") as f:  # the rest of the half-written line; run-2 is not archived (yet)
        f.write(format_alert(alert("run-2", "resolved"))[20:] + "\n" + format_alert(alert("run-1")) + "\n")
    echo.poll()
    now[0] = NAME_WAIT_S - 0.1
    echo.poll()
    assert len(said) == 1  # run-2's line waits for its name, and run-1's behind it
    now[0] = NAME_WAIT_S + 0.5
    echo.poll()
    assert len(said) == 3 and said[1].startswith("metricbus alert: [RESOLVED] critical nan_loss: run run-2 ")
    assert said[2].startswith("metricbus alert: [FIRING] critical nan_loss: run my-run (run-1)")
    # a run that reaches the archive while its alert waits is said by its name
    with open(log, "a") as f:
        f.write(format_alert(alert("run-3")) + "\n")
    echo.poll()
    assert len(said) == 3
    sink.write([Event("run-3", "p", 0, 1, RUN_STARTED, run_started("proj", "third"), FP)])
    sink.flush()
    now[0] += 1.0
    echo.poll()
    assert said[3].startswith("metricbus alert: [FIRING] critical nan_loss: run third (run-3)")
    log.unlink()
    echo.poll()  # a log gone (rotated by hand) is no error
    log.write_text(format_alert(alert("run-1", "resolved")) + "\n")
    echo.poll()
    assert len(said) == 5
    assert said[-1].startswith("metricbus alert: [RESOLVED] critical nan_loss: run my-run (run-1)")


def test_the_idempotency_key_is_one_per_alert_transition():
    from metricbus.sinks.alerts import idempotency_key

    a = {**alert("run-1"), "seq": 4}
    assert idempotency_key(a) == idempotency_key(dict(a)) != idempotency_key({**a, "seq": 5})
    timed = {**alert("run-1"), "seq": -1, "rule": "run_stalled"}  # no identity: run, rule, state, time
    assert (
        idempotency_key(timed) != idempotency_key({**timed, "ts_ms": 2}) and len(idempotency_key(timed)) == 32
    )
