"""``metricbus sync``: publish what finished or crashed runs left in their spools, in order."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from schemas import Settings

from ._spool import Spool, SpoolBusyError, pending_spools
from ._transport import KafkaTransport, Transport, TransportError

log = logging.getLogger("metricbus.sync")


@dataclasses.dataclass
class SyncReport:
    """What one sync did."""

    records_sent: int = 0
    spools_done: list[Path] = dataclasses.field(default_factory=list)
    spools_busy: list[Path] = dataclasses.field(default_factory=list)
    spools_failed: dict[Path, str] = dataclasses.field(default_factory=dict)


def sync_spools(settings: Settings, transport: Transport | None = None) -> SyncReport:
    """Publish every spool under ``settings.spool_dir`` that a live process does not own.

    A spool whose run is still live is skipped (its own publisher sends it). A failure
    leaves the spool as it was after its last acknowledged record; run sync again.
    """
    transport = transport or KafkaTransport(settings)
    report = SyncReport()
    try:
        for path in pending_spools(settings.spool_dir):
            try:
                spool = Spool(path)
            except SpoolBusyError:
                report.spools_busy.append(path)
                continue
            key = path.parent.name.encode()  # the run id: records keep their partition
            try:
                while batch := spool.read_unsent(max_records=64):
                    transport.send(key, [record for record, _ in batch])
                    spool.commit(batch[-1][1])
                    report.records_sent += len(batch)
                report.spools_done.append(path)
            except TransportError as exc:
                report.spools_failed[path] = str(exc)
            finally:
                spool.close()
    finally:
        transport.close()
    return report
