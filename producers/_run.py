"""``Run``: what a training loop holds.

log() costs about a microsecond and never raises for broker trouble; finish() flushes within
its timeout and leaves the rest in the spool.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import socket
import time
import uuid
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from metricbus.schemas import (
    CONFIG_UPDATE,
    HEARTBEAT,
    HISTOGRAM,
    MEDIA,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    ConfigError,
    MediaStore,
    MetricValueError,
    Settings,
    check_run_id,
    config_update,
    default_codec,
    histogram,
    merge_config,
    run_started,
)

from ._guard import CallGuard
from ._identity import RunConfig, cell, config_dict, git_commit, new_run_id, shared_run_id
from ._media import MediaWriter, copy_for_later, size_of
from ._prepare import PLAIN, Prepare, avro_long
from ._publisher import Publisher
from ._spool import SUFFIX, Spool
from ._system import SystemSampler
from ._transport import KafkaTransport, OfflineTransport, Transport
from ._values import ValueGate, _flatten
from ._where import describe_target, say_where

log = logging.getLogger("metricbus.producer")
SDK_VERSION = "0.1.0"
_time_ns = time.time_ns  # log()'s clock, one lookup fewer a call
#: Largest list (not array) log_histogram walks; arrays and tensors are binned whole by numpy.
MAX_HISTOGRAM_VALUES = 10_000_000


#: How long ``init`` waits for the sender's first connect (a broker that answers takes ~0.1 s)
CONNECT_WAIT_S = 2.0


class Run:
    """One training run publishing to metricbus. Create it with ``metricbus.init()``.

    ``max_queue`` bounds the events held in memory; past it (the loop outruns encoding),
    ``log()`` waits up to ``max_block_s`` (default 0) for room, then drops the event, counted
    in ``stats()["dropped_events"]`` and said once. ``linger_s`` is how long the publisher
    batches: queued events reach the spool within it, whatever the network does.

    Thread-safety: ``log`` may be called from any thread; events of one thread keep their
    order. Failure: broker faults never raise here; a value that cannot be a scalar is
    dropped with one warning per metric name (``strict=True`` raises MetricValueError).
    """

    def __init__(
        self,
        project: str,
        name: str | None = None,
        config: Any = None,
        tags: Iterable[str] = (),
        run_id: str | None = None,
        *,
        settings: Settings | None = None,
        strict: bool = False,
        system_metrics: bool = True,
        system_interval_s: float = 10.0,
        rank: int | None = None,
        world_size: int | None = None,
        max_queue: int = 100_000,
        linger_s: float = 0.03,
        max_block_s: float = 0.0,
        transport: Transport | None = None,
    ) -> None:
        if not isinstance(project, str) or not project.strip():
            raise ConfigError(f"project must be a non-empty string (got {project!r})")
        stack = None
        if settings is None:
            settings, stack = Settings.resolve()
        self.settings = settings
        self.run_id = check_run_id(run_id) if run_id is not None else shared_run_id() or new_run_id()
        self.project = project
        self.name = name or self.run_id
        self.producer_id = uuid.uuid4().hex
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        self.strict = strict
        self._gate = ValueGate(strict=strict)
        self._step = 0
        #: what a call may not do: raise into the loop (skipped instead), act after finish()
        self._guard = CallGuard(self.run_id, strict)
        self.status: str | None = None
        if transport is None:
            transport = OfflineTransport() if self.settings.offline else KafkaTransport(self.settings)
        self.spool_path = self.settings.spool_dir / self.run_id / f"{self.producer_id}{SUFFIX}"
        self._publisher = Publisher(
            run_id=self.run_id,
            producer_id=self.producer_id,
            spool=Spool(self.spool_path),
            transport=transport,
            codec=default_codec(),
            sdk_version=SDK_VERSION,
            prepare=Prepare(self._gate, self.rank, self._guard),
            describe_target=functools.partial(describe_target, self.settings),
            max_queue=max_queue,
            linger_s=linger_s,
            max_block_s=max_block_s,
            signer=settings.signer,
        )
        self._split = self._gate.split
        self._fast = not strict  # strict: every value checked in the caller, to raise there
        self._quick = self._fast  # log()'s quick path: not strict, not finished
        self._queue = self._publisher.queue
        self._max_items = self._publisher.max_items
        self._watchers: list[Any] = []
        self._media: MediaWriter | None = None  # made at the first media item
        if self.rank == 0:  # one line on stderr: the run and where its events go (W&B's "View run at")
            run = f"run {self.name!r} ({self.run_id})" if self.name != self.run_id else f"run {self.run_id}"
            if say_where(run, self.run_id, settings, self.spool_path.parent, stack, transport):
                self._publisher.sender.said_unreachable = True  # said: the publisher does not say it again
        self._publisher.start()  # after the line above: it may say the broker is unreachable itself
        if not self.settings.offline:  # connected before the loop runs (an overload starved it)
            self._publisher.sender.connected.wait(CONNECT_WAIT_S)
        #: the run's config: what it started with (RunStarted's), and keys set since with
        #: ``run.config.update(...)`` / ``run.config[key] = ...`` (each a ConfigUpdate event)
        self.config = RunConfig(config_dict(config), self.update_config)
        started = run_started(
            project,
            self.name,
            dict(self.config),
            tags=tags,
            host=socket.gethostname(),
            pid=os.getpid(),
            git=git_commit(Path.cwd()),
            rank=self.rank,
            world_size=self.world_size,
        )
        self._publisher.submit(RUN_STARTED, started)
        self._sampler: SystemSampler | None = None
        if system_metrics:
            self._sampler = SystemSampler(system_interval_s, self._sampled)
            self._sampler.start()
        ref = weakref.ref(self)
        self._atexit = lambda: (r := ref()) is not None and r.finish(timeout=5.0)
        atexit.register(self._atexit)

    # -- logging ------------------------------------------------------------------------

    def log(
        self,
        data: Mapping[str, Any],
        step: int | None = None,
        epoch: int | None = None,
        labels: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue scalars (and per-sample arrays) at ``step`` (default: the last step + 1).

        ``labels`` say what the values measure (``{"task": "logo_a"}``): the stream derives
        ``by_<key>/<value>/<metric>_recent_mean`` from them (see :meth:`log_episode`).
        Non-blocking: this only enqueues; a background thread encodes and publishes.
        """
        try:
            if self._quick and (step is None or type(step) is int) and (epoch is None or type(epoch) is int):
                # the common case (not strict, not finished): when sum(values, 0.0) is a float,
                # every value is a Python int, float or bool (a list or a string makes sum raise,
                # a numpy number or a tensor makes the sum one, an int past float's range
                # overflows), none of which can change after the call: so the names are checked,
                # the ints converted and the step and epoch range-checked on the publisher's
                # thread (Run._bodies), and the caller pays one C loop. (An object whose __radd__
                # returns a float passes too: converted with float() there, or dropped and
                # counted.)
                try:
                    plain = type(sum(data.values(), 0.0)) is float and data
                except Exception:  # noqa: BLE001 - a list, a string, ...: the careful path
                    plain = False
                if plain:
                    if step is None:
                        step = self._step
                    self._step = step + 1
                    queue = self._queue
                    if len(queue) >= self._max_items and not self._publisher.room():
                        return  # shed (counted, said once): the loop outruns encoding
                    tags = self._gate.labels(labels) if labels else None
                    queue.extend(((_time_ns(), PLAIN, step, epoch, tags), dict(data)))
                    return
            self._log_checked(data, step, epoch, labels)
        except MetricValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - the training loop must never see our faults
            self._guard.skipped("log", exc)

    def _log_checked(
        self, data: Mapping[str, Any], step: Any, epoch: Any, labels: Mapping[str, Any] | None
    ) -> None:
        """log()'s careful path: arrays, tensors, numpy numbers, odd values and steps, strict mode.

        Every value is checked (and converted) here, on the caller's thread: a tensor or an array
        may change after the call. Strict mode raises MetricValueError here.
        """
        if self._guard.ignored("log"):
            return
        scalars, samples = self._split(data)
        if not (scalars or samples):
            return
        step = self._step if step is None else avro_long(step, "step")
        if epoch is not None:
            epoch = avro_long(epoch, "epoch")
        self._step = step + 1
        if len(self._queue) >= self._max_items and not self._publisher.room():
            return  # shed (counted, said once): the loop outruns encoding
        body = {
            "step": step,
            "epoch": epoch,
            "rank": self.rank,
            "scalars": scalars,
            "samples": samples,
            "labels": self._gate.labels(labels) if labels else {},
        }
        self._queue.extend(((_time_ns() // 1_000_000, METRICS, None, None, None), body))

    def log_episode(
        self,
        reward: float,
        *,
        length: int | None = None,
        success: bool | None = None,
        reason: str | None = None,
        labels: Mapping[str, Any] | None = None,
        step: int | None = None,
        epoch: int | None = None,
        **values: Any,
    ) -> None:
        """One finished episode: its reward, and what the diagnostics break results down by.

        Logs ``episode/reward``, ``episode/length``, ``episode/success`` (1 or 0) and each of
        ``values`` as ``episode/<name>``, labelled with ``labels`` (the episode's task,
        environment, difficulty: seed 001's "logo type") and ``termination=reason``. The stream
        derives ``by_<key>/<value>/episode/reward_recent_mean``, the success rate per label
        (``.../episode/success_recent_mean``) and each value's share (``by_<key>/<value>/share``).
        ``step`` defaults to the run's current step (an episode does not advance it).
        """
        try:
            data: dict[str, Any] = {"episode/reward": reward}
            if length is not None:
                data["episode/length"] = length
            if success is not None:
                data["episode/success"] = 1.0 if success else 0.0
            for name, value in values.items():
                data[f"episode/{name}"] = value
            tags = dict(labels or {})
            if reason is not None:
                tags["termination"] = reason
            self.log(data, step=max(self._step - 1, 0) if step is None else step, epoch=epoch, labels=tags)
        except MetricValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - the training loop must never see our faults
            self._guard.skipped("log_episode", exc)

    def log_histogram(
        self,
        name: str,
        values: Any = None,
        *,
        bins: int = 64,
        edges: Sequence[float] | None = None,
        counts: Sequence[int] | None = None,
        step: int | None = None,
    ) -> None:
        """Log a histogram, from raw ``values`` (binned here with numpy) or ready ``edges``/``counts``.

        Of raw values the finite ones are binned (:func:`schemas.histogram`: a NaN or inf has no
        bin; any NaN made numpy refuse the whole call).
        """
        try:
            if self._guard.ignored("log_histogram"):
                return
            if values is not None:
                if hasattr(values, "detach"):  # torch: no autograd, on the host
                    values = values.detach().cpu().numpy()
                flat = values if hasattr(values, "shape") else _flatten(values, MAX_HISTOGRAM_VALUES)
                counts, edges = histogram(flat, bins)
            if edges is None or counts is None or len(edges) != len(counts) + 1:
                raise ConfigError(
                    f"histogram {name!r} needs values, or edges with exactly len(counts) + 1 items"
                )
            body = {
                "step": self._step - 1 if step is None else int(step),
                "name": name,
                "edges": [float(e) for e in edges],
                "counts": [int(c) for c in counts],
                "rank": self.rank,
            }
            self._publisher.submit(HISTOGRAM, body)
        except Exception as exc:  # noqa: BLE001
            self._guard.skipped("log_histogram", exc)

    def log_table(
        self, name: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], step: int | None = None
    ) -> None:
        """Log a table (e.g. seed 002's rubric_criteria_summary): cells are None, bool, int, float or str."""
        try:
            if self._guard.ignored("log_table"):
                return
            cols = [str(c) for c in columns]
            table_rows = [[cell(v) for v in row] for row in rows]
            bad = [i for i, row in enumerate(table_rows) if len(row) != len(cols)]
            if bad:
                raise ConfigError(f"table {name!r}: rows {bad[:5]} do not have {len(cols)} cells")
            step_ = max(self._step - 1, 0) if step is None else int(step)
            self._publisher.submit(TABLE, {"step": step_, "name": name, "columns": cols, "rows": table_rows})
        except Exception as exc:  # noqa: BLE001
            self._guard.skipped("log_table", exc)

    def log_image(
        self, name: str, image: Any, *, step: int | None = None, caption: str | None = None
    ) -> None:
        """Log an image: an array, a torch tensor, a PIL image, a matplotlib figure or a file's path.

        Arrays are HxW, HxWxC or CxHxW, uint8 or floats in [0, 1]. The caller pays a copy; the
        PNG encoding and the write to the media store (by content, under the data directory)
        happen on the run's media thread, and the Media event follows.
        """
        self._media_item("image", name, image, step, caption)

    def log_video(
        self, name: str, frames: Any, *, fps: float = 4, step: int | None = None, caption: str | None = None
    ) -> None:
        """Log a video: frames TxHxWxC or TxCxHxW (TensorBoard's NxTxCxHxW: its first), or a GIF's path.

        Kept as an animated GIF (what TensorBoard's image dashboard and W&B play).
        """
        self._media_item("video", name, frames, step, caption, float(fps))

    def log_audio(
        self,
        name: str,
        samples: Any,
        *,
        rate: int = 44100,
        step: int | None = None,
        caption: str | None = None,
    ) -> None:
        """Log audio: samples L, LxC or CxL (floats in [-1, 1], or int16) at ``rate`` a second.

        Or a WAV file's path.
        """
        self._media_item("audio", name, samples, step, caption, float(rate))

    def log_text(self, name: str, text: str, *, step: int | None = None, caption: str | None = None) -> None:
        """Log a text sample (a sampled completion, a prompt): kept as UTF-8 in the media store."""
        self._media_item("text", name, text, step, caption)

    def _media_item(
        self, kind: str, name: str, data: Any, step: int | None, caption: str | None, rate: float = 0.0
    ) -> None:
        try:
            if self._guard.ignored(f"log_{kind}"):
                return
            if not isinstance(name, str) or not name or len(name) > 256:
                raise ConfigError(f"log_{kind}: a name is a string of 1-256 characters (got {name!r:.80})")
            media = self._media
            if media is None:
                store = MediaStore.of(self.settings)
                emit = functools.partial(self._publisher.submit, MEDIA)
                media = self._media = MediaWriter(store, emit, self._guard.item_failed)
            fields = {
                "step": max(self._step - 1, 0) if step is None else avro_long(step, "step"),
                "name": name,
                "rank": self.rank,
                "kind": kind,
                "caption": None if caption is None else str(caption)[:1000],
            }
            if not media.has_room(name, size_of(data)):  # shed before the copy, not after
                return
            copy, nbytes = copy_for_later(kind, data)
            media.submit(fields, copy, nbytes, rate)
        except Exception as exc:  # noqa: BLE001 - the training loop must never see our faults
            self._guard.skipped(f"log_{kind}", exc)

    def watch(
        self,
        model: Any,
        log: str = "gradients",
        every: int = 100,
        optimizer: Any = None,
        step: Any = None,
    ) -> Any:
        """Log a PyTorch model's gradient norms (total, per layer), histograms and learning rates.

        ``log``: "gradients" (gradient histograms), "parameters" (parameter histograms) or "all";
        norms are always logged. Every ``every``-th backward pass; ``step`` (a callable) gives the
        step, else the run's last one. Returns the watcher (``.remove()`` takes its hooks off);
        None if it cannot watch (said once). See :mod:`producers._watch`.
        """
        try:
            from ._watch import Watcher

            watcher = Watcher(self, model, log, every=every, optimizer=optimizer, step=step)
            self._watchers.append(watcher)
            return watcher
        except Exception as exc:  # noqa: BLE001 - the training loop must never see our faults
            self._guard.skipped("watch", exc)
            return None

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait up to ``timeout`` s until everything logged so far is acknowledged; True if it was.

        What is not acknowledged by then stays in the spool and is sent later; never raises.
        """
        try:
            if self._media is not None:
                self._media.drain(timeout)
            return bool(self._publisher.flush(timeout))
        except Exception as exc:  # noqa: BLE001 - the training loop must never see our faults
            self._guard.skipped("flush", exc)
            return False

    # -- ending -------------------------------------------------------------------------

    def finish(
        self,
        status: str = "finished",
        summary: Mapping[str, Any] | None = None,
        timeout: float = 10.0,
    ) -> bool:
        """End the run: publish RunFinished and flush for at most ``timeout`` seconds.

        Returns True when every event was acknowledged by Kafka. Otherwise the rest is in
        the spool (fsynced) and ``metricbus sync`` publishes it later. Idempotent.
        """
        if self._guard.finished:
            return self.status is not None and self._publisher.backlog == 0
        if self._sampler is not None:
            self._sampler.stop()
        for watcher in self._watchers:
            watcher.remove()
        started = time.monotonic()
        if self._media is not None:  # its items' events come before RunFinished
            self._media.stop(timeout)
        left = max(0.0, timeout - (time.monotonic() - started))  # one timeout for the whole finish
        if not isinstance(status, str):  # finish(60) meant the timeout: the run is not lost for it
            log.warning("finish(status=%r): a status is a string; the run is ended as 'finished'", status)
            status = "finished"
        scalars, _ = self._gate.split(summary or {})
        self._publisher.submit(RUN_FINISHED, {"status": status, "summary": scalars})
        self._quick, self._guard.finished = False, True
        self.status = status
        atexit.unregister(self._atexit)
        clean = self._publisher.stop(0.0 if self.settings.offline else left)  # offline: nothing to wait for
        if self.settings.offline:
            log.info(
                "run %s (offline mode): its events are in %s; publish them with `metricbus sync`",
                self.run_id,
                self.spool_path.parent,
            )
        elif not clean:
            why = (
                "nothing answers there"
                if getattr(self._publisher.transport, "refused", False)
                else f"not within {timeout:.1f}s"
            )
            log.warning(
                "run %s: not every event reached %s (%s); they wait in %s: the next `metricbus up` "
                "on this data dir publishes them (or `metricbus sync`)",
                self.run_id,
                describe_target(self.settings),
                why,
                self.spool_path.parent,
            )
        return clean

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(status="failed" if exc_type is not None else "finished")

    def __del__(self) -> None:
        guard = getattr(self, "_guard", None)  # None: __init__ raised before it was made
        if guard is not None and not guard.finished:
            warnings.warn(
                f"metricbus run {self.run_id} was never finished; call run.finish() or use "
                "`with metricbus.init(...)`",
                ResourceWarning,
                stacklevel=1,
            )

    def stats(self) -> dict[str, int]:
        """Counters: events logged, dropped values, full-queue events (overflows, dropped), ..."""
        p = self._publisher
        return {
            "events": p.events_submitted,
            "dropped_values": self._gate.dropped,
            "overflows": p.overflows,
            "dropped_events": p.dropped_events,
            "skipped_calls": self._guard.count,
            "records_sent": p.sender.records_sent,
            "lost_events": p.lost_events,
            "unsent_bytes": p.spool.unsent_bytes,
            "media_logged": self._media.logged if self._media else 0,
            "media_dropped": self._media.dropped if self._media else 0,
            "media_refused": self._media.refused if self._media else 0,
        }

    # -- internals ----------------------------------------------------------------------

    def update_config(self, changes: Mapping[str, Any]) -> None:
        """Set config keys after the start: merged into ``run.config`` and sent as a ConfigUpdate.

        Every sink applies it to the run's config (nested mappings merge key by key); values
        that are not JSON are sent as their ``str``. Never raises into the loop.
        """
        try:
            if self._guard.ignored("config.update"):
                return
            changes = {str(k): v for k, v in dict(changes).items()}
            if not changes:
                return
            body = config_update(changes, self._step - 1 if self._step else None)
            dict.update(self.config, merge_config(dict(self.config), changes))
            self._publisher.submit(CONFIG_UPDATE, body)
        except Exception as exc:  # noqa: BLE001 - the training loop must never see our faults
            self._guard.skipped("config.update", exc)

    def _sampled(self, sample: dict[str, float]) -> None:
        """The system sampler's tick: its System/* metrics, and a heartbeat with the last step."""
        if not self._guard.finished:
            step = max(self._step - 1, 0)
            body = {"step": step, "epoch": None, "rank": self.rank, "scalars": sample, "samples": {}}
            self._publisher.submit(METRICS, body)
            self._publisher.submit(HEARTBEAT, {"last_step": self._step - 1 if self._step else None})
