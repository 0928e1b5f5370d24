"""GPU utilisation and memory through NVML (``nvidia-ml-py``, the ``gpu`` extra), for any process.

torch's CUDA figures only exist in a process that uses torch; JAX, vLLM or a data loader on a
GPU box get them here. Devices: the process's ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs), else
every GPU; with ``LOCAL_RANK`` set (one rank per GPU under torchrun) only that one of them.
Seed 004's ``System/GPU_Utilization`` and ``System/GPU_Memory_Percent`` are over those devices
(mean utilisation, memory used over memory total); with several devices each also gets
``System/GPU<i>_Utilization`` and ``System/GPU<i>_Memory_Percent``. Without the library or a
driver nothing is reported, said once at debug level.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("metricbus.producer")
_GB = 1024**3


class Nvml:
    """Opened once per process; ``sample()`` reads the devices (a few µs each)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] | None = None
        self._failed = False

    def _open(self) -> list[tuple[int, Any]]:
        if self._handles is not None:
            return self._handles
        nvml = self._nvml
        if nvml is None:
            import pynvml  # nvidia-ml-py

            nvml = pynvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        indices: list[int | str] = list(range(count))
        if visible is not None:
            indices = [int(v) if v.strip().isdigit() else v.strip() for v in visible.split(",") if v.strip()]
        handles = []
        for i in indices:
            if isinstance(i, int):
                if i < count:
                    handles.append(nvml.nvmlDeviceGetHandleByIndex(i))
            else:
                handles.append(nvml.nvmlDeviceGetHandleByUUID(i))
        numbered = list(enumerate(handles))
        local = os.environ.get("LOCAL_RANK")
        if local is not None and local.isdigit() and int(local) < len(numbered):
            numbered = [numbered[int(local)]]
        self._nvml, self._handles = nvml, numbered
        return numbered

    def sample(self) -> dict[str, float]:
        """Utilisation and memory of this process's GPUs; {} without NVML."""
        if self._failed:
            return {}
        try:
            handles = self._open()
            nvml = self._nvml
            util, used, total = [], [], []
            for _, h in handles:
                util.append(float(nvml.nvmlDeviceGetUtilizationRates(h).gpu))
                memory = nvml.nvmlDeviceGetMemoryInfo(h)
                used.append(float(memory.used))
                total.append(float(memory.total))
        except Exception as exc:  # noqa: BLE001 - no library, no driver, a lost GPU: never the loop's problem
            self._failed = True
            log.debug("GPU metrics through NVML are unavailable: %s", exc)
            return {}
        if not handles or not sum(total):
            return {}
        out = {
            "System/GPU_Utilization": sum(util) / len(util),
            "System/GPU_Memory_Used_GB": sum(used) / _GB,
            "System/GPU_Memory_Total_GB": sum(total) / _GB,
            "System/GPU_Memory_Percent": 100.0 * sum(used) / sum(total),
        }
        if len(handles) > 1:
            for (i, _), u, m, t in zip(handles, util, used, total, strict=True):
                out[f"System/GPU{i}_Utilization"] = u
                out[f"System/GPU{i}_Memory_Percent"] = 100.0 * m / t if t else 0.0
        return out
