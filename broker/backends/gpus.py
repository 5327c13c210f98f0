"""Which GPUs this machine has: NVIDIA GPUs through NVML (ctypes, no CUDA), or numbered virtual ones.

NVML is loaded from libnvidia-ml.so.1 at call time; a machine without the driver, or any NVML
failure, yields no GPUs rather than an error, so the broker still serves CPU pools.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

from broker.ports.backend import Device

log = logging.getLogger(__name__)

VIRTUAL_MODEL = "virtual"
VIRTUAL_MEMORY_MB = 143_771
"""The framebuffer a virtual GPU declares (an H200's 141 GB), so jobs get HAMi memory limits as on a real card."""
_NVML_SUCCESS = 0
_BUFFER = 96


@dataclass(frozen=True)
class Gpu:
    """A GPU as the local backend binds it: the port's `Device` plus its /dev/nvidiaN minor number."""

    device: Device
    minor: int | None
    """None for virtual GPUs (nothing to bind into a sandbox)."""

    @property
    def virtual(self) -> bool:
        return self.minor is None


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def virtual_gpus(count: int) -> list[Gpu]:
    """`count` stand-in GPUs keyed `virtual-gpu-<i>`, for machines without one."""
    return [Gpu(Device(key=f"virtual-gpu-{i}", index=i, model=VIRTUAL_MODEL, memory_mb=VIRTUAL_MEMORY_MB), None)
            for i in range(count)]


def nvml_gpus(library: str = "libnvidia-ml.so.1") -> list[Gpu]:
    """The NVIDIA GPUs NVML reports, keyed by UUID; [] without a driver or on any NVML error."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return []
    try:
        return _query(nvml)
    except (OSError, AttributeError) as exc:
        log.warning("NVML is present but failed (%s); no GPUs will be offered", exc)
        return []


def _query(nvml: ctypes.CDLL) -> list[Gpu]:
    def check(result: int, call: str) -> None:
        if result != _NVML_SUCCESS:
            raise OSError(f"{call} returned NVML error {result}")

    check(nvml.nvmlInit_v2(), "nvmlInit_v2")
    try:
        count = ctypes.c_uint(0)
        check(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            check(nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex_v2")
            uuid = ctypes.create_string_buffer(_BUFFER)
            check(nvml.nvmlDeviceGetUUID(handle, uuid, _BUFFER), "nvmlDeviceGetUUID")
            name = ctypes.create_string_buffer(_BUFFER)
            check(nvml.nvmlDeviceGetName(handle, name, _BUFFER), "nvmlDeviceGetName")
            memory = _Memory()
            memory_mb = 0
            if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == _NVML_SUCCESS:
                memory_mb = memory.total // (1 << 20)
            minor = ctypes.c_uint(0)
            check(nvml.nvmlDeviceGetMinorNumber(handle, ctypes.byref(minor)), "nvmlDeviceGetMinorNumber")
            device = Device(key=uuid.value.decode(), index=index, model=name.value.decode(), memory_mb=memory_mb)
            gpus.append(Gpu(device, minor.value))
        return gpus
    finally:
        nvml.nvmlShutdown()


def discover(virtual: int | None = None) -> list[Gpu]:
    """Virtual GPUs when `virtual` is given (tests, laptops), else whatever NVML finds."""
    if virtual is not None:
        return virtual_gpus(virtual)
    return nvml_gpus()
