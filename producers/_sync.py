"""``metricbus sync``: publish what finished or crashed runs left in their spools, in order."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from metricbus.schemas import SchemaError, Settings, decode_record, default_codec

from ._spool import Spool, SpoolBusyError, pending_spools
from ._transport import KafkaTransport, Transport, TransportError

log = logging.getLogger("metricbus.sync")


@dataclasses.dataclass
class SyncReport:
    """What one sync did."""

    records_sent: int = 0
    events_sent: int = 0  #: the events those records held (a record holds a batch of them)
    spools_done: list[Path] = dataclasses.field(default_factory=list)
    spools_busy: list[Path] = dataclasses.field(default_factory=list)
    spools_failed: dict[Path, str] = dataclasses.field(default_factory=dict)


def events_in(record: bytes) -> int:
    """How many events a spooled record holds (0 for one that does not decode: sent as it is)."""
    try:
        events, columns = decode_record(default_codec(), record)
    except SchemaError:
        return 0
    return len(events) + (len(columns.seqs) if columns is not None else 0)


#: records sent between two checks that the broker still holds what it acknowledged
CHECK_EVERY = 4096


def _checked(transport: Transport, spool: Spool, sent: int) -> None:
    """Move the spool's cursor to ``sent`` once the broker is seen to hold it.

    As a live publisher checks: a memory-only broker that restarted, or is restarting on
    purpose, does not. Raises TransportError, leaving the cursor where it was: the next sync
    sends again.
    """
    transport.verify()
    if transport.take_lost():
        raise TransportError("the broker lost what it acknowledged (it restarted); run sync again")
    spool.commit(sent)


def sync_spools(settings: Settings, transport: Transport | None = None) -> SyncReport:
    """Publish every spool under ``settings.spool_dir`` that a live process does not own.

    A spool whose run is still live is skipped (its own publisher sends it). A failure
    leaves the spool as it was after its last checked record; run sync again (consumers drop
    what arrives twice).
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
                sent = None  # sent and acknowledged up to here, not yet checked
                while batch := spool.read_unsent(max_records=64, start=sent):
                    transport.send(key, [record for record, _ in batch])
                    sent = batch[-1][1]
                    report.records_sent += len(batch)
                    report.events_sent += sum(events_in(record) for record, _ in batch)
                    if report.records_sent % CHECK_EVERY < len(batch):
                        _checked(transport, spool, sent)
                if sent is not None:
                    _checked(transport, spool, sent)
                report.spools_done.append(path)
            except TransportError as exc:
                report.spools_failed[path] = str(exc)
            finally:
                spool.close()
    finally:
        transport.close()
    return report
