"""GPU metrics through NVML: the real library on this machine, and the device logic on a stand-in."""

import types

import pytest

from metricbus.producers._nvml import Nvml
from metricbus.producers._system import sample_system

_GB = 1024**3


def test_the_real_library_reports_this_machines_gpus_or_nothing():
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is the gpu extra; `make test` installs it")
    try:
        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        gpus = 0  # no driver here (the CI machines): nothing reported, nothing raised
    sample = Nvml().sample()
    if gpus:
        assert 0 <= sample["System/GPU_Utilization"] <= 100
        assert 0 < sample["System/GPU_Memory_Total_GB"]
    else:
        assert sample == {}
    system = sample_system()
    assert "System/CPU_Percent" in system and ("System/GPU_Utilization" in system) == bool(gpus)


class StandIn:
    """The few NVML calls metricbus makes, over made-up devices (index -> (util %, used, total))."""

    def __init__(self, devices):
        self.devices = devices
        self.reads = 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetUtilizationRates(self, h):
        self.reads += 1
        if self.devices[h] is None:
            raise RuntimeError("GPU is lost")
        return types.SimpleNamespace(gpu=self.devices[h][0])

    def nvmlDeviceGetMemoryInfo(self, h):
        util, used, total = self.devices[h]
        return types.SimpleNamespace(used=used * _GB, total=total * _GB)


def test_visible_devices_are_aggregated_under_seed_004s_names_and_each_is_named(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-0")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    nvml = StandIn({0: (90.0, 30.0, 80.0), 1: (0.0, 0.0, 80.0), 2: (10.0, 10.0, 40.0)})
    sample = Nvml(nvml).sample()
    assert sample["System/GPU_Utilization"] == 50.0  # devices 2 and 0, the process's own
    assert sample["System/GPU_Memory_Percent"] == pytest.approx(100 * 40 / 120)
    assert sample["System/GPU_Memory_Total_GB"] == pytest.approx(120)
    assert sample["System/GPU0_Utilization"] == 10.0 and sample["System/GPU1_Utilization"] == 90.0


def test_local_rank_picks_its_own_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    sample = Nvml(StandIn({0: (90.0, 30.0, 80.0), 1: (20.0, 8.0, 80.0)})).sample()
    assert sample["System/GPU_Utilization"] == 20.0 and sample["System/GPU_Memory_Percent"] == 10.0
    assert "System/GPU1_Utilization" not in sample


def test_a_failing_gpu_stops_sampling_quietly(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    nvml = StandIn({0: None})
    probe = Nvml(nvml)
    assert probe.sample() == {} and probe.sample() == {}
    assert nvml.reads == 1  # tried once, then left alone
