"""Alert consumers: console (one line per alert), webhook (Slack-compatible JSON, retries), W&B.

Each reads the alerts topic as its own consumer group on the sink runtime and delivers every
alert once (see :class:`AlertRunner`). A slow or failing endpoint only delays its own
consumer: the console, the other webhooks and the pipeline have their own groups. Offsets are
committed after delivery, or after the alert went to the dead-letter topic with the reason,
so nothing is silently lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import sys
import threading
import time
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

from ._loop import ConsumerLoop, Interrupted
from ._run_locks import RunLocks
from ._wandb_file import finish
from ._wandb_run import init_run, raise_on_wandb, run_project, wandb_mode

log = logging.getLogger("metricbus.alerts")

#: delivers one alert: True when delivered, False when given up on (dead-lettered); may raise
#: :class:`Superseded` or :class:`Interrupted` (see :class:`Delivery`)
Handler = Callable[[dict[str, Any], "Delivery"], Awaitable[bool]]


class ConsoleAlerts:
    """Print each alert as one line."""

    name = "console"

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out

    async def __call__(self, alert: dict[str, Any], delivery: Delivery) -> bool:
        """Print the alert's line; always succeeds."""
        print(format_alert(alert), file=self.out, flush=True)
        return True


class Superseded(Exception):  # noqa: N818 - an outcome, not a failure
    """A delivery given up because a later alert of the same rule and series closes it."""


@dataclasses.dataclass
class Delivery:
    """What a handler may ask while it tries to deliver one alert.

    ``stopping``: the consumer is stopping (a handler that waits returns by raising
    :class:`Interrupted`: the alert is not committed and the next consumer delivers it);
    ``superseded``: a later alert of the consumer's slice resolves this one.
    """

    stopping: asyncio.Event
    superseded: bool = False


class WebhookAlerts:
    """POST ``{"text": <the console line>, "alert": {...}}`` (Slack's incoming-webhook shape).

    Each alert is tried until the endpoint takes it (any 2xx), with a backoff doubling from
    ``backoff_s`` to ``max_backoff_s``, for up to ``give_up_s`` (then dead-lettered, with the
    reason), or until a later alert of the same rule and series resolves it (Alertmanager's
    rule: a notification is retried until it succeeds or the alert resolves). Every try carries the
    same ``Idempotency-Key``, so a receiver drops a repeat: a request the client timed out on may
    have arrived. An endpoint answering slower than ``timeout_s`` is tried again, with the same key.
    """

    def __init__(
        self,
        url: str,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        give_up_s: float = 3600.0,
        timeout_s: float = 60.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook URL must start with http:// or https:// (got {url!r})")
        self.url = url
        self.name = "webhook"
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.give_up_s = give_up_s
        self.timeout_s = timeout_s
        self.failed = 0  #: alerts given up on (dead-lettered)
        self.tries = 0  #: POSTs made

    async def __call__(self, alert: dict[str, Any], delivery: Delivery) -> bool:
        """POST the alert until it is taken: True; False past ``give_up_s``.

        Raises :class:`Superseded` when a later alert closes it while the endpoint refuses, and
        :class:`Interrupted` when the consumer stops first (an unanswered POST is left to its
        thread: the next consumer sends it again, with the same key).
        """
        body = strict_json({"text": format_alert(alert), "alert": alert}).encode()  # a NaN loss: null
        key = idempotency_key(alert)
        delay, started = self.backoff_s, time.monotonic()
        while True:
            self.tries += 1
            post = self._posting(body, key)
            stop: asyncio.Future[Any] = asyncio.ensure_future(delivery.stopping.wait())
            await asyncio.wait([post, stop], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not post.done():
                raise Interrupted("the consumer is stopping; the alert is delivered by the next one")
            try:
                post.result()
                return True
            except (urllib.error.URLError, OSError) as exc:
                why = exc
            waited = time.monotonic() - started
            if delivery.superseded:
                raise Superseded(f"webhook {self.url} refused it ({why}); a later alert closes it")
            if waited + delay > self.give_up_s:
                break
            log.warning("webhook %s failed (%s); trying again in %.1fs", self.url, why, delay)
            try:
                await asyncio.wait_for(delivery.stopping.wait(), delay)
                raise Interrupted("the consumer is stopping; the alert is delivered by the next one")
            except TimeoutError:
                pass
            delay = min(delay * 2, self.max_backoff_s)
        self.failed += 1
        log.error(
            "webhook %s: giving up on an alert after %.0fs (give_up_s): %s",
            self.url,
            waited,
            format_alert(alert),
        )
        return False

    def _posting(self, body: bytes, key: str) -> asyncio.Future[None]:
        """One POST in a daemon thread of its own: a consumer that stops does not wait for it.

        asyncio's own threads are joined at exit, which would wait as long as the endpoint hangs.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

        def post() -> None:
            error: BaseException | None = None
            try:
                self._post(body, key)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(settle, error)

        threading.Thread(target=post, name="metricbus-webhook-post", daemon=True).start()
        return done

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

    async def __call__(self, alert: dict[str, Any], delivery: Delivery) -> bool:
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
        #: the runs whose alerts this instance delivers, one instance at a time each
        #: (``_run_locks``): one left out of the group while its ledger is saved slowly must not
        #: have a run's alerts delivered again by their new owner meanwhile
        self.locks = RunLocks(settings.data_dir / "locks" / f"{path_segment(group)}.lock")

    def open(self) -> None:
        """Load what this group already delivered."""
        self.ledger.load()

    def close(self) -> None:
        """Close the handler if it holds anything (W&B runs); let go of the runs."""
        close = getattr(self.handler, "close", None)
        if close is not None:
            close()
        self.locks.release_all()

    def _after_commit(self) -> None:
        """What it delivered is in the saved ledger: another instance may take the runs now."""
        self.locks.release_all()

    def _released(self) -> None:
        """Partitions were revoked, or the handler could take nothing: let go of the runs."""
        self.locks.release_all()

    def pending(self) -> int:
        """1 while delivered alerts are not yet in the saved ledger."""
        return int(self.ledger.dirty)

    def flush(self) -> None:
        """Save the ledger (before the offsets are committed), beside the group's other instances."""
        self.ledger.save_shared()

    async def _assigned(self, assigned: Any) -> None:
        """Partitions came: what the group's other instances delivered of them is in the ledger."""
        self.ledger.load()  # a small file
        await super()._assigned(assigned)

    async def _process(self, records: list[Any]) -> None:
        decoded: list[tuple[Any, dict[str, Any] | None, str]] = []
        for record in records:
            try:
                decoded.append((record, decode_alert(self.codec, record.value), ""))
            except SchemaError as exc:
                decoded.append((record, None, f"{type(exc).__name__}: {exc}"))
        # (run, rule, series) -> its last resolving alert. Only a resolution supersedes a firing
        # alert: "ended" says the run stopped with the condition still true, and an endpoint that
        # was down meanwhile got the NaN loss's "ended" without ever its "firing" (make chaos)
        closing: dict[tuple[str, str, str], int] = {}
        for i, (_, alert, _) in enumerate(decoded):
            if alert is not None and alert["state"] == "resolved":
                closing[(alert["run_id"], alert["rule"], alert["metric"])] = i
        for i, (record, alert, bad) in enumerate(decoded):
            self.stats.records += 1
            if alert is None:
                await self.dead_letters.send(record.value, record.key, bad, record)
                continue
            self.stats.events += 1
            if alert["run_id"] not in self.locks:  # held until the next commit
                self.locks.take(alert["run_id"])  # Unavailable: another instance still holds it
                self.ledger.load()  # what the others delivered of it until they let go
            if not self.ledger.has(alert["run_id"], alert["seq"]):
                key = (alert["run_id"], alert["rule"], alert["metric"])
                delivery = Delivery(self._stopping, superseded=closing.get(key, -1) > i)
                await self._deliver(record, alert, delivery)  # Interrupted: the slice is not taken
            else:
                self.stats.duplicates += 1

    async def _deliver(self, record: Any, alert: dict[str, Any], delivery: Delivery) -> None:
        try:
            delivered = await self.handler(alert, delivery)
            why = "" if delivered else f"{self.name}: delivery failed until it gave up"
        except (Interrupted, asyncio.CancelledError):
            raise
        except Superseded as exc:
            log.warning("%s: %s", self.name, exc)
            self.stats.duplicates += 1
            self.ledger.add(alert["run_id"], alert["seq"])
            return
        except Exception as exc:  # noqa: BLE001 - one alert must not stop the consumer
            delivered, why = False, f"{self.name}: {type(exc).__name__}: {exc}"
        self.ledger.add(alert["run_id"], alert["seq"])
        if delivered:
            self.stats.written += 1
        else:
            await self.dead_letters.send(record.value, record.key, why, record)
