"""Per-label series of one run: what seed 001 calls per-category ("logo type") performance.

A Metrics event may carry labels (``{"task": "logo_a", "termination": "timeout"}``). Each of
its scalars also counts toward ``by_<key>/<value>/<metric>_recent_mean``, the mean of that
metric's last ``label_window`` values with that label (for ``episode/success``, logged as 1 or
0, the success rate), and each value of a key gets ``by_<key>/<value>/share``: how many of the
last ``label_window`` events carrying the key had that value (the task mix, the termination
reasons). ``by_<key>`` first: TensorBoard and W&B group a key's series in one section.

Labels are untrusted: a key or value becomes one name segment (characters outside
``[A-Za-z0-9._-]`` become ``_``, at most 64), and a run derives at most ``label_keys`` keys and
``label_values`` values per key; the rest are counted in ``refused`` and said once per run.
"""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Mapping

from ._config import StreamConfig
from ._stats import Window

log = logging.getLogger("metricbus.stream")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def segment(text: str) -> str:
    """A label key or value as one segment of a metric name."""
    return _UNSAFE.sub("_", text)[:64] or "_"


class LabelSeries:
    """The per-label windows of one run (pickled with the run's state in checkpoints)."""

    def __init__(self, run_id: str, cfg: StreamConfig) -> None:
        self.run_id = run_id
        self.cfg = cfg
        #: (key, value, metric) -> that metric's last values with that label
        self._windows: dict[tuple[str, str, str], Window] = {}
        #: key -> the values of the last label_window events that carried it
        self._recent: dict[str, collections.deque[str]] = {}
        #: key -> its values seen, in first-seen order (at most label_values)
        self._values: dict[str, dict[str, None]] = {}
        self._touched: dict[tuple[str, str, str], tuple[int, int | None, int]] = {}
        self._touched_keys: dict[str, tuple[int, int | None, int]] = {}
        self.refused = 0
        self._said = False

    def feed(
        self,
        labels: Mapping[str, str],
        scalars: Mapping[str, float],
        step: int,
        epoch: int | None,
        ts: int,
        room: int,
    ) -> None:
        """Fold in one labelled event; its series get points at the next :meth:`points`.

        ``room``: how many new series the run may still derive (its ``max_series``, which label
        series count toward: one event of 10,000 scalars under 8 labels made 80,000 of them).
        """
        where = (step, epoch, ts)
        for raw_key, raw_value in labels.items():
            key, value = segment(str(raw_key)), segment(str(raw_value))
            values = self._values.get(key)
            if values is None:
                if len(self._values) >= self.cfg.label_keys:
                    self._refuse(f"label key {key!r}: more than {self.cfg.label_keys} keys")
                    continue
                values = self._values[key] = {}
                self._recent[key] = collections.deque(maxlen=self.cfg.label_window)
            if value not in values:
                if len(values) >= self.cfg.label_values:
                    self._refuse(f"label {key}={value!r}: more than {self.cfg.label_values} values")
                    continue
                values[value] = None
            for metric, x in scalars.items():
                window = self._windows.get((key, value, metric))
                if window is None:
                    if room <= 0:
                        self._refuse(
                            f"by_{key}/{value}: the run derives from {self.cfg.max_series} series at most"
                        )
                        continue
                    room -= 1
                    window = self._windows[(key, value, metric)] = Window(self.cfg.label_window)
                window.add(x)
                self._touched[(key, value, metric)] = where
            self._recent[key].append(value)
            self._touched_keys[key] = where

    def series(self) -> int:
        """How many series this run derives from labels (each ~1.1 kB of the worker's state)."""
        return len(self._windows)

    def points(self) -> list[tuple[str, str, str, int, int | None, float, int]]:
        """``(name, source, kind, step, epoch, value, ts)`` of every series fed since the last call.

        Once each, at the last step it was fed: like the rolling statistics, once per input record.
        """
        out = []
        for (key, value, metric), (step, epoch, ts) in self._touched.items():
            window = self._windows[(key, value, metric)]
            if len(window):
                name = f"by_{key}/{value}/{metric}_recent_mean"
                out.append((name, metric, "label_mean", step, epoch, window.mean(), ts))
        for key, (step, epoch, ts) in self._touched_keys.items():
            recent = self._recent[key]
            counts = collections.Counter(recent)
            for v in self._values[key]:
                out.append(
                    (f"by_{key}/{v}/share", key, "label_share", step, epoch, counts[v] / len(recent), ts)
                )
        self._touched.clear()
        self._touched_keys.clear()
        return out

    def _refuse(self, why: str) -> None:
        self.refused += 1
        if not self._said:
            self._said = True
            log.warning("run %s: %s: not derived (counted; said once per run)", self.run_id, why)
