import asyncio
import http.server
import io
import json
import threading
import time

import pytest
from kafka import KafkaProducer

from metricbus.schemas import client_options, default_codec
from metricbus.sinks.alerts import AlertRunner, ConsoleAlerts, WebhookAlerts

from .conftest import read_topic

pytestmark = pytest.mark.integration

ALERT = {
    "run_id": "run-7",
    "rule": "nan_loss",
    "state": "firing",
    "severity": "critical",
    "metric": "Train/Loss",
    "value": float("nan"),
    "step": 42,
    "message": "loss is NaN",
    "ts_ms": 1_700_000_000_000,
    "seq": 0,
}


def publish(settings, alerts):
    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    for a in alerts:
        value = a if isinstance(a, bytes) else default_codec().encode("Alert", a)
        producer.send(settings.topics.alerts, key=b"run-7", value=value)
    producer.flush()
    producer.close()


def run_consumer(settings, handler, group, until):
    """Run an AlertRunner until ``until(stats)``; return its stats."""

    async def main():
        runner = AlertRunner(settings, handler, group_id=group, flush_interval_s=0.2)

        async def watch():
            while not until(runner.stats):
                await asyncio.sleep(0.1)
            runner.stop()

        watcher = asyncio.create_task(watch())
        stats = await asyncio.wait_for(runner.run(), timeout=60)
        await watcher
        return stats

    return asyncio.run(main())


def test_console_prints_one_clear_line_per_alert(settings):
    publish(
        settings,
        [ALERT, {**ALERT, "state": "resolved", "step": 50, "message": "back within limits", "seq": 1}],
    )
    out = io.StringIO()
    stats = run_consumer(settings, ConsoleAlerts(out), "c", lambda _: out.getvalue().count("\n") >= 2)
    lines = out.getvalue().splitlines()
    assert stats.written == 2 and len(lines) == 2
    assert lines[0] == "[FIRING] critical nan_loss: run run-7 Train/Loss step 42: loss is NaN"
    assert lines[1].startswith("[RESOLVED]")


def test_an_alert_whose_run_id_is_unusable_is_dead_lettered_by_every_deliverer(settings):
    """W&B's deliverer opened a run named ".." and failed on a 300-character id with OSError."""
    publish(settings, [{**ALERT, "run_id": ".."}, {**ALERT, "run_id": "a" * 300}, ALERT])
    out = io.StringIO()
    stats = run_consumer(settings, ConsoleAlerts(out), "c", lambda st: st.records >= 3)
    assert stats.deadlettered == 2 and stats.written == 1
    assert out.getvalue().startswith("[FIRING] critical nan_loss: run run-7 ")
    reasons = [
        dict(r.headers)["metricbus.reason"].decode()
        for r in read_topic(settings, settings.topics.deadletter, 2)
    ]
    assert [r.split(":")[0] for r in reasons] == ["UnsafeRecordError", "UnsafeRecordError"]
    assert "run_id '..' is not usable" in reasons[0]


def test_a_hostile_metric_name_or_message_cannot_forge_or_hide_a_console_line(settings):
    """Names and messages come from topics: a newline would forge a line, ANSI escapes clear the screen."""
    forged = {
        **ALERT,
        "metric": "x\n[RESOLVED] critical nan_loss: run run-7 all good",
        "message": "\x1b[2J\u202egone",
    }
    publish(settings, [forged])
    out = io.StringIO()
    stats = run_consumer(settings, ConsoleAlerts(out), "c", lambda st: st.records >= 1)
    assert stats.written == 1
    assert out.getvalue().splitlines() == [
        "[FIRING] critical nan_loss: run run-7 x\\n[RESOLVED] critical nan_loss: run run-7 all good "
        "step 42: \\x1b[2J\\u202egone"
    ]


def test_a_resent_alert_is_delivered_once_even_across_consumer_restarts_and_a_bad_record_is_dead_lettered(
    settings,
):
    """A restarted stream worker re-sends alerts with their seq; the console prints each once."""
    second = {**ALERT, "state": "resolved", "step": 50, "message": "back within limits", "seq": 1}
    publish(settings, [ALERT, b"not an alert at all", ALERT])
    out = io.StringIO()
    stats = run_consumer(settings, ConsoleAlerts(out), "c", lambda st: st.records >= 3)
    assert stats.duplicates == 1 and stats.deadlettered == 1 and stats.written == 1
    publish(
        settings, [ALERT, second, {**ALERT, "seq": -1, "rule": "run_stalled", "metric": "*", "step": None}]
    )
    stats = run_consumer(settings, ConsoleAlerts(out), "c", lambda st: st.records >= 3)  # a new process
    assert stats.duplicates == 1 and stats.written == 2
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "[FIRING] critical nan_loss",
        "[RESOLVED] critical nan_loss",
        "[FIRING] critical run_stalled",
    ]
    (dead,) = read_topic(settings, settings.topics.deadletter, 1)
    assert dead.value == b"not an alert at all"
    assert "BadMagicError" in dict(dead.headers)["metricbus.reason"].decode()


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list = []
    keys: list = []  #: the Idempotency-Key of every request, failed ones too
    fail_first = 0

    def do_POST(self):  # noqa: N802
        type(self).keys.append(self.headers.get("Idempotency-Key"))
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        try:  # strictly, as Slack does: NaN is no JSON ("invalid_payload")
            body = json.loads(raw, parse_constant=_no_constant)
        except ValueError:
            self.send_response(400)
            self.end_headers()
            return
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(500)
            self.end_headers()
            return
        type(self).received.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_webhook_posts_slack_compatible_json_and_retries_a_failing_endpoint(settings):
    _Hook.received, _Hook.keys, _Hook.fail_first = [], [], 2
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        publish(settings, [ALERT])
        hook = WebhookAlerts(f"http://127.0.0.1:{server.server_port}/hook", backoff_s=0.1)
        run_consumer(settings, hook, "w", lambda _: bool(_Hook.received))
    finally:
        server.shutdown()
    (body,) = _Hook.received
    assert body["text"].startswith("[FIRING] critical nan_loss: run run-7")
    assert body["alert"]["step"] == 42 and body["alert"]["value"] is None  # the NaN loss: null
    assert hook.failed == 0  # two 500s, then delivered
    # every try of one alert carries the same key, so a receiver that got one already drops it
    assert len(_Hook.keys) == 3 and len(set(_Hook.keys)) == 1 and len(_Hook.keys[0]) == 32


def test_an_unreachable_webhook_gives_up_after_give_up_s_and_dead_letters_the_alert(settings):
    publish(settings, [ALERT])
    hook = WebhookAlerts("http://127.0.0.1:9/nothing-listens", backoff_s=0.05, give_up_s=0.5, timeout_s=1)
    stats = run_consumer(settings, hook, "dead", lambda st: st.deadlettered >= 1)
    assert stats.records == 1 and hook.failed == 1 and stats.written == 0
    (dead,) = read_topic(settings, settings.topics.deadletter, 1)
    assert default_codec().decode(dead.value)[1]["rule"] == "nan_loss"  # the alert itself, kept
    assert "delivery failed until it gave up" in dict(dead.headers)["metricbus.reason"].decode()
    assert hook.tries >= 3  # tried again with backoff until give_up_s


def test_the_wandb_sink_with_alerts_raises_each_alert_once_on_the_run_it_holds_open(settings, tmp_path):
    """`metricbus sink wandb --alerts`, a real process: the alerts land in the sink's own run file
    (W&B documents two processes on one run id as giving "unexpected results")."""
    import os
    import subprocess
    import time

    from metricbus.schemas import ALERTS_PRODUCER, Ledger, encode_events, run_started
    from tests.wandb_reader import read_run, records, run_files

    from .conftest import cli

    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    start = [(0, 1_700_000_000_000, "metricbus.RunStarted", run_started("grpo", "g"))]
    producer.send(
        settings.topics.events, key=b"run-7", value=encode_events(default_codec(), "run-7", "p1", start)
    )
    producer.flush()
    producer.close()
    publish(settings, [ALERT, ALERT, {**ALERT, "state": "resolved", "seq": 1}])  # one sent twice
    env = {**os.environ, **settings.to_env(), "WANDB_MODE": "offline"}
    env.pop("WANDB_API_KEY", None)
    with open(tmp_path / "sink.log", "wb") as log:
        proc = subprocess.Popen(
            cli(settings, "sink", "wandb", "--alerts", "--flush-interval", "0.3"),
            stdout=log,
            stderr=log,
            env=env,
        )
    ledger = settings.data_dir / "wandb" / ".metricbus-seqs" / "run-7.json"
    deadline = time.monotonic() + 60
    while not (
        ledger.exists() and [tuple(i) for i in Ledger.read(ledger).get(ALERTS_PRODUCER, [])] == [(0, 1)]
    ):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "sink.log").read_text()
        time.sleep(0.2)
    proc.terminate()
    assert proc.wait(30) == 0
    raised = [
        (r.alert.title, r.alert.text)
        for path in run_files(settings.data_dir / "wandb", "run-7")
        for r in records(path)
        if r.WhichOneof("record_type") == "alert"
    ]
    assert raised == [
        ("nan_loss", "[FIRING] critical nan_loss: run run-7 Train/Loss step 42: loss is NaN"),
        ("nan_loss resolved", "[RESOLVED] critical nan_loss: run run-7 Train/Loss step 42: loss is NaN"),
    ]
    assert read_run(settings.data_dir / "wandb", "run-7", every_opening=True)["projects"] == {"grpo"}


class _Endpoint:
    """A webhook receiver whose behaviour is scripted: ``behave(nth request, seconds since the first)``
    returns "ok", "fail" (a 503) or a number of seconds to hang before answering 200. It keeps
    every request's Idempotency-Key and, like a careful receiver, takes each key's alert once."""

    def __init__(self, behave):
        self.behave, self.requests, self.taken = behave, [], {}
        self.started: float | None = None
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers.get("Idempotency-Key")
                if endpoint.started is None:
                    endpoint.started = time.monotonic()
                how = endpoint.behave(len(endpoint.requests), time.monotonic() - endpoint.started)
                endpoint.requests.append((key, how))
                if how == "fail":
                    self.send_response(503)
                    self.end_headers()
                    return
                if how != "ok":
                    time.sleep(how)
                endpoint.taken.setdefault(key, body["alert"])  # a repeat of a key is dropped
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def _alerts(n, run="run-7"):
    return [{**ALERT, "run_id": run, "seq": i, "step": 40 + i, "rule": f"rule_{i}"} for i in range(n)]


@pytest.mark.parametrize(
    ("scenario", "behave", "timeout_s"),
    [
        ("down for 6 s", lambda n, t: "fail" if t < 6 else "ok", 60.0),
        ("hangs past the client's timeout, then answers", lambda n, t: 3.0 if t < 5 else "ok", 1.0),
        ("slow: 2 s a request, within the timeout", lambda n, t: 2.0, 60.0),
        ("flapping", lambda n, t: "fail" if n % 2 == 0 else "ok", 60.0),
    ],
)
def test_every_alert_reaches_a_webhook_that_fails_hangs_or_flaps_and_repeats_share_a_key(
    settings, scenario, behave, timeout_s
):
    endpoint = _Endpoint(behave)
    sent = _alerts(3)
    try:
        publish(settings, sent)
        hook = WebhookAlerts(endpoint.url, backoff_s=0.2, max_backoff_s=1.0, timeout_s=timeout_s)
        stats = run_consumer(
            settings, hook, f"w-{scenario[:4]}", lambda st: st.written + st.deadlettered >= 3
        )
    finally:
        endpoint.close()
    assert stats.deadlettered == 0 and stats.written == 3 and hook.failed == 0, scenario
    assert sorted(a["seq"] for a in endpoint.taken.values()) == [0, 1, 2]  # each alert, taken once
    keys = [k for k, _ in endpoint.requests]
    assert len(set(keys)) == 3  # every repeat of an alert carried its first try's key
    if scenario != "slow: 2 s a request, within the timeout":
        assert len(keys) > 3  # it was tried again
    else:
        assert len(keys) == 3  # a slow answer is an answer: no repeat


def test_an_alert_resolved_while_the_endpoint_is_down_is_not_retried_past_its_resolution(settings):
    """Alertmanager's rule: a notification is retried until it succeeds or the alert resolves."""
    endpoint = _Endpoint(lambda n, t: "fail" if n < 3 else "ok")  # down for the first tries
    firing = {**ALERT, "seq": 0}
    resolved = {**ALERT, "seq": 1, "state": "resolved", "message": "back within limits"}
    try:
        publish(settings, [firing, resolved])
        hook = WebhookAlerts(endpoint.url, backoff_s=0.2, max_backoff_s=0.5)
        stats = run_consumer(settings, hook, "w-sup", lambda st: st.written >= 1)
    finally:
        endpoint.close()
    assert [a["state"] for a in endpoint.taken.values()] == ["resolved"]
    assert stats.deadlettered == 0 and stats.duplicates == 1  # the firing one: superseded, said


def test_sigterm_ends_the_webhook_consumer_within_10_s_mid_outage_and_the_next_one_delivers(
    settings, tmp_path
):
    """A hanging endpoint: the consumer stops without waiting for it and commits nothing it did
    not deliver; the next consumer delivers the alert, with the same key."""
    import os
    import signal
    import subprocess

    from .conftest import cli

    hang = {"on": True}
    endpoint = _Endpoint(lambda n, t: 30.0 if hang["on"] else "ok")
    env = {**os.environ, **settings.to_env()}
    log = open(tmp_path / "alerts.log", "wb")
    try:
        publish(settings, [ALERT])
        proc = subprocess.Popen(
            cli(settings, "alerts", "--webhook", endpoint.url), stdout=log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 60
        while not endpoint.requests and time.monotonic() < deadline:
            time.sleep(0.2)
        assert endpoint.requests, (tmp_path / "alerts.log").read_text()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert time.monotonic() - t0 < 10
        hang["on"] = False
        hook = WebhookAlerts(endpoint.url, backoff_s=0.2)
        group = settings.groups.alerts("webhook")  # the stopped consumer's group
        stats = run_consumer(settings, hook, group, lambda st: st.written >= 1)
    finally:
        log.close()
        endpoint.close()
    assert stats.written == 1
    keys = {k for k, _ in endpoint.requests}
    assert len(keys) == 1  # the hung try and the delivery: one key, taken once by the receiver
    assert [a["seq"] for a in endpoint.taken.values()] == [0]


def test_an_alert_still_firing_when_its_run_ended_is_delivered_after_an_outage(settings):
    """A run ended with its NaN loss: "ended" is not a resolution. The endpoint, down while both
    were raised, gets the firing alert, then the end (it got only the "ended" one: make chaos)."""
    endpoint = _Endpoint(lambda n, t: "fail" if n < 3 else "ok")
    firing = {**ALERT, "seq": 0}
    ended = {**ALERT, "seq": 1, "state": "ended", "message": "the run ended while firing"}
    try:
        publish(settings, [firing, ended])
        hook = WebhookAlerts(endpoint.url, backoff_s=0.2, max_backoff_s=0.5)
        stats = run_consumer(settings, hook, "w-end", lambda st: st.written >= 2)
    finally:
        endpoint.close()
    assert [a["state"] for a in endpoint.taken.values()] == ["firing", "ended"]
    assert stats.deadlettered == 0 and stats.duplicates == 0
