import asyncio
import http.server
import io
import json
import threading

import pytest
from kafka import KafkaProducer

from schemas import client_options, default_codec
from sinks.alerts import ConsoleAlerts, WebhookAlerts, consume_alerts

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
}


def publish(settings, alerts):
    producer = KafkaProducer(**client_options(settings), enable_idempotence=False)
    for a in alerts:
        producer.send(
            settings.topics.alerts, key=a["run_id"].encode(), value=default_codec().encode("Alert", a)
        )
    producer.flush()
    producer.close()


def run_consumer(settings, handler, group, until):
    async def main():
        stop = asyncio.Event()

        async def watch():
            while not until():
                await asyncio.sleep(0.1)
            stop.set()

        watcher = asyncio.create_task(watch())
        n = await asyncio.wait_for(consume_alerts(settings, handler, group, stop), timeout=60)
        await watcher
        return n

    return asyncio.run(main())


def test_console_prints_one_clear_line_per_alert(settings):
    publish(settings, [ALERT, {**ALERT, "state": "resolved", "step": 50, "message": "back within limits"}])
    out = io.StringIO()
    n = run_consumer(settings, ConsoleAlerts(out), "c", lambda: out.getvalue().count("\n") >= 2)
    lines = out.getvalue().splitlines()
    assert n == 2
    assert lines[0] == "[FIRING] critical nan_loss: run run-7 Train/Loss step 42: loss is NaN"
    assert lines[1].startswith("[RESOLVED]")


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list = []
    fail_first = 0

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
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
    _Hook.received, _Hook.fail_first = [], 2
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        publish(settings, [ALERT])
        hook = WebhookAlerts(f"http://127.0.0.1:{server.server_port}/hook", backoff_s=0.1)
        run_consumer(settings, hook, "w", lambda: bool(_Hook.received))
    finally:
        server.shutdown()
    (body,) = _Hook.received
    assert body["text"].startswith("[FIRING] critical nan_loss: run run-7")
    assert body["alert"]["step"] == 42
    assert hook.failed == 0  # two 500s, then delivered


def test_an_unreachable_webhook_gives_up_after_its_retries_without_blocking_forever(settings):
    publish(settings, [ALERT])
    hook = WebhookAlerts("http://127.0.0.1:9/nothing-listens", retries=3, backoff_s=0.05, timeout_s=1)
    n = run_consumer(settings, hook, "dead", lambda: hook.failed >= 1)
    assert n == 1 and hook.failed == 1
