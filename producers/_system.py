"""System metrics (seed 004's System/* group) and heartbeats, sampled on a thread of their own."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

from ._nvml import Nvml

log = logging.getLogger("metricbus.producer")
_GB = 1024**3


_NVML = Nvml()


def sample_system() -> dict[str, float]:
    """One sample of CPU, memory, GPU memory and utilisation.

    GPUs through NVML when nvidia-ml-py is installed (any process), else torch's CUDA figures
    when torch already uses CUDA.
    """
    import psutil

    vm = psutil.virtual_memory()
    out = {
        "System/CPU_Percent": psutil.cpu_percent(interval=None),
        "System/Memory_Percent": vm.percent,
        "System/Memory_Used_GB": (vm.total - vm.available) / _GB,
        "System/Memory_Available_GB": vm.available / _GB,
        "System/Process_Memory_GB": psutil.Process().memory_info().rss / _GB,
    }
    out.update(_NVML.sample() or _gpu())
    return out


def _gpu() -> dict[str, float]:
    torch = sys.modules.get("torch")  # never import torch for this: only report what is in use
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        free, total = torch.cuda.mem_get_info()
        out = {
            "System/GPU_Memory_Used_GB": (total - free) / _GB,
            "System/GPU_Memory_Total_GB": total / _GB,
            "System/GPU_Memory_Percent": 100.0 * (total - free) / total,
        }
        try:
            out["System/GPU_Utilization"] = float(torch.cuda.utilization())
        except Exception:  # noqa: BLE001 - needs NVML (pynvml); memory figures still stand
            log.debug("GPU utilisation unavailable (needs pynvml)", exc_info=True)
        return out
    except Exception:  # noqa: BLE001 - a broken driver must not break the training job
        log.debug("GPU sampling failed", exc_info=True)
        return {}


class SystemSampler:
    """Calls ``emit(sample)`` every ``interval_s``; stop() joins in bounded time."""

    def __init__(
        self,
        interval_s: float,
        emit: Callable[[dict[str, float]], None],
        sample: Callable[[], dict[str, float]] = sample_system,
    ) -> None:
        self.interval_s = interval_s
        self._emit = emit
        self._sample = sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metricbus-system-sampler", daemon=True)

    def start(self) -> None:
        """Start sampling (the first sample primes psutil's CPU counter)."""
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop and join; idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            self._sample()  # cpu_percent's first reading is meaningless; prime it
        except Exception:  # noqa: BLE001
            log.warning("system metrics are unavailable", exc_info=True)
            return
        while not self._stop.wait(self.interval_s):
            try:
                self._emit(self._sample())
            except Exception:  # noqa: BLE001 - sampling must never hurt the run
                log.debug("system sample failed", exc_info=True)
