"""Which GPUs this machine has: NVIDIA GPUs through NVML (`nvidia-ml-py`, no CUDA), or numbered virtual ones.

NVML is loaded at call time; a machine without the driver or library (NVMLError, or pynvml not
installed), or any NVML failure, yields no GPUs rather than an error, so the broker still serves
CPU pools.
"""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from broker.fleet.nodes import Node
from broker.health.gpuhealth import GpuHealth
from broker.ports.backend import DOMAIN_LABEL, NODE_LABEL, Device, split_nodes

log = logging.getLogger(__name__)

VIRTUAL_MODEL = "virtual"
VIRTUAL_MEMORY_MB = 143_771
"""The framebuffer a virtual GPU declares (an H200's 141 GB), so jobs get HAMi memory limits as on a real card."""


@dataclass(frozen=True)
class Gpu:
    """A GPU as the local backend binds it: the port's `Device` plus its /dev/nvidiaN minor number."""

    device: Device
    minor: int | None
    """None for virtual GPUs (nothing to bind into a sandbox)."""

    @property
    def virtual(self) -> bool:
        return self.minor is None


class Nvml(Protocol):
    """The part of `pynvml` read here; tests pass a fake with the same names."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, ...]: ...


def virtual_gpus(count: int) -> list[Gpu]:
    """`count` stand-in GPUs keyed `virtual-gpu-<i>`, for machines without one."""
    return [Gpu(Device(key=f"virtual-gpu-{i}", index=i, model=VIRTUAL_MODEL, memory_mb=VIRTUAL_MEMORY_MB), None)
            for i in range(count)]


def load_nvml() -> Nvml | None:
    """The installed `pynvml` module, or None when nvidia-ml-py is missing."""
    try:
        return cast(Nvml, importlib.import_module("pynvml"))
    except ImportError:
        return None


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str since 11.515; older releases returned bytes.
    return value.decode() if isinstance(value, bytes) else value


def nvml_gpus(nvml: Nvml | None = None) -> list[Gpu]:
    """The NVIDIA GPUs NVML reports, keyed by UUID; [] without a driver or on any NVML error."""
    nvml = nvml if nvml is not None else load_nvml()
    if nvml is None:
        return []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # The usual case on a machine without NVIDIA GPUs (library not found, driver not loaded).
        log.debug("NVML unavailable (%s); no GPUs will be offered", exc)
        return []
    try:
        return _query(nvml)
    except nvml.NVMLError as exc:
        log.warning("NVML is present but failed (%s); no GPUs will be offered", exc)
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)


def _query(nvml: Nvml) -> list[Gpu]:
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
        except nvml.NVMLError:
            memory_mb = 0  # the card is still usable; only HAMi memory limits need the size
        device = Device(key=_text(nvml.nvmlDeviceGetUUID(handle)), index=index,
                        model=_text(nvml.nvmlDeviceGetName(handle)), memory_mb=memory_mb)
        gpus.append(Gpu(device, nvml.nvmlDeviceGetMinorNumber(handle)))
    return gpus


def discover(virtual: int | None = None) -> list[Gpu]:
    """Virtual GPUs when `virtual` is given (tests, laptops), else whatever NVML finds."""
    if virtual is not None:
        return virtual_gpus(virtual)
    return nvml_gpus()


def boot_id() -> str:
    """This host's boot id (a new one after every reboot: the node's epoch, design R5); empty if unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def local_nodes(devices: Sequence[Device], per_node: int | None, *, virtual: bool) -> list[Node]:
    """This host's GPUs as nodes: virtual GPUs split into `virtual-node-<i>` of `per_node` each (one node
    when None), all in one domain; real GPUs are one node named after the host. Each carries the boot id."""
    epoch = boot_id()
    if virtual:
        return split_nodes(devices, per_node, "virtual-node", epoch=epoch)
    host = socket.gethostname() or "local"
    return [Node(id=host, gpus=n.gpus, model=n.model, domain=n.domain, boot_epoch=epoch,
                 labels={NODE_LABEL: host, DOMAIN_LABEL: n.domain})
            for n in split_nodes(devices, None, host, epoch=epoch)]
UNCORRECTED = 1
VOLATILE = 0
"""NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC."""


def read_health(keys: Sequence[str], nvml: Nvml | None = None) -> dict[str, GpuHealth]:
    """NVML's health of these GPUs (by UUID); a key NVML cannot read (a virtual GPU, no driver) is left out.

    A card without ECC or row remapping (NVMLError_NotSupported) reads as healthy in that respect."""
    cards = [k for k in keys if k.startswith("GPU-")]
    nvml = nvml if nvml is not None else (load_nvml() if cards else None)
    if nvml is None or not cards:
        return {}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return {}
    out: dict[str, GpuHealth] = {}
    try:
        for key in cards:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(key)
            except nvml.NVMLError:
                continue
            out[key] = _card_health(nvml, handle)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)
    return out


def _card_health(nvml: Nvml, handle: Any) -> GpuHealth:
    def optional(read: Callable[[], int]) -> int:
        try:
            return read()
        except nvml.NVMLError:  # not supported on this card: healthy in that respect
            return 0

    return GpuHealth(
        ecc_uncorrected=optional(lambda: int(nvml.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, VOLATILE))),
        retired_pages_pending=bool(optional(lambda: int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)))),
        remap_failed=bool(optional(lambda: int(nvml.nvmlDeviceGetRemappedRows(handle)[3]))))
