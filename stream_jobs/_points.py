"""What derivation puts out: derived points, and the logged series it passes on as columns."""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple


class Point(NamedTuple):
    """One derived value; becomes an Aggregate record.

    A NamedTuple: hundreds of thousands are made per second, and a frozen dataclass costs
    several times more to build.
    """

    name: str
    source: str
    kind: str
    step: int
    epoch: int | None
    value: float
    ts_ms: int

    def as_record(self) -> dict[str, Any]:
        """The Aggregate Avro record."""
        return self._asdict()


#: a Point from a tuple of its fields, all in C (``Point._make`` is a Python call a point)
point_of = partial(tuple.__new__, Point)


class Column(NamedTuple):
    """One logged series over a stretch of an input record: its values with their steps and times."""

    name: str
    values: list[float]
    steps: list[int]
    ts_ms: list[int]
