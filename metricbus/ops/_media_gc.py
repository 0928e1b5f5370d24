"""``metricbus gc``: delete the media store's items that no event references.

An item is kept while a Media event names it, in the archive (every run, every project) or in a
spool (a run offline, or not yet sent), and while it is younger than the grace period: its event
may still be on its way (written to the store first, then sent, then archived by the sink).
Everything else is garbage: items of runs whose archive was deleted, items a hostile writer put
in the directory, items whose events were dead-lettered.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from metricbus.schemas import (
    MEDIA,
    MediaMissing,
    MediaStore,
    SchemaError,
    Settings,
    checked_digest,
    decode_events,
    default_codec,
)

#: an item younger than this is kept, referenced or not (its event may not be archived yet)
GRACE_S = 3600.0


@dataclasses.dataclass
class Collected:
    """What one collection found and did."""

    referenced: int  #: digests the archive's and the spools' Media events name
    kept: int  #: items left in the store
    removed: int  #: items deleted (or, with ``dry_run``, that would be)
    freed_bytes: int


def referenced_digests(settings: Settings) -> set[str]:
    """The digests every archived and spooled Media event names (undecodable ones skipped)."""
    from metricbus.producers import spooled_records
    from metricbus.producers._spool import SUFFIX
    from metricbus.sinks import read_table

    codec = default_codec()
    payloads: list[bytes] = []
    if Path(settings.archive_dir).is_dir():
        table = read_table(settings.archive_dir, columns=["payload"], kinds={MEDIA}, ordered=False)
        payloads += [p for p in table["payload"].to_pylist() if p is not None]
    for spool in sorted(Path(settings.spool_dir).glob(f"*/*{SUFFIX}")):
        payloads += spooled_records(spool)
    found = set()
    for payload in payloads:
        try:
            events = decode_events(codec, payload)
        except SchemaError:
            continue
        for e in events:
            if e.kind == MEDIA:
                try:
                    found.add(checked_digest(e.body["ref"]))
                except MediaMissing:
                    continue
    return found


def collect(settings: Settings, grace_s: float = GRACE_S, dry_run: bool = False) -> Collected:
    """Delete the store's unreferenced items older than ``grace_s`` (none with ``dry_run``)."""
    store = MediaStore.of(settings)
    referenced = referenced_digests(settings)
    now = time.time()
    kept = removed = freed = 0
    for digest in list(store.digests()):
        path = store.path(digest)
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if digest in referenced or now - stat.st_mtime < grace_s:
            kept += 1
            continue
        removed += 1
        freed += stat.st_size if dry_run else store.remove(digest)
    return Collected(len(referenced), kept, removed, freed)
