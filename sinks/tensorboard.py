"""The TensorBoard sink: one log directory per run, written the way TensorBoard reads it.

Per run, ``<root>/<project>/<run name>-<run id>/`` (owned by the run its ``.metricbus-run``
file names: :meth:`TensorBoardSink.run_dir`): scalars at the event's own step and wall
time (all scalars of one event in one TensorBoard Event), per-sample arrays and Histogram
events as histograms, tables and the config as text, the config as HParams, and a custom
scalars layout built from the series the run logs (``_tb_layout``: seed 004's groups and every
framework's names; rewritten when a chart gains a series, and kept across restarts). Values
are float32 (``simple_value``), as TensorBoard itself stores them.

Durability: records are held in memory until ``flush`` appends them to an event file of our
own (TensorBoard's record format) and fsyncs it; the identities written (logged and derived)
are then saved beside it in a ledger, so a restarted sink drops re-delivered events. A crash
between the two can repeat the events of one flush interval (at-least-once). A disk that
refuses the write (full) fails the flush: the file is cut back to what the ledger records,
nothing is committed, and the runtime retries the flush with backoff until it has room; no
event is dead-lettered for it.

A run whose first event here is not its RunStarted (a derived point can overtake it: they
come from another topic) starts under ``_unknown/``; its RunStarted moves the directory to
its project. A run whose directory cannot be written (``schemas.DIRECTORY_ERRNOS``: a file in
its place, a directory of another user) is written under ``_fallback/`` by this process
(every event of it was dead-lettered before); a later process writes it at home again, and
TensorBoard shows the part under ``_fallback/`` as a run folder of its own.

Names: TensorBoard tags keep letters, digits, ``_ - / .``; any other character becomes ``_`` and, so that two
names never merge, the tag gets ``~`` and 6 hex digits of the original name's hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from metricbus.schemas import (
    CONFIG_UPDATE,
    DIRECTORY_ERRNOS,
    FALLBACK_PROJECT,
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
    path_segment,
)

from ._protocol import MetricFilter, Sink
from ._tb_layout import RunLayout, merged

log = logging.getLogger("metricbus.sink.tensorboard")
_SAFE = re.compile(r"[^-/\w.]")
SEQS_FILE = ".metricbus-seqs.json"
LAYOUT_FILE = ".metricbus-layout.json"  # the names placed in the custom-scalars layout
OWNER_FILE = ".metricbus-run"  # the id of the run whose directory it is
#: Runs whose event file the sink holds open after a flush, the most recently written: each is
#: a file descriptor (a usual soft limit is 1,024) and its ledger and layout (~10 kB). The sink
#: reopens a run it closed, ledger and all, on its next event.
OPEN_RUNS = 256
#: Directories of runs closed past OPEN_RUNS, remembered so that reopening one does not list
#: the run directories again (a cache: cleared when full)
CLOSED_KEPT = 65_536


def tag(name: str) -> str:
    """The TensorBoard tag for a metric name (deterministic; distinct names stay distinct)."""
    safe = _SAFE.sub("_", name)
    if safe == name and "~" not in name:
        return name
    return f"{safe}~{hashlib.sha1(name.encode()).hexdigest()[:6]}"  # noqa: S324 - a name, not a secret


class _RunWriter:
    """One run's event file, written synchronously with TensorBoard's record framing."""

    def __init__(self, directory: Path, run_id: str, charts: Mapping[str, Mapping[str, list[str]]]) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        if _owner(directory) is None:  # new, or written before owner files: the run's from now on
            atomic_write(directory / OWNER_FILE, run_id.encode())
        self.ledger = Ledger(directory / SEQS_FILE).load()
        self.layout = RunLayout(charts, held=_placed(directory))
        self.layout_dirty = False
        self._cut_unrecorded()
        # reopened by this process (closed past OPEN_RUNS): its file goes on, if it is the
        # directory's last (TensorBoard reads a run's files in name order, and an older file
        # no more once it reads a newer one)
        suffix = f".{socket.gethostname()}.{os.getpid()}.metricbus"
        files = sorted(p.name for p in directory.glob("events.out.tfevents.*"))
        goes_on = bool(files) and files[-1].endswith(suffix) and files[-1] in self.ledger.files
        self.name = files[-1] if goes_on else f"events.out.tfevents.{time.time():010.0f}{suffix}"
        self._file: BinaryIO = open(directory / self.name, "ab")  # noqa: SIM115 - closed in close()
        self._records = RecordWriter(self._file)
        self._event = event_pb2.Event
        #: serialized events not yet in the file: written, fsynced and recorded at flush, so a
        #: disk that refuses (full) fails the flush, which the runtime retries with everything
        #: still here, instead of failing writes whose events would be dead-lettered
        self._unwritten: list[bytes] = []
        self.dirty = False
        if not goes_on:
            self.write(self._event(wall_time=time.time(), file_version="brain.Event:2"))

    def _cut_unrecorded(self) -> None:
        """Cut what a killed process appended after its last ledger save: it is re-delivered."""
        for path in self.directory.glob("events.out.tfevents.*.metricbus"):
            held = self.ledger.files.get(path.name, 0)
            if path.stat().st_size > held:
                log.info("cutting %s to %d bytes: the rest was written after its last flush", path, held)
                if held:
                    os.truncate(path, held)
                else:
                    path.unlink()

    def write(self, event: Any) -> None:
        self._unwritten.append(event.SerializeToString())
        self.dirty = True

    def flush(self) -> None:
        """Write, fsync and record what was written since.

        On a refusal (a full disk) the file is cut back to what the ledger records and the
        error raised: the next flush writes it all again.
        """
        if self.dirty:
            try:
                for record in self._unwritten:
                    self._records.write(record)
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError:
                self._reopen_at_recorded_size()
                raise
            self._unwritten.clear()
            self.ledger.files[self.name] = self._file.tell()
            self.ledger.dirty = True
            self.dirty = False
        self.ledger.save()
        if self.layout_dirty:  # after the ledger: a name is kept once the layout event is kept
            atomic_write(self.directory / LAYOUT_FILE, json.dumps(self.layout.held()).encode())
            self.layout_dirty = False

    def _reopen_at_recorded_size(self) -> None:
        """Drop what a failed flush left in the file and in its buffer: back to the ledger's size."""
        path = self.directory / self.name
        with contextlib.suppress(OSError):  # its buffer may hold bytes the disk still refuses
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.truncate(path, self.ledger.files.get(self.name, 0))
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._file = open(path, "ab")  # noqa: SIM115 - closed in close()
        self._records = RecordWriter(self._file)

    def close(self) -> None:
        self.flush()
        self._file.close()


class TensorBoardSink(Sink):
    """The ``tensorboard`` sink (see the module docstring for its guarantees)."""

    name = "tensorboard"

    def __init__(
        self,
        root: Path,
        layout: Mapping[str, Mapping[str, list[str]]] | None = None,
        include: Sequence[str] = ("*",),
        exclude: Sequence[str] = (),
        media: MediaStore | None = None,
    ) -> None:
        """``layout``: the user's own charts (category -> chart -> regexes), beside the template's.

        ``include`` / ``exclude``: globs over metric names (scalars, per-sample arrays,
        histograms, tables, media); a name matching no include or any exclude is not written.
        ``media``: the store Media events' bytes are read from (verified); without one they are
        returned with the reason.
        """
        self.root = Path(root)
        self.media = media
        self._wanted = MetricFilter(include, exclude)
        self._charts = merged(layout)
        self._writers: dict[str, _RunWriter] = {}
        self._closed: dict[str, Path] = {}  #: run -> its directory, closed past OPEN_RUNS
        self._pending = 0

    def open(self) -> None:
        """Create the root directory."""
        self.root.mkdir(parents=True, exist_ok=True)

    def run_dir(self, project: str, name: str, run_id: str) -> Path:
        """Where a new directory of a run's event files goes.

        ``<name>-<run id>``, or the id alone when it is the name. Those can coincide (run ``1``
        named ``x``, run ``x-1``): the second run's directory is ``<that>~<run id>``.
        """
        label = path_segment(name) if name == run_id else f"{path_segment(name)}-{run_id}"
        return _free(self.root / path_segment(project) / label, run_id)

    def run_dirs(self, run_id: str) -> list[Path]:
        """The run's directories (of earlier attempts or processes), by their owner file."""
        return run_dirs(self.root, run_id)

    def recover(self, run_id: str) -> Mapping[str, Sequence[Interval]]:
        """Identities already written for the run (from the ledger of each of its directories)."""
        held: dict[str, list[Interval]] = {}
        for directory in self.run_dirs(run_id):
            for producer, intervals in Ledger.read(directory / SEQS_FILE).items():
                held.setdefault(producer, []).extend(intervals)
        return held

    def write(self, events: Sequence[Event]) -> list[tuple[Event, str]]:
        """Turn events into TensorBoard records (held in memory until :meth:`flush` writes them).

        Returns the events TensorBoard's protobufs refused, with the reason.
        """
        rejected = []
        for e in events:
            writer = self._writer(e)
            try:
                self._write(writer, e)
            except (ValueError, TypeError, OverflowError, KeyError, MediaMissing) as exc:
                rejected.append(
                    (e, f"tensorboard cannot take this {e.kind} event: {type(exc).__name__}: {exc}")
                )
                continue
            writer.ledger.add(e.producer_id, e.seq)
            self._pending += 1
        return rejected

    def derived_complete(self, run_id: str) -> None:
        """Nothing to do: every event is final once written."""

    def _write(self, writer: _RunWriter, e: Event) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        wall = e.ts_ms / 1000
        body = e.body
        if e.kind == METRICS:
            wanted = self._wanted
            scalars = body["scalars"]
            if not wanted.everything:
                scalars = {k: v for k, v in scalars.items() if wanted(k)}
            tags = [tag(k) for k in scalars]
            values = [
                summary_pb2.Summary.Value(tag=t, simple_value=v)
                for t, v in zip(tags, scalars.values(), strict=True)
            ]
            values += [_histogram_value(k, v) for k, v in body["samples"].items() if v and wanted(k)]
            layout = writer.layout
            if not layout.seen.issuperset(tags) and any(
                [layout.add(t) for t in tags if t not in layout.seen]
            ):
                values.append(writer.layout.summary_value())  # a chart gained a series
                writer.layout_dirty = True
            if values:
                writer.write(
                    event_pb2.Event(
                        wall_time=wall, step=body["step"], summary=summary_pb2.Summary(value=values)
                    )
                )
        elif e.kind == HISTOGRAM and self._wanted(body["name"]):
            writer.write(
                event_pb2.Event(
                    wall_time=wall,
                    step=body["step"],
                    summary=summary_pb2.Summary(
                        value=[_histogram_from_bins(body["name"], *histogram_bins(body))]
                    ),
                )
            )
        elif e.kind == TABLE and self._wanted(body["name"]):
            writer.write(_text_event(wall, body["step"], tag(body["name"]), _markdown_table(body)))
        elif e.kind == MEDIA and self._wanted(body["name"]):
            writer.write(self._media_event(wall, body))
        elif e.kind == RUN_STARTED:
            self._run_started(writer, wall, body)
        elif e.kind == CONFIG_UPDATE:
            changes = json.dumps(config_object(body["config_json"]), indent=2, sort_keys=True)
            text = f"config keys set during the run:\n\n```json\n{changes}\n```"
            writer.write(_text_event(wall, body["step"] or 0, "run/config_update", text))
        elif e.kind == RUN_FINISHED:
            text = f"status: **{body['status']}**\n\n" + "\n".join(
                f"- `{k}`: {v:.6g}" for k, v in sorted(body["summary"].items())
            )
            writer.write(_text_event(wall, 0, "run/finished", text))

    def _media_event(self, wall: float, body: dict[str, Any]) -> Any:
        """A Media event as TensorBoard's image (a GIF plays there), audio or text summary."""
        from tensorboard.compat.proto import event_pb2, summary_pb2

        if self.media is None:
            raise MediaMissing("this sink has no media store to read the bytes from")
        checked_media_type(body)
        data = self.media.get(body["ref"], body["size"])
        kind, name, step = body["kind"], tag(body["name"]), body["step"]
        if kind == "text":
            return _text_event(wall, step, name, data.decode("utf-8", "replace"))
        if kind == "audio":
            value = summary_pb2.Summary.Value(
                tag=name,
                audio=summary_pb2.Summary.Audio(
                    sample_rate=body["rate"],
                    num_channels=body["channels"],
                    length_frames=body["frames"],
                    encoded_audio_string=data,
                    content_type=body["media_type"],
                ),
            )
        else:
            image = summary_pb2.Summary.Image(
                height=body["height"],
                width=body["width"],
                colorspace=body["channels"],
                encoded_image_string=data,
            )
            value = summary_pb2.Summary.Value(tag=name, image=image)
        return event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value]))

    def pending(self) -> int:
        """Events written since the last flush."""
        return self._pending

    def flush(self) -> None:
        """Make every run's event file durable (fsync), then record which seqs it holds.

        Then close the least recently written runs' files past OPEN_RUNS.
        """
        for writer in self._writers.values():
            writer.flush()
        self._pending = 0
        self._close_past(OPEN_RUNS)

    def _close_past(self, kept: int) -> None:
        """Close the least recently written runs' files (flushed: durable) past ``kept`` open."""
        while len(self._writers) > kept:
            run_id = next(iter(self._writers))
            writer = self._writers.pop(run_id)
            writer.close()
            if writer.directory.parent.name not in (UNKNOWN_PROJECT, FALLBACK_PROJECT):
                if len(self._closed) >= CLOSED_KEPT:
                    self._closed.clear()
                self._closed[run_id] = writer.directory

    def release(self) -> None:
        """A rebalance: close every run's file (flushed already).

        A run's file is reopened, with its ledger, on the run's next event (its directories
        listed again: another instance may have written it meanwhile).
        """
        self.close()
        self._closed.clear()

    def close(self) -> None:
        """Flush and close every file."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    # -- internals ------------------------------------------------------------------------

    def _writer(self, e: Event) -> _RunWriter:
        writer = self._writers.get(e.run_id)
        if writer is not None and e.kind == RUN_STARTED and writer.directory.parent.name == UNKNOWN_PROJECT:
            target = self.run_dir(e.body["project"], e.body["name"], e.run_id)
            try:
                writer = self._move(writer, target)
            except OSError as exc:
                if exc.errno not in DIRECTORY_ERRNOS:
                    raise
                log.error(
                    "run %s: cannot move %s to %s (%s); it stays", e.run_id, writer.directory, target, exc
                )
                writer = self._writers[e.run_id] = _RunWriter(writer.directory, e.run_id, self._charts)
        if writer is None:
            # the run's directory from an earlier attempt (a resumed run: run_id= of an earlier
            # run) or an earlier process, whatever name the new attempt gave
            closed = self._closed.pop(e.run_id, None)
            existing = [closed] if closed is not None and closed.is_dir() else self.run_dirs(e.run_id)
            if e.kind == RUN_STARTED:
                named = [d for d in existing if d.parent.name not in (UNKNOWN_PROJECT, FALLBACK_PROJECT)]
                directory = named[0] if named else self.run_dir(e.body["project"], e.body["name"], e.run_id)
            else:
                directory = existing[0] if existing else self.run_dir(UNKNOWN_PROJECT, e.run_id, e.run_id)
            try:
                writer = _RunWriter(directory, e.run_id, self._charts)
            except OSError as exc:
                if exc.errno not in DIRECTORY_ERRNOS:
                    raise
                fallback = _free(self.root / FALLBACK_PROJECT / directory.name, e.run_id)
                log.error(
                    "run %s: cannot write %s (%s); this process writes it to %s",
                    e.run_id,
                    directory,
                    exc,
                    fallback,
                )
                writer = _RunWriter(fallback, e.run_id, self._charts)
            self._close_past(2 * OPEN_RUNS - 1)  # a batch of many runs: before the descriptors run out
            self._writers[e.run_id] = writer
        elif next(reversed(self._writers)) != e.run_id:
            self._writers[e.run_id] = self._writers.pop(e.run_id)  # the most recently written last
        return writer

    def _move(self, writer: _RunWriter, directory: Path) -> _RunWriter:
        """Move a run started under ``_unknown`` to its project's directory."""
        writer.close()
        run_id = next(r for r, w in self._writers.items() if w is writer)
        if directory.exists():  # already there from an earlier process: keep both files there
            placed = sorted({*_placed(directory), *_placed(writer.directory)})
            atomic_write(directory / LAYOUT_FILE, json.dumps(placed).encode())
            (writer.directory / LAYOUT_FILE).unlink(missing_ok=True)
            for path in writer.directory.iterdir():
                if path.name != SEQS_FILE:
                    os.replace(path, directory / path.name)
            merged = Ledger(directory / SEQS_FILE).load()
            merged.merge(writer.ledger.intervals())
            merged.files.update(writer.ledger.files)
            merged.dirty = True
            merged.save()
            (writer.directory / SEQS_FILE).unlink(missing_ok=True)
            writer.directory.rmdir()
        else:
            directory.parent.mkdir(parents=True, exist_ok=True)
            os.replace(writer.directory, directory)
        moved = self._writers[run_id] = _RunWriter(directory, run_id, self._charts)
        return moved

    def _run_started(self, writer: _RunWriter, wall: float, body: dict[str, Any]) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.hparams import summary_v2 as hparams

        config = config_object(body["config_json"])
        flat = {
            k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
            for k, v in _flatten(config).items()
        }
        writer.write(
            event_pb2.Event(wall_time=wall, step=0, summary=hparams.hparams_pb(flat, trial_id=body["name"]))
        )
        text = f"project **{body['project']}**, run **{body['name']}** on {body['host']} (pid {body['pid']})"
        if body.get("git"):
            text += f", git {body['git']}"
        text += "\n\n```json\n" + json.dumps(config, indent=2, sort_keys=True) + "\n```"
        writer.write(_text_event(wall, 0, "run/config", text))


def run_dirs(root: Path, run_id: str) -> list[Path]:
    """The directories of a run under the TensorBoard sink's ``root``, by their owner file.

    One written before owner files is the run's by its name: the id, or ending ``-<id>``.
    """
    check_run_id(run_id)
    found = []
    for directory in sorted(Path(root).glob(f"*/*{run_id}/")):  # directories only
        owner = _owner(directory)
        if owner == run_id or (
            owner is None and (directory.name == run_id or directory.name.endswith(f"-{run_id}"))
        ):
            found.append(directory)
    return sorted(found, key=lambda d: d.parent.name in (UNKNOWN_PROJECT, FALLBACK_PROJECT))  # own first


def _free(directory: Path, run_id: str) -> Path:
    """``directory``, or ``<it>~<run id>`` when another run owns it."""
    if directory.exists() and _owner(directory) not in (None, run_id):
        return directory.with_name(f"{directory.name}~{run_id}")
    return directory


def _owner(directory: Path) -> str | None:
    """The run id in a directory's owner file; None when it has none."""
    try:
        return (directory / OWNER_FILE).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _placed(directory: Path) -> list[str]:
    """The names an earlier process placed in this run's layout (none when unreadable)."""
    try:
        names = json.loads((directory / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}/"))
        elif value is not None:
            out[f"{prefix}{key}"] = value
    return out


def _histogram_value(name: str, values: Sequence[float]) -> Any:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    finite = arr[np.isfinite(arr)]
    counts, edges = histogram(finite, min(30, max(1, finite.size)))
    return _histogram_from_bins(name, edges, counts, finite)


def _histogram_from_bins(name: str, edges: Sequence[float], counts: Sequence[int], raw: Any = None) -> Any:
    from tensorboard.compat.proto import summary_pb2

    total = float(sum(counts))
    centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    if raw is not None:
        import numpy as np

        with np.errstate(over="ignore", invalid="ignore"):  # inf past float's range
            s, s2 = float(raw.sum()), float((raw * raw).sum())
    else:
        s = sum(c * w for c, w in zip(centers, counts, strict=True))
        s2 = sum(c * c * w for c, w in zip(centers, counts, strict=True))
    histo = summary_pb2.HistogramProto(
        min=float(edges[0]),
        max=float(edges[-1]),
        num=total,
        sum=s,
        sum_squares=s2,
        bucket_limit=[float(e) for e in edges[1:]],
        bucket=[float(c) for c in counts],
    )
    return summary_pb2.Summary.Value(tag=tag(name), histo=histo)


def _text_event(wall: float, step: int, name: str, text: str) -> Any:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.text import metadata as text_metadata
    from tensorboard.util import tensor_util

    value = summary_pb2.Summary.Value(
        tag=name,
        metadata=text_metadata.create_summary_metadata(display_name=name, description=""),
        tensor=tensor_util.make_tensor_proto([text]),
    )
    return event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value]))


def _markdown_table(body: dict[str, Any]) -> str:
    head = "| " + " | ".join(body["columns"]) + " |\n|" + "---|" * len(body["columns"])
    rows = [
        "| "
        + " | ".join("" if c is None else f"{c:.6g}" if isinstance(c, float) else str(c) for c in row)
        + " |"
        for row in body["rows"]
    ]
    return "\n".join([head, *rows])
