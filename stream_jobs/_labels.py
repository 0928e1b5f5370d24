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
        #: name -> the series' point at the step being fed (flushed when the step changes)
        self._pending: dict[str, tuple[str, str, str, int, int | None, float, int]] = {}
        self._pending_step: int | None = None
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
    ) -> list[tuple[str, str, str, int, int | None, float, int]]:
        """Fold in one labelled event; the points of the step before, once this one has another.

        ``(name, source, kind, step, epoch, value, ts)``: each series fed at a step gets one point
        there, its value after the step's last event (several episodes often end at one step);
        the events alone decide it, not how they were batched. :meth:`flush` gives the last step's.

        ``room``: how many new series the run may still derive (its ``max_series``, which label
        series count toward: one event of 10,000 scalars under 8 labels made 80,000 of them).
        """
        out = self.flush() if step != self._pending_step else []
        self._pending_step = step
        pending = self._pending
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
                if len(window):
                    name = f"by_{key}/{value}/{metric}_recent_mean"
                    pending[name] = (name, metric, "label_mean", step, epoch, window.mean(), ts)
            recent = self._recent[key]
            recent.append(value)
            counts = collections.Counter(recent)
            for v in values:
                name = f"by_{key}/{v}/share"
                pending[name] = (name, key, "label_share", step, epoch, counts[v] / len(recent), ts)
        return out

    def flush(self) -> list[tuple[str, str, str, int, int | None, float, int]]:
        """The points of the step being fed (at the run's end, or when the next step begins)."""
        out = list(self._pending.values())
        self._pending.clear()
        return out

    def series(self) -> int:
        """How many series this run derives from labels (each ~1.1 kB of the worker's state)."""
        return len(self._windows)

    def _refuse(self, why: str) -> None:
        self.refused += 1
        if not self._said:
            self._said = True
            log.warning("run %s: %s: not derived (counted; said once per run)", self.run_id, why)
