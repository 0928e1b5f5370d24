"""The Weights & Biases sink: one W&B run per metricbus run, with its id, so it can resume.

Step mapping: W&B drops a ``step=`` that goes backwards, so history rows are logged without
``step=`` (W&B's own ``_step`` just counts rows) and carry ``metricbus/step`` (and
``metricbus/epoch``); every metric is defined with ``step_metric="metricbus/step"``, so
charts use the training step and a non-monotonic step never loses data.

Online when ``WANDB_API_KEY`` is set, offline (a local run directory, ``wandb sync``-able)
otherwise. ``include`` / ``exclude`` are globs over metric names. The sink runs in its own
process and consumer group, so a slow or unreachable W&B never stalls another sink or the
pipeline. Per-sample arrays and Histogram events become ``wandb.Histogram`` (of the finite
values: W&B refuses NaN and inf there; the scalars keep them); Table events ``wandb.Table``;
RunFinished's summary and the run status go to the run summary and exit code. An event W&B
refuses anyway is returned to the runtime (dead-lettered with the reason); the sink goes on.
With ``metricbus sink wandb --alerts`` the runtime also hands it the alerts topic's alerts (kind
ALERT), raised with ``run.alert`` on the run this process holds open, each once (the ledger).

Run lifecycle: a W&B run is finished once the metricbus run has finished *and* the stream
worker said its derived series are complete (the last epoch's ``Epoch/*`` and ``final/*``
arrive after RunFinished, on another topic), or ``finish_grace_s`` after RunFinished when no
worker says so. Both are kept beside the output, so an instance that opens the run again for a
point that came late (after a rebalance or a restart, when it is not handed that RunFinished
again: it is held already) closes it too. Every (re)opening uses the project, name, config
and tags of the run's RunStarted, kept beside the output, so a late point or a restarted sink
never opens a run in another project. Offline, each opening is one run directory (``wandb
sync`` them in order).

Exactly once after a crash: every history row carries its event's identity (``_metricbus_id``,
``<producer_id>/<seq>``; W&B hides keys that start with ``_`` from the default charts), and a
restarted sink reads the run's own W&B file(s) back to learn which rows W&B really wrote. So
a row W&B wrote is never logged twice, and one it had not written when the process died is
logged again: the run file is the ledger. Events that make no row (RunStarted, RunFinished,
filtered-out metrics) are recorded in a small ledger beside the run at each flush.

Only what W&B's file holds is committed: W&B writes its file a 32 KiB block at a time, on its
own, so each flush reads the new blocks of every run with rows not seen there yet, and the
runtime commits no record past a row W&B has not written (``confirmed``). The rows of the
block W&B is filling wait for it (or for the run's closing). A W&B that stopped writing a run's
file (it gives up on a file for good at its first ENOSPC) is found there: rows not in the file
though far more than a block of rows came after them, with the file still for
``STALLED_AFTER_S``; the run is then closed and opened again (a new file) and those rows logged
again, the flush failing (so retried with backoff, nothing committed) while W&B cannot open it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from metricbus.schemas import (
    ALERT,
    CONFIG_UPDATE,
    HISTOGRAM,
    MEDIA,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    UNKNOWN_PROJECT,
    Event,
    Interval,
    Ledger,
    MediaMissing,
    MediaStore,
    atomic_write,
    check_run_id,
    checked_media_type,
    config_object,
    histogram,
    histogram_bins,
)

from ._protocol import MetricFilter, Sink, Unavailable
from ._wandb_file import BLOCK, finish, logged_ids, logged_ids_from, run_files
from ._wandb_run import (
    EPOCH,
    ID_KEY,
    RUNS_DIR,
    STEP,
    init_run,
    keep_ending,
    kept_ending,
    raise_on_wandb,
    wandb_key,
    wandb_mode,
    wandb_project,
    wandb_tags,
)

log = logging.getLogger("metricbus.sink.wandb")
#: where a Media event's bytes are put, named as W&B wants, for W&B to copy into the run's files
STAGED_DIR = ".metricbus-media"
SEQS_DIR = ".metricbus-seqs"
#: A run file that has not grown for this long while more than two blocks of rows wait to be
#: seen in it: W&B has stopped writing it.
STALLED_AFTER_S = 10.0
#: Rows handed to W&B and not seen in its files past which a flush fails (retried with backoff,
#: nothing more consumed): each is held in memory until W&B has written it.
MAX_WAITING_ROWS = 200_000


@dataclasses.dataclass
class _Waiting:
    """A run's rows handed to W&B and not seen in its file yet."""

    path: Path  #: the run file they were handed to
    since: float  #: when the file last grew (or the first of them was handed)
    start: int = 0  #: the block offset to read the file from next
    size: int = -1  #: the file's size when last read
    #: identity -> (the event's place among those handed, the row, a lower bound of its size)
    rows: dict[str, tuple[int, dict[str, Any], int]] = dataclasses.field(default_factory=dict)
    bytes: int = 0  #: the rows' sizes' lower bounds, summed

    def add(self, ident: str, n: int, row: dict[str, Any]) -> None:
        size = len(ident) + 16 * len(row)
        self.rows[ident] = (n, row, size)
        self.bytes += size

    def seen(self, ident: str) -> None:
        row = self.rows.pop(ident, None)
        if row is not None:
            self.bytes -= row[2]


class WandbSink(Sink):
    """The ``wandb`` sink (see the module docstring for its guarantees)."""

    name = "wandb"

    def __init__(
        self,
        root: Path,
        include: Sequence[str] = ("*",),
        exclude: Sequence[str] = (),
        mode: str | None = None,
        finish_grace_s: float = 300.0,
        idle_close_s: float = 600.0,
        media: MediaStore | None = None,
    ) -> None:
        self.root = Path(root)
        #: where Media events' bytes are read (verified); without it they are returned, with why
        self.media = media
        self._staged_files: list[Path] = []  # media put beside the runs during one write()
        self._wanted = MetricFilter(include, exclude)
        self.mode = wandb_mode(mode)
        self.finish_grace_s = finish_grace_s
        #: a run nothing was written to for this long is closed at a flush, and reopened on its
        #: next event: a run killed without its RunFinished stayed open for ever (each open run
        #: held a descriptor here and three in wandb-core, and ~0.3 MB)
        self.idle_close_s = idle_close_s
        self._runs: dict[str, Any] = {}
        self._written: dict[str, float] = {}  # open run -> when a row was last written to it
        self._ledgers: dict[str, Ledger] = {}
        self._finished: dict[str, tuple[float, int]] = {}  # run -> (when RunFinished came, exit code)
        self._complete: set[str] = set()  # runs whose derived series are all in
        self._pending = 0
        self._handed = 0  # events passed to write() so far
        self._waiting: dict[str, _Waiting] = {}  # run -> its rows not seen in W&B's file yet

    def open(self) -> None:
        """Create the root directory and import wandb (fails with the pip line if missing).

        A ``WANDB_SERVICE`` inherited from whatever started this process is dropped: with it,
        wandb joins that process's wandb-core, which outlives this one, so a sink killed and
        started again found its runs still open there ("run ID ... is in use"). This process's
        own wandb-core ends with it.
        """
        os.environ.pop("WANDB_SERVICE", None)
        # wandb's own debug log is a file beside its runs: on a full disk each of its lines
        # printed a traceback here ("--- Logging error ---"); this process's own log is a stream
        logging.raiseExceptions = False
        self.root.mkdir(parents=True, exist_ok=True)
        for left in (self.root / STAGED_DIR).glob("*"):  # staged by a process that died mid-write
            left.unlink(missing_ok=True)
        import wandb  # noqa: F401

    def recover(self, run_id: str) -> Mapping[str, Sequence[Interval]]:
        """Identities the run already holds: rows in its W&B file(s), and the ledger of the rest.

        A run file is read once: its rows' identities go into the ledger with the size it had
        (``files``), and a later recover reads only files that are new or have grown since (a
        run reopened after each restart of this sink has a file per opening, and a long run's
        file holds millions of rows).
        """
        ledger = self._ledger(run_id)
        for path in run_files(self.root, run_id):
            name, size = f"{path.parent.name}/{path.name}", path.stat().st_size
            if ledger.files.get(name) == size:
                continue
            for ident in logged_ids(path, ID_KEY):
                producer, _, seq = str(ident).rpartition("/")
                if producer and seq.isdigit():
                    ledger.add(producer, int(seq))
            ledger.files[name] = size
            ledger.dirty = True
        ledger.save()
        return ledger.intervals()

    def write(self, events: Sequence[Event]) -> list[tuple[Event, str]]:
        """Log events to their W&B runs (W&B queues them to its own service process).

        Returns the events W&B refused, with the reason.
        """
        for e in events:  # first: a derived point of this batch may come before its RunStarted
            if e.kind == RUN_STARTED:
                self._remember(e.run_id, e.body)
        rejected = []
        try:
            for e in events:
                self._handed += 1
                try:
                    row = self._write(e)
                except (ValueError, TypeError, KeyError, OverflowError, MediaMissing) as exc:
                    why = f"wandb cannot take this {e.kind} event: {type(exc).__name__}: {exc}"
                    rejected.append((e, why))
                    continue
                if not row:  # a row carries its identity into W&B's own file; the rest is ledgered
                    self._ledger(e.run_id).add(e.producer_id, e.seq)
                self._pending += 1
        finally:
            for staged in self._staged_files:  # W&B copied each into its run's files
                staged.unlink(missing_ok=True)
            self._staged_files.clear()
        return rejected

    def confirmed(self) -> tuple[int, int]:
        """(events handed, how many of the first of them W&B's files hold or the ledgers keep)."""
        first = [next(iter(w.rows.values()))[0] - 1 for w in self._waiting.values() if w.rows]
        return self._handed, min(first, default=self._handed)

    def close_run(self, run_id: str) -> None:
        """Finish the W&B run (its file then holds every row handed to it)."""
        if run_id in self._runs:
            self._finish(run_id)

    def derived_complete(self, run_id: str) -> None:
        """The worker published the run's last derived event: finish it if it has finished."""
        self._complete.add(run_id)
        _keep_ending(self.root, run_id, complete=True)
        if run_id in self._finished:
            self._finish(run_id)

    def pending(self) -> int:
        """Events handed to W&B since the last flush, and rows not seen in its files yet."""
        return self._pending + sum(len(w.rows) for w in self._waiting.values())

    def flush(self) -> None:
        """Record the identities that make no row; see which rows W&B's files hold now.

        W&B itself has no flush: rows it holds are found in its files (``confirmed``); a run
        whose file W&B stopped writing is opened again and its missing rows logged again,
        raising while W&B cannot open it. Then keep in memory only the ledgers of open runs
        (read again when needed). A ledger the disk refuses fails the flush, after W&B's files
        were looked at (a full disk is what stops W&B writing them).
        """
        unsaved: OSError | None = None
        for ledger in self._ledgers.values():
            try:
                ledger.save()
            except OSError as exc:  # a full disk: what W&B's files hold is still looked at below
                unsaved = unsaved or exc
        if unsaved is None:
            for run_id in [r for r in self._ledgers if r not in self._runs]:
                del self._ledgers[run_id]
        now = time.monotonic()
        for run_id in [r for r in self._finished if r in self._runs and r in self._complete]:
            self._finish(run_id)  # opened again for a late point: its file then holds it
        for run_id, (since, _) in list(self._finished.items()):
            if run_id in self._runs and now - since >= self.finish_grace_s:
                log.info(
                    "run %s: no word from the stream worker %.0fs after it finished; closing",
                    run_id,
                    now - since,
                )
                self._finish(run_id)
        for run_id, at in list(self._written.items()):
            if now - at >= self.idle_close_s:
                log.info("run %s: nothing written for %.0fs; closing until its next event", run_id, now - at)
                self._finish(run_id)
        if unsaved is None:
            self._pending = 0  # else the flush is tried again, its ledgers with it
        for run_id in list(self._waiting):
            self._see(run_id)
        if unsaved is not None:
            raise unsaved  # the flush failed: nothing is committed
        waiting = sum(len(w.rows) for w in self._waiting.values())
        if waiting > MAX_WAITING_ROWS:  # a W&B that takes rows and writes none: stop taking more
            raise RuntimeError(f"W&B has not written {waiting} rows handed to it; waiting for it")

    def release(self) -> None:
        """A rebalance: finish the W&B runs this instance has open and drop its ledgers.

        Another instance may resume a run next (W&B resumes by id); this one reloads what it
        needs on a run's next event. Rows not seen in W&B's files were not committed past:
        they are delivered again to whoever reads their partition next.
        """
        self.close()
        self._waiting.clear()
        self._ledgers.clear()
        self._finished.clear()
        self._complete.clear()

    def close(self) -> None:
        """Finish the runs still open (their W&B status stays running until RunFinished)."""
        for ledger in self._ledgers.values():
            ledger.save()
        for run_id in list(self._runs):
            self._finish(run_id)

    # -- internals ------------------------------------------------------------------------

    def _write(self, e: Event) -> bool:
        """Hand one event to W&B; True when it became a history row (with its identity)."""
        import numpy as np
        import wandb

        body = e.body
        row: dict[str, Any] = {}
        if e.kind == RUN_STARTED:
            self._finished.pop(e.run_id, None)  # a resumed run (a new attempt): open until it ends
            self._complete.discard(e.run_id)
            _keep_ending(self.root, e.run_id, exit_code=None, complete=None)
            config = config_object(body["config_json"])  # a resumed run's new attempt may change it
            self._run(e.run_id).config.update(config, allow_val_change=True)
        elif e.kind == METRICS:
            row = {wandb_key(k): v for k, v in body["scalars"].items() if self._wanted(k)}
            for k, values in body["samples"].items():
                if wandb_key(k) in row:  # our producers never send a name as both; a W&B key holds one
                    log.warning(
                        "run %s: %r is a scalar and samples in one event; W&B keeps the scalar", e.run_id, k
                    )
                elif values and self._wanted(k):
                    arr = np.asarray(values, dtype=float)
                    finite = arr[np.isfinite(arr)]
                    if finite.size:  # W&B's histogram refuses NaN and inf; the archive keeps them
                        # 64 bins, as wandb bins; lists, which wandb takes as arrays
                        row[wandb_key(k)] = wandb.Histogram(np_histogram=histogram(finite, 64))  # type: ignore[arg-type]
            if row and body["epoch"] is not None:
                row[EPOCH] = body["epoch"]
        elif e.kind == HISTOGRAM and self._wanted(body["name"]):
            edges, counts = histogram_bins(body)
            row = {wandb_key(body["name"]): wandb.Histogram(np_histogram=(counts, edges))}  # type: ignore[arg-type]
        elif e.kind == TABLE and self._wanted(body["name"]):
            row = {wandb_key(body["name"]): wandb.Table(columns=body["columns"], data=body["rows"])}
        elif e.kind == MEDIA and self._wanted(body["name"]):
            staged = self._staged(body)
            try:
                media = _wandb_media(body, staged)
            except Exception as exc:  # noqa: BLE001 - W&B reads the file (PIL, wave): bytes unlike their type
                raise ValueError(f"W&B cannot read this {body['kind']}: {type(exc).__name__}: {exc}") from exc
            row = {wandb_key(body["name"]): media}
        elif e.kind == CONFIG_UPDATE:
            changes = config_object(body["config_json"])
            self._run(e.run_id).config.update(changes, allow_val_change=True)
        elif e.kind == ALERT:  # from the alerts topic (sink wandb --alerts): on the run held open
            raise_on_wandb(self._run(e.run_id), body)
        elif e.kind == RUN_FINISHED:
            run = self._run(e.run_id)
            run.summary.update({wandb_key(k): v for k, v in body["summary"].items() if self._wanted(k)})
            run.summary["metricbus/status"] = body["status"]
            code = 0 if body["status"] == "finished" else 1
            self._finished[e.run_id] = (time.monotonic(), code)
            _keep_ending(self.root, e.run_id, exit_code=code)
            if e.run_id in self._complete:
                self._finish(e.run_id)
        if not row:
            return False
        row[STEP] = body["step"]
        run = self._run(e.run_id)
        if e.seq < 0:
            run.log(row)
            return False
        ident = row[ID_KEY] = f"{e.producer_id}/{e.seq}"
        run.log(row)
        waiting = self._waiting.get(e.run_id)
        if waiting is None:
            waiting = self._waiting[e.run_id] = _Waiting(Path(run.settings.sync_file), time.monotonic())
        waiting.add(ident, self._handed, row)
        return True

    def _staged(self, body: dict[str, Any]) -> Path:
        """A Media event's verified bytes in a file named as W&B wants it (by its extension)."""
        if self.media is None:
            raise MediaMissing("this sink has no media store to read the bytes from")
        checked_media_type(body)
        data = self.media.get(body["ref"], body["size"])
        suffix = {"image": ".png", "video": ".gif", "audio": ".wav", "text": ".txt"}[body["kind"]]
        staged = self.root / STAGED_DIR / f"{body['digest']}{suffix}"
        self._staged_files.append(staged)
        try:
            staged.parent.mkdir(parents=True, exist_ok=True)
            staged.write_bytes(data)
        except OSError as exc:  # a full disk: W&B's own files are on it too; wait, lose nothing
            staged.unlink(missing_ok=True)
            raise Unavailable(f"cannot put media for W&B in {staged.parent} ({exc})") from exc
        return staged

    def _see(self, run_id: str) -> None:
        """Strike off the rows W&B's file now holds; open the run again if W&B stopped writing it."""
        waiting = self._waiting[run_id]
        try:
            size = waiting.path.stat().st_size
        except FileNotFoundError:
            size = -1
        now = time.monotonic()
        if size != waiting.size:
            found, waiting.start = logged_ids_from(waiting.path, ID_KEY, waiting.start)
            for ident in found:
                waiting.seen(str(ident))
            waiting.size, waiting.since = size, now
        if not waiting.rows:
            del self._waiting[run_id]
            return
        closed = run_id not in self._runs  # its file is whole: what it lacks, W&B lost
        if closed or (waiting.bytes > 2 * BLOCK and now - waiting.since >= STALLED_AFTER_S):
            self._log_again(run_id, waiting)

    def _log_again(self, run_id: str, waiting: _Waiting) -> None:
        """Open the run anew (a new file) and log the rows W&B's file lacks; raises if W&B cannot."""
        log.warning(
            "run %s: W&B did not write %d row(s) to %s (is its disk full?); opening the run again "
            "to log them",
            run_id,
            len(waiting.rows),
            waiting.path,
        )
        stale = self._runs.pop(run_id, None)
        if stale is not None:
            try:
                finish(stale, timeout_s=1.0)
            except Exception as exc:  # noqa: BLE001 - a W&B that cannot write its file
                log.warning("run %s: W&B could not finish it (%s)", run_id, exc)
        run = self._run(run_id)  # raises while W&B cannot open it: the flush is retried
        fresh = self._waiting[run_id] = _Waiting(Path(run.settings.sync_file), time.monotonic())
        for ident, (n, row, _) in waiting.rows.items():
            run.log(row)
            fresh.add(ident, n, row)
        if run_id in self._finished and run_id in self._complete:
            self._finish(run_id)

    def _finish(self, run_id: str) -> None:
        run = self._runs.pop(run_id, None)
        self._written.pop(run_id, None)
        ledger = self._ledgers.get(run_id)
        if ledger is not None:
            try:
                ledger.save()
                del self._ledgers[run_id]  # loaded again with the run's next event
            except OSError as exc:  # a full disk: kept, saved by the next flush (retried until it is)
                log.warning("run %s: its ledger is not saved yet (%s); the next flush saves it", run_id, exc)
        if run is not None:
            _, code = self._finished.get(run_id, (0.0, 0))
            finish(run, exit_code=code)  # the file is the ledger the run's next opening reads

    def _restart_wandb(self) -> None:
        """Stop this process's W&B service; the next opening starts a new one.

        A ``wandb.init`` that failed half-way (its disk full) left the run's id held in the
        service: every later try was "run ID ... is in use", for good. The runs open here end
        with it (their files closed: what they lack is logged again at the next flush).
        """
        import wandb

        try:
            wandb.teardown()
        except Exception as exc:  # noqa: BLE001 - a service that cannot even stop: the next try says
            log.warning("W&B's service did not stop cleanly (%s)", exc)
        self._runs.clear()
        self._written.clear()

    def _ledger(self, run_id: str) -> Ledger:
        ledger = self._ledgers.get(run_id)
        if ledger is None:
            path = self.root / SEQS_DIR / f"{check_run_id(run_id)}.json"
            ledger = self._ledgers[run_id] = Ledger(path).load()
        return ledger

    def _remember(self, run_id: str, body: Mapping[str, Any]) -> None:
        """Keep what a later opening of the run needs (project, name, config, tags)."""
        try:
            config = config_object(body["config_json"])
        except ValueError:  # not an object: the run opens without it (_write dead-letters the event)
            config = {}
        meta = {
            "project": body["project"],
            "name": body["name"],
            "config": config,
            "tags": list(body["tags"]),
        }
        path = self.root / RUNS_DIR / f"{check_run_id(run_id)}.json"
        if not path.exists():
            atomic_write(path, json.dumps(meta).encode())

    def _run(self, run_id: str) -> Any:
        self._written[run_id] = time.monotonic()
        run = self._runs.get(run_id)
        if run is not None:
            return run

        path = self.root / RUNS_DIR / f"{check_run_id(run_id)}.json"
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError:  # a point that overtook its RunStarted (another topic)
            meta = {"project": UNKNOWN_PROJECT, "name": run_id, "config": {}, "tags": []}
            log.warning(
                "run %s: opened before its RunStarted arrived; W&B project %s", run_id, UNKNOWN_PROJECT
            )
        config = dict(meta["config"])
        project = wandb_project(meta["project"])
        if project != meta["project"]:
            config["metricbus/project"] = meta["project"]
        tags = wandb_tags(meta["tags"])
        if tags != meta["tags"]:
            config["metricbus/tags"] = meta["tags"]
        try:
            run = init_run(self.root, run_id, self.mode, project, name=meta["name"], config=config, tags=tags)
        except ImportError:
            raise
        except Exception as exc:  # noqa: BLE001 - W&B's state (in use, no disk, no service), not the event's
            self._restart_wandb()
            raise Unavailable(f"W&B cannot open run {run_id} ({type(exc).__name__}: {exc})") from exc
        run.define_metric(STEP)
        run.define_metric(EPOCH, step_metric=STEP)
        run.define_metric("*", step_metric=STEP)
        self._runs[run_id] = run
        kept = kept_ending(self.root, run_id)  # how it ended, when that was written before
        if isinstance(kept.get("exit_code"), int) and run_id not in self._finished:
            self._finished[run_id] = (time.monotonic(), kept["exit_code"])
        if kept.get("complete") is True:
            self._complete.add(run_id)
        return run


def _keep_ending(root: Path, run_id: str, **ending: Any) -> None:
    """``keep_ending``; Unavailable while the disk refuses (nothing is committed meanwhile).

    Called as the event is written: durable before the RunFinished's identity is ledgered
    (at the next flush), so an owner that finds it held also finds how the run ended.
    """
    try:
        keep_ending(root, run_id, **ending)
    except OSError as exc:  # a full disk: read the events again once it has room
        raise Unavailable(f"cannot keep how run {run_id} ended ({exc})") from exc


def _wandb_media(body: dict[str, Any], path: Path) -> Any:
    """The W&B media object of a Media event whose bytes are in ``path``."""
    import html

    import wandb

    caption = body.get("caption")
    kind = body["kind"]
    if kind == "image":
        return wandb.Image(str(path), caption=caption)
    if kind == "video":
        return wandb.Video(str(path), caption=caption, format="gif")
    if kind == "audio":
        return wandb.Audio(str(path), caption=caption)
    text = html.escape(path.read_text("utf-8", "replace"))
    head = f"<p>{html.escape(caption)}</p>" if caption else ""
    return wandb.Html(f"{head}<pre style='white-space: pre-wrap'>{text}</pre>")
