"""GPU detection: NVML through nvidia-ml-py, no GPUs (never an error) without a driver, virtual GPUs on request."""

from __future__ import annotations

import ctypes.util
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.backends.gpus import VIRTUAL_MODEL, discover, load_nvml, nvml_gpus

GIB = 1 << 30


class FakeNVMLError(Exception):
    pass


@dataclass
class Card:
    uuid: str | bytes
    name: str | bytes
    memory: int
    minor: int


@dataclass
class Memory:
    total: int
    free: int = 0
    used: int = 0


@dataclass
class FakeNvml:
    """pynvml's calls as nvidia-ml-py names them, over a list of cards; `broken` names a call that fails."""

    cards: list[Card]
    init_error: bool = False
    broken: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    NVMLError: type[Exception] = FakeNVMLError

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.broken:
            raise FakeNVMLError(f"{name} failed")

    def nvmlInit(self) -> None:
        self._call("init")
        if self.init_error:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self._call("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("count")
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("handle")
        return self.cards[index]

    def nvmlDeviceGetUUID(self, handle: Card) -> str | bytes:
        self._call("uuid")
        return handle.uuid

    def nvmlDeviceGetName(self, handle: Card) -> str | bytes:
        self._call("name")
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: Card) -> Memory:
        self._call("memory")
        return Memory(handle.memory)

    def nvmlDeviceGetMinorNumber(self, handle: Card) -> int:
        self._call("minor")
        return handle.minor


H200S = [Card("GPU-aaaa", "NVIDIA H200", 141 * GIB, 0), Card(b"GPU-bbbb", b"NVIDIA H200", 141 * GIB, 3)]


def test_nvml_reports_each_gpu_by_index_uuid_name_memory_and_minor() -> None:
    nvml = FakeNvml(H200S)
    gpus = nvml_gpus(nvml)
    assert [(g.device.index, g.device.key, g.device.model, g.device.memory_mb, g.minor) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA H200", 141 * 1024, 0), (1, "GPU-bbbb", "NVIDIA H200", 141 * 1024, 3)]
    assert not any(g.virtual for g in gpus)
    assert nvml.calls[0] == "init" and nvml.calls[-1] == "shutdown"


def test_no_driver_means_no_gpus_and_no_shutdown_of_what_never_started() -> None:
    nvml = FakeNvml(H200S, init_error=True)
    assert nvml_gpus(nvml) == []
    assert nvml.calls == ["init"]


def test_an_nvml_failure_mid_query_offers_no_gpus_warns_and_still_shuts_nvml_down(
        caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(H200S, broken={"uuid"})
    with caplog.at_level(logging.WARNING, logger="broker.backends.gpus"):
        assert nvml_gpus(nvml) == []
    assert "uuid failed" in caplog.text
    assert nvml.calls[-1] == "shutdown"


def test_a_card_whose_memory_cannot_be_read_is_still_offered() -> None:
    gpus = nvml_gpus(FakeNvml(H200S[:1], broken={"memory"}))
    assert [(g.device.key, g.device.memory_mb) for g in gpus] == [("GPU-aaaa", 0)]


def test_a_machine_without_nvidia_ml_py_has_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert load_nvml() is None
    assert nvml_gpus() == []


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has the NVIDIA driver")
def test_the_real_nvml_on_a_machine_without_the_driver_finds_no_gpus() -> None:
    nvml = load_nvml()
    assert nvml is not None, "nvidia-ml-py is a dependency"
    with pytest.raises(nvml.NVMLError):  # the real library-not-found path, not a stand-in
        nvml.nvmlInit()
    assert nvml_gpus() == [] and discover() == []


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is None, reason="needs the NVIDIA driver")
def test_the_real_nvml_on_a_gpu_machine_reports_its_cards() -> None:
    gpus = discover()
    assert gpus, "the driver is here but NVML reported no GPU"
    for i, gpu in enumerate(gpus):
        assert gpu.device.index == i and gpu.device.key.startswith(("GPU-", "MIG-")) and gpu.device.memory_mb > 0
        assert gpu.minor is not None and not gpu.virtual


def test_virtual_gpus_are_numbered_and_bind_nothing() -> None:
    gpus = discover(2)
    assert [(g.device.key, g.device.index, g.device.model) for g in gpus] == [
        ("virtual-gpu-0", 0, VIRTUAL_MODEL), ("virtual-gpu-1", 1, VIRTUAL_MODEL)]
    assert all(g.virtual for g in gpus)
    assert discover(0) == []
