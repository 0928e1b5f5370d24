"""The Parquet archive's layout and its read side (export, replay, the demo's summary).

Layout: ``<archive>/project=<project>/run=<run_id>/part-<t>-<id>.parquet``, hive-style so
pyarrow and duckdb read the project and run from the path. One row per scalar of a Metrics
event (``name``, ``value``), one per sample array (``samples``), one per other event
(``payload`` holds that event, single-object encoded, so replay loses nothing).
A Metrics event's labels are on each of its rows (``labels``, a map; null when none); files
of format 1 have no such column and read as null.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Collection, Iterator, Mapping
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from metricbus.schemas import (
    DERIVED_PRODUCER,
    FALLBACK_PROJECT,
    METRICS,
    RUN_STARTED,
    UNKNOWN_PROJECT,
    Codec,
    Event,
    default_codec,
    path_segment,
)

FORMAT_VERSION = "2"  # 2: the labels column
SEQS_KEY = b"metricbus.seqs"
FORMAT_KEY = b"metricbus.format"
REPLACES_KEY = b"metricbus.replaces"

#: A Metrics event's labels (``{"task": "logo_a"}``): duckdb reads ``labels['task']``.
LABELS = pa.map_(pa.string(), pa.string())

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("producer_id", pa.string()),
        ("seq", pa.int64()),
        ("ts_ms", pa.int64()),
        ("kind", pa.string()),
        ("step", pa.int64()),
        ("epoch", pa.int64()),
        ("rank", pa.int32()),
        ("labels", LABELS),
        ("name", pa.string()),
        ("value", pa.float64()),
        ("samples", pa.list_(pa.float64())),
        ("payload", pa.binary()),
        ("fingerprint", pa.string()),
    ]
)


#: folders holding rows of runs of any project
PLACEHOLDERS = (UNKNOWN_PROJECT, FALLBACK_PROJECT)
_PLACEHOLDER_FOLDERS = frozenset(map(path_segment, PLACEHOLDERS))


def run_dir(archive: Path, project: str, run_id: str) -> Path:
    """The directory holding one run's files."""
    return Path(archive) / f"project={path_segment(project)}" / f"run={run_id}"


def find_run_dirs(archive: Path, run_id: str) -> list[Path]:
    """Every directory of ``run_id`` in the archive (normally one)."""
    return sorted(Path(archive).glob(f"project=*/run={run_id}"))


def run_folders(archive: Path) -> dict[str, set[str]]:
    """Each run of the archive, by run id, and the project folders holding its rows.

    Usually one; a run may have rows in :data:`PLACEHOLDERS` folders as well as its project's
    (or only there), and is one run all the same.
    """
    folders: dict[str, set[str]] = {}
    for directory in Path(archive).glob("project=*/run=*/"):
        run_id, folder = directory.name.split("=", 1)[1], directory.parent.name.split("=", 1)[1]
        folders.setdefault(run_id, set()).add(folder)
    return dict(sorted(folders.items()))


def project_of(folders: set[str], starts: list[Event]) -> str:
    """A run's project: its (first) RunStarted's, else its own folder's, else a placeholder's."""
    if starts:
        return str(starts[0].body["project"])
    own = sorted(folders - _PLACEHOLDER_FOLDERS) or sorted(folders)
    return urllib.parse.unquote(own[0])


def might_be_of(folders: set[str], project: str) -> bool:
    """Whether a run in ``folders`` can belong to ``project`` (else it need not be read)."""
    return bool(folders & {path_segment(project), *_PLACEHOLDER_FOLDERS})


def run_projects(archive: Path, project: str | None = None) -> dict[str, str]:
    """Each run of the archive (of ``project`` only, if given) and its project, by run id."""
    found = {}
    for run_id, folders in run_folders(archive).items():
        if project is not None and not might_be_of(folders, project):
            continue
        starts = [e for chunk in iter_events(archive, run_id, kinds={RUN_STARTED}) for e in chunk]
        name = project_of(folders, starts)
        if project is None or name == project:
            found[run_id] = name
    return found


def read_table(
    archive: Path,
    run_id: str | None = None,
    project: str | None = None,
    columns: list[str] | None = None,
    ordered: bool = True,
    kinds: Collection[str] | None = None,
    since: Mapping[str, int] | None = None,
    dictionary: Collection[str] = (),
    logged: bool = False,
    names: Collection[str] | None = None,
) -> pa.Table:
    """Read the archive (or one run / project of it) as one Arrow table, sorted by producer and seq.

    ``ordered=False``: in the files' order (a caller that sorts a chunk at a time). ``kinds``:
    only the rows of events of these kinds; ``since``: of the producers it names, only the rows
    of seqs from the one given (both filtered while the files are read: a file none of whose
    rows can match is skipped by its statistics). ``dictionary``: string columns read
    dictionary-encoded (a few distinct values, each row an index: ``name`` and ``fingerprint``
    took 36 of a row's ~95 bytes as strings); not ``producer_id``, which the order sorts by.
    ``logged``: only the rows of logged events (not the stream worker's derived ones).
    ``names``: only the rows of these scalar or sample names (one metric of many runs).
    """
    import pyarrow.dataset as ds

    schema, fmt = _read_format(dictionary)
    for attempt in range(10):  # a live sink may compact the run while we read it: list again
        paths = _paths(archive, run_id, project)
        try:
            paths = _current(paths)
            if not paths:
                return schema.empty_table() if columns is None else schema.empty_table().select(columns)
            dataset = ds.dataset([str(p) for p in paths], schema=schema, format=fmt)
            table = dataset.to_table(columns=columns, filter=_row_filter(kinds, since, logged, names))
            break
        except FileNotFoundError:
            if attempt == 9:
                raise
            time.sleep(0.05)
    if ordered and (columns is None or {"producer_id", "seq"} <= set(columns)):
        table = _takeable(table).sort_by([("producer_id", "ascending"), ("seq", "ascending")])
    return table


def _takeable(table: pa.Table) -> pa.Table:
    """``table`` with each string or binary column of 2 GiB or more as its large type.

    Taking rows of a column joins its chunks into one array, whose 32-bit offsets hold 2 GiB:
    a 50-minute soak's run (90M rows, a 32-character producer id on each) failed to sort with
    "offset overflow while concatenating arrays".
    """
    for i, field in enumerate(table.schema):
        large = {pa.string(): pa.large_string(), pa.binary(): pa.large_binary()}.get(field.type)
        if large is not None and table.column(i).nbytes >= 1 << 31:
            table = table.set_column(i, field.with_type(large), table.column(i).cast(large))
    return table


def _read_format(dictionary: Collection[str] = ()) -> tuple[pa.Schema, Any]:
    """The schema to read with (``dictionary``'s string columns dictionary-encoded) and its format."""
    import pyarrow.dataset as ds

    if not dictionary:
        return SCHEMA, ds.ParquetFileFormat()
    schema = SCHEMA
    for name in dictionary:
        schema = schema.set(
            schema.get_field_index(name), pa.field(name, pa.dictionary(pa.int32(), pa.string()))
        )
    read = ds.ParquetReadOptions(dictionary_columns=list(dictionary))
    return schema, ds.ParquetFileFormat(read_options=read)


def run_files(archive: Path, run_id: str) -> list[Path]:
    """A run's Parquet files as listed now (every project directory it has)."""
    return _paths(archive, run_id)


def _paths(archive: Path, run_id: str | None = None, project: str | None = None) -> list[Path]:
    """The archive's files (or one run's, or one project's), as listed now."""
    archive = Path(archive)
    if run_id is not None:
        return [p for d in find_run_dirs(archive, run_id) for p in sorted(d.glob("*.parquet"))]
    if project is not None:
        return sorted((archive / f"project={path_segment(project)}").glob("run=*/*.parquet"))
    return sorted(archive.glob("project=*/run=*/*.parquet"))


def _row_filter(
    kinds: Collection[str] | None,
    since: Mapping[str, int] | None,
    logged: bool = False,
    names: Collection[str] | None = None,
) -> Any:
    """The dataset filter of :func:`read_table`'s ``kinds``, ``since``, ``logged`` and ``names``."""
    import pyarrow.dataset as ds

    only = None if kinds is None else ds.field("kind").isin(sorted(kinds))
    if names is not None:
        named = ds.field("name").isin(sorted(names))
        only = named if only is None else only & named
    if logged:
        mine = ds.field("producer_id") != DERIVED_PRODUCER
        only = mine if only is None else only & mine
    if since:
        producer, seq = ds.field("producer_id"), ds.field("seq")
        later = ~producer.isin(sorted(since))
        for name, first in sorted(since.items()):
            later = later | ((producer == name) & (seq >= first))
        only = later if only is None else only & later
    return only


def replaced_by(path: Path) -> list[str]:
    """Names of the files a compacted file replaces (from its footer)."""
    meta = pq.read_metadata(path).metadata or {}
    return list(json.loads(meta.get(REPLACES_KEY, b"[]")))


def _current(paths: list[Path]) -> list[Path]:
    """``paths`` without the files that a compacted file among them replaces.

    A compaction renames the merged file into place before it deletes the files it merged.
    """
    stale = {p.parent / name for p in paths if p.name.startswith("compacted-") for name in replaced_by(p)}
    return [p for p in paths if p not in stale]


def read_events(archive: Path, run_id: str, codec: Codec | None = None, derived: bool = False) -> list[Event]:
    """The run's events, rebuilt losslessly from the archive, in (producer_id, seq) order.

    Metrics events come back from their rows (one per scalar or sample array); every other
    event from its ``payload``. By default what was logged, without the derived series
    archived beside it (producer ``metricbus.stream``): what back-tests and a republish to
    Kafka feed the stream job. ``derived=True`` adds them, with their identities: what a
    replay into a sink writes, so it shows what live consumption showed. A long run is better
    read a chunk at a time (:func:`iter_events`).
    """
    return [e for chunk in iter_events(archive, run_id, codec, derived) for e in chunk]


#: the archive's columns an event is rebuilt from, in the order :func:`iter_events` takes them
_EVENT_COLUMNS = (
    "producer_id",
    "seq",
    "ts_ms",
    "step",
    "epoch",
    "rank",
    "labels",
    "name",
    "value",
    "samples",
    "payload",
    "fingerprint",
)


def iter_events(
    archive: Path,
    run_id: str,
    codec: Codec | None = None,
    derived: bool = False,
    rows: int = 1 << 15,
    kinds: Collection[str] | None = None,
    since: Mapping[str, int] | None = None,
) -> Iterator[list[Event]]:
    """:func:`read_events` in chunks of the events of about ``rows`` archive rows each.

    Only one file's rows of one producer (:func:`_sorted_rows`) and one chunk's Python objects
    are held at once: the whole run as one Arrow table took ~70 bytes an archive row (150 MB for
    a 200,000-step run of ten metrics), its rows as Python dicts ~14 KB per ten-scalar event
    (2.8 GB). A Metrics event whose rows go on in the next chunk goes whole in the next.
    ``kinds``: only events of these kinds (``{RUN_STARTED, RUN_FINISHED}``: no metric row
    becomes a Python object); ``since``: as :func:`read_table`'s.
    """
    codec = codec or default_codec()
    events: list[Event] = []
    current: tuple[str, int] | None = None  # the Metrics event whose rows are being read
    body: dict[str, Any] = {}
    for batch in _sorted_rows(archive, run_id, derived, kinds, since, max(1, rows)):
        # a dictionary column decoded first: its to_pylist is ~3x slower than a string column's
        columns = [_plain(column).to_pylist() for column in batch.columns]
        for producer_id, seq, ts_ms, step, epoch, rank, labels, name, value, samples, payload, fp in zip(
            *columns, strict=True
        ):
            key = (producer_id, seq)
            if payload is None and key == current:  # the next scalar of the same Metrics event
                pass
            else:
                if payload is not None:
                    (e,) = codec.decode(payload)[1]["events"]
                    kind, body = e["body"]
                    current = None
                else:
                    kind, current = METRICS, key
                    body = {
                        "step": step,
                        "epoch": epoch,
                        "rank": rank,
                        "scalars": {},
                        "samples": {},
                        "labels": dict(labels or ()),
                    }
                events.append(Event(run_id, producer_id, seq, ts_ms, kind, body, bytes.fromhex(fp)))
                if current is None:
                    continue
            if samples is not None:
                body["samples"][name] = samples
            else:
                body["scalars"][name] = value
        if current is None:
            done, events = events, []
        else:  # its next rows may be in the next batch
            done, events = events[:-1], events[-1:]
        if done:
            yield done
    if events:
        yield events


#: :func:`_sorted_rows` keeps a run's files open while it reads them, up to this many; a run of
#: more files is read whole
MAX_OPEN_FILES = 256


def _sorted_rows(
    archive: Path,
    run_id: str,
    derived: bool,
    kinds: Collection[str] | None,
    since: Mapping[str, int] | None,
    rows: int,
) -> Iterator[pa.Table]:
    """The run's archive rows (:data:`_EVENT_COLUMNS`) in (producer_id, seq) order, ``rows`` at a time.

    A row group at a time: the files are opened first (a live sink's compaction may delete one
    while the run is read; an open file stays readable), then each row group's producers and seq
    span read from two columns, then per producer its row groups in seq order, each read and
    sorted alone, or a few together where their seqs interleave (an event archived twice).
    Past :data:`MAX_OPEN_FILES` files the run is read as one table (sorted a chunk at a time by
    the order's indices: a sorted copy of the whole table doubled what a read held).
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    schema, fmt = _read_format(("name", "fingerprint"))
    columns, only = list(_EVENT_COLUMNS), _row_filter(kinds, since)
    files = _open_run(archive, run_id)
    if files is None:
        table = read_table(
            archive,
            run_id,
            columns=columns,
            ordered=False,
            kinds=kinds,
            since=since,
            dictionary=("name", "fingerprint"),
        )
        if not derived:
            table = table.filter(pc.not_equal(table["producer_id"], DERIVED_PRODUCER))
        table = _takeable(table)
        order = pc.sort_indices(table, sort_keys=[("producer_id", "ascending"), ("seq", "ascending")])
        for start in range(0, len(order), rows):
            yield table.take(order.slice(start, rows))
        return
    try:
        spans: dict[str, list[tuple[int, int, Any]]] = {}  # producer: (first seq, last seq, file)
        # a row group at a time: a compacted file holds up to 2M rows, in row groups of ~100k
        fragments = [part for file in files for part in fmt.make_fragment(file).split_by_row_group()]
        for fragment in fragments:
            keys = fragment.to_table(schema=schema, columns=["producer_id", "seq"], filter=only)
            for span in keys.group_by("producer_id").aggregate([("seq", "min"), ("seq", "max")]).to_pylist():
                spans.setdefault(span["producer_id"], []).append((span["seq_min"], span["seq_max"], fragment))
        for producer in sorted(spans):
            if producer == DERIVED_PRODUCER and not derived:
                continue
            where = ds.field("producer_id") == producer
            where = where if only is None else where & only
            for together in _interleaved(spans[producer]):
                table = _takeable(
                    pa.concat_tables(
                        [f.to_table(schema=schema, columns=columns, filter=where) for f in together]
                    )
                )
                # a stable sort: an event's rows keep their order
                order = pc.sort_indices(table, sort_keys=[("seq", "ascending")])
                for start in range(0, len(order), rows):
                    yield table.take(order.slice(start, rows))
    finally:
        for file in files:
            file.close()


def _interleaved(spans: list[tuple[int, int, Any]]) -> Iterator[list[Any]]:
    """The files of ``spans`` (first seq, last seq, file) in seq order, those whose spans overlap together."""
    group: list[Any] = []
    last = 0
    for first, end, file in sorted(spans, key=itemgetter(0, 1)):
        if group and first > last:
            yield group
            group = []
        last = max(last, end) if group else end
        group.append(file)
    if group:
        yield group


def _open_run(archive: Path, run_id: str) -> list[pa.NativeFile] | None:
    """The run's current files, opened; None past :data:`MAX_OPEN_FILES` of them."""
    for attempt in range(10):  # a live sink may compact the run while we list it: list again
        opened: list[pa.NativeFile] = []
        try:
            paths = _current(_paths(archive, run_id))
            if len(paths) > MAX_OPEN_FILES:
                return None
            for path in paths:
                opened.append(pa.OSFile(str(path)))
            return opened
        except FileNotFoundError:
            for file in opened:
                file.close()
            if attempt == 9:
                raise
            time.sleep(0.05)
    return None  # (not reached)


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column


def run_extent(archive: Path, run_id: str) -> dict[str, Any] | None:
    """What a run's logged events span, from three columns: None when the archive has none.

    ``events`` (distinct identities), ``first_step``/``last_step`` (None without steps),
    ``first_ts_ms``/``last_ts_ms``.
    """
    import pyarrow.compute as pc

    table = read_table(archive, run_id, columns=["producer_id", "seq", "ts_ms", "step"], ordered=False)
    table = table.filter(pc.not_equal(table["producer_id"], DERIVED_PRODUCER))
    if not table.num_rows:
        return None
    steps, stamps = pc.min_max(table["step"]), pc.min_max(table["ts_ms"])
    return {
        "events": table.group_by(["producer_id", "seq"]).aggregate([]).num_rows,
        "first_step": steps["min"].as_py(),
        "last_step": steps["max"].as_py(),
        "first_ts_ms": stamps["min"].as_py(),
        "last_ts_ms": stamps["max"].as_py(),
    }


def tidy(
    archive: Path,
    run_id: str,
    derived: bool = True,
    labels: bool = False,
    names: Collection[str] | None = None,
) -> pa.Table:
    """One run's scalars as tidy rows: run, step, name, value, wall_time (UTC), sorted by step.

    ``derived=False`` leaves out the stream worker's derived series; ``labels=True`` adds the
    ``labels`` of each value's event (a map, null for none); ``names``: only these series.
    """
    import pyarrow.compute as pc

    columns = ["run_id", "producer_id", "kind", "step", "name", "value", "ts_ms", "seq"]
    if labels:
        columns.append("labels")
    table = read_table(archive, run_id, columns=columns, names=names)
    keep = pc.and_(pc.equal(table["kind"], METRICS), pc.is_valid(table["value"]))
    if not derived:
        keep = pc.and_(keep, pc.not_equal(table["producer_id"], DERIVED_PRODUCER))
    table = table.filter(keep)
    wall = pc.cast(table["ts_ms"], pa.timestamp("ms", tz="UTC"))
    out = pa.table(
        {
            "run": table["run_id"],
            "step": table["step"],
            "name": table["name"],
            "value": table["value"],
            "wall_time": wall,
            "seq": table["seq"],
            **({"labels": table["labels"]} if labels else {}),
        }
    )
    return out.sort_by([("step", "ascending"), ("seq", "ascending"), ("name", "ascending")]).drop_columns(
        ["seq"]
    )


def summary(archive: Path, run_id: str, derived: bool = True) -> list[dict[str, Any]]:
    """Per metric: count, first/last step, first/last/min/max/mean value (the demo's table)."""
    table = tidy(archive, run_id, derived)
    grouped = table.group_by("name").aggregate(
        [
            ("value", "count"),
            ("step", "min"),
            ("step", "max"),
            ("value", "min"),
            ("value", "max"),
            ("value", "mean"),
        ]
    )
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for name, value in zip(table["name"].to_pylist(), table["value"].to_pylist(), strict=True):
        first.setdefault(name, value)
        last[name] = value
    rows = []
    for row in grouped.to_pylist():
        rows.append(
            {
                "name": row["name"],
                "count": row["value_count"],
                "first_step": row["step_min"],
                "last_step": row["step_max"],
                "first": first[row["name"]],
                "last": last[row["name"]],
                "min": row["value_min"],
                "max": row["value_max"],
                "mean": row["value_mean"],
            }
        )
    return sorted(rows, key=lambda r: r["name"])
