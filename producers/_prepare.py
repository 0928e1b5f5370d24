"""What the publisher's thread makes of the events ``log()`` queued: checked events, or columns.

``log()``'s quick path leaves the checks of plain numbers (their names, ints as floats, the
step's and epoch's range) to this thread; the common batch, all plain, is checked in C loops
and handed on as columns (``ScalarRows``).
"""

from __future__ import annotations

from itertools import repeat
from operator import floordiv, itemgetter
from typing import Any

from metricbus.schemas import SCALARS, ScalarRows

from ._guard import CallGuard
from ._publisher import PER_EVENT
from ._values import ValueGate

_LONG = 2**63  #: steps and epochs are Avro longs: -_LONG <= n < _LONG
_MIN_LONG = -_LONG  #: (one big int made once, not one per comparison)
#: The kind of log()'s queued events of plain numbers not yet checked.
PLAIN = "metricbus.Metrics#plain"
_PLAIN_ONLY = {PLAIN}


class Prepare:
    """The Publisher's ``prepare`` for one run: its value checks, its rank, its call guard."""

    def __init__(self, gate: ValueGate, rank: int, guard: CallGuard) -> None:
        self.gate, self.rank, self.guard = gate, rank, guard

    def __call__(self, items: list[Any], first_seq: int) -> list[Any] | ScalarRows:
        """The queue's items as events, log()'s plain ones as checked SCALARS rows (publisher's thread).

        ``items``: a head and a body per event (see ``PER_EVENT``), their seqs counting from
        ``first_seq``. The common batch, all plain without labels and with names seen before, is
        checked in C loops (:meth:`ValueGate.plain_columns`) and returned as its columns
        (ScalarRows: no tuple per event for the garbage collector); otherwise event by event. A
        plain event whose step or epoch is no Avro long is left out (a skipped call, said once
        and counted, as log() skips what it refuses) and takes no seq.
        """
        heads, bodies = items[0::PER_EVENT], items[1::PER_EVENT]
        if not heads:
            return []
        gate = self.gate
        # columns by itemgetter, not zip(*heads): that makes an iterator per event, which the
        # collector promoted (most of what a paced run promoted, measured)
        if (
            set(map(itemgetter(1), heads)) == _PLAIN_ONLY
            and not any(map(itemgetter(4), heads))
            and (columns := gate.plain_columns(bodies)) is not None
        ):
            stamps, steps, epochs = (list(map(itemgetter(i), heads)) for i in (0, 2, 3))
            if _longs(steps) and _longs(epochs):
                seqs = range(first_seq, first_seq + len(heads))
                ts_ms = list(map(floordiv, stamps, repeat(1_000_000)))
                return ScalarRows(seqs, ts_ms, steps, epochs, self.rank, bodies, *columns)
        out = []
        seq = first_seq
        for (ts, kind, step, epoch, labels), body in zip(heads, bodies, strict=True):
            if kind is PLAIN:
                try:  # log() left the range check to this thread
                    avro_long(step, "step")
                    if epoch is not None:
                        avro_long(epoch, "epoch")
                except ValueError as exc:
                    self.guard.skipped("log", exc)
                    continue  # skipped, as log() skips a call it refuses: no seq
                try:
                    scalars = gate.split_owned(body)  # ints as floats; a name that is not a str dropped
                except Exception as exc:  # noqa: BLE001 - the event keeps its seq, with no values
                    self.guard.skipped("log (on the publisher's thread)", exc)
                    scalars = {}
                out.append((seq, ts // 1_000_000, SCALARS, (step, epoch, self.rank, scalars, labels)))
            else:
                out.append((seq, ts, kind, body))
            seq += 1
        return out


def _longs(numbers: list[int | None]) -> bool:
    """Whether every int of ``numbers`` (Nones aside) fits in an Avro long (C loops)."""
    present = numbers if None not in numbers else [n for n in numbers if n is not None]
    return not present or (_MIN_LONG <= min(present) and max(present) < _LONG)  # type: ignore[type-var, operator]


def avro_long(value: Any, what: str) -> int:
    """``value`` as an Avro long (steps and epochs); ValueError when it does not fit."""
    number = int(value)
    if not _MIN_LONG <= number < _LONG:
        raise ValueError(f"{what} {number} does not fit in 64 bits")
    return number
