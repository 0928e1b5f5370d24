"""Alert consumers: console (one line per alert), webhook (Slack-compatible JSON, retries), W&B.

Each reads the alerts topic as its own consumer group on the sink runtime and delivers every
alert once (see :class:`AlertRunner`). A slow or failing endpoint only delays its own
consumer: the console, the other webhooks and the pipeline have their own groups. Offsets are
committed after delivery, or after the alert went to the dead-letter topic with the reason,
so nothing is silently lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from metricbus.schemas import (
    Codec,
    Ledger,
    SchemaError,
    Settings,
    decode_alert,
    default_codec,
    format_alert,
    path_segment,
    strict_json,
)

from ._runtime import ConsumerLoop
from ._wandb_file import finish
from ._wandb_run import init_run, raise_on_wandb, run_project, wandb_mode

log = logging.getLogger("metricbus.alerts")

Handler = Callable[[dict[str, Any]], Awaitable[bool]]


class ConsoleAlerts:
    """Print each alert as one line."""

    name = "console"

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out

    async def __call__(self, alert: dict[str, Any]) -> bool:
        """Print the alert's line; always succeeds."""
        print(format_alert(alert), file=self.out, flush=True)
        return True


class WebhookAlerts:
    """POST ``{"text": <the console line>, "alert": {...}}`` (Slack's incoming-webhook shape)."""

    def __init__(self, url: str, retries: int = 5, backoff_s: float = 1.0, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook URL must start with http:// or https:// (got {url!r})")
        self.url = url
        self.name = "webhook"
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.failed = 0

    async def __call__(self, alert: dict[str, Any]) -> bool:
        """POST the alert; retry with backoff; False (logged with the alert) after the last try."""
        body = strict_json({"text": format_alert(alert), "alert": alert}).encode()  # a NaN loss: null
        key = idempotency_key(alert)
        delay = self.backoff_s
        for attempt in range(1, self.retries + 1):
            try:
                await asyncio.to_thread(self._post, body, key)
                return True
            except (urllib.error.URLError, OSError) as exc:
                if attempt == self.retries:
                    break
                log.warning(
                    "webhook %s failed (%s); retry %d/%d in %.1fs",
                    self.url,
                    exc,
                    attempt,
                    self.retries - 1,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
        self.failed += 1
        log.error(
            "webhook %s: giving up on alert after %d attempts: %s",
            self.url,
            self.retries,
            format_alert(alert),
        )
        return False

    def _post(self, body: bytes, key: str) -> None:
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        request = urllib.request.Request(self.url, data=body, headers=headers)  # noqa: S310 - http(s) checked
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - http(s) checked
            response.read()


def idempotency_key(alert: dict[str, Any]) -> str:
    """The same for every delivery of one alert transition (a retry, a restarted consumer).

    Sent as the ``Idempotency-Key`` header of each webhook call, so a receiver drops repeats:
    a slow endpoint may get a request the client already timed out on. Derived alerts key on
    their identity (run, seq); time-driven ones, which have none, on run, rule, state and time.
    """
    if alert.get("seq", -1) >= 0:
        raw = f"{alert['run_id']}/{alert['seq']}"
    else:
        raw = f"{alert['run_id']}/{alert['rule']}/{alert['metric']}/{alert['state']}/{alert['ts_ms']}"
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class WandbAlerts:
    """Raise each firing alert as a W&B alert (``run.alert``) on its run; resolved ones as INFO.

    Online when ``WANDB_API_KEY`` is set (W&B then emails / posts to Slack per the user's W&B
    settings), else recorded in an offline run under ``root``. The run is opened in the project
    the W&B sink writing under ``runs`` opened it in (W&B run ids are per project: without it the
    alert went to a run of the same id in W&B's default project); W&B's default when that sink
    has not seen the run's RunStarted.
    """

    name = "wandb"

    def __init__(self, root: Any, mode: str | None = None, runs: Any = None) -> None:
        self.root = Path(root)
        self.runs = Path(runs) if runs is not None else None
        self.mode = wandb_mode(mode)
        self._runs: dict[str, Any] = {}

    async def __call__(self, alert: dict[str, Any]) -> bool:
        """Send the alert to W&B (in a thread: the W&B client blocks)."""
        return await asyncio.to_thread(self._send, alert)

    def _send(self, alert: dict[str, Any]) -> bool:
        run = self._runs.get(alert["run_id"])
        if run is None:
            project = run_project(self.runs, alert["run_id"]) if self.runs is not None else None
            if project is None:
                log.warning(
                    "run %s: its W&B project is unknown (no RunStarted under %s); "
                    "the alert goes to W&B's default project",
                    alert["run_id"],
                    self.runs,
                )
            run = self._runs[alert["run_id"]] = init_run(self.root, alert["run_id"], self.mode, project)
        raise_on_wandb(run, alert)
        return True

    def close(self) -> None:
        """Finish the W&B runs this consumer opened, each once W&B has written its file."""
        for run in self._runs.values():
            finish(run)
        self._runs.clear()


class AlertRunner(ConsumerLoop):
    """Delivers every alert of the alerts topic to one handler, once, on the sink runtime.

    Alerts with an identity (``seq``, per run) are checked against a ledger of the ones this
    consumer group already handled (``<data dir>/alerts/<group>.json``, saved before each
    commit), so a stream worker that re-sends alerts after a restart does not page twice.
    An undecodable record, a handler that raises and a delivery that failed after its retries
    go to the dead-letter topic with the reason; the consumer goes on.
    """

    def __init__(
        self,
        settings: Settings,
        handler: Handler,
        *,
        group_id: str | None = None,
        flush_interval_s: float = 1.0,
        codec: Codec | None = None,
    ) -> None:
        name = getattr(handler, "name", "handler")
        group = group_id or settings.groups.alerts(name)
        super().__init__(
            settings, [settings.topics.alerts], group, f"alerts-{name}", flush_interval_s=flush_interval_s
        )
        self.handler = handler
        self.codec = codec or default_codec()
        self.ledger = Ledger(settings.data_dir / "alerts" / f"{path_segment(group)}.json")

    def open(self) -> None:
        """Load what this group already delivered."""
        self.ledger.load()

    def close(self) -> None:
        """Close the handler if it holds anything (W&B runs)."""
        close = getattr(self.handler, "close", None)
        if close is not None:
            close()

    def pending(self) -> int:
        """1 while delivered alerts are not yet in the saved ledger."""
        return int(self.ledger.dirty)

    def flush(self) -> None:
        """Save the ledger (before the offsets are committed)."""
        self.ledger.save()

    async def _process(self, records: list[Any]) -> None:
        for record in records:
            self.stats.records += 1
            try:
                alert = decode_alert(self.codec, record.value)
            except SchemaError as exc:
                await self._deadletter(record.value, record.key, f"{type(exc).__name__}: {exc}", record)
                continue
            self.stats.events += 1
            if not self.ledger.add(alert["run_id"], alert["seq"]):
                self.stats.duplicates += 1
                continue
            try:
                delivered = await self.handler(alert)
                why = "" if delivered else f"{self.name}: delivery failed after its retries"
            except Exception as exc:  # noqa: BLE001 - one alert must not stop the consumer
                delivered, why = False, f"{self.name}: {type(exc).__name__}: {exc}"
            if delivered:
                self.stats.written += 1
            else:
                await self._deadletter(record.value, record.key, why, record)
