"""A GPU's health as NVML reports it, and when a change in it is a hardware fault.

Read on the host by the backend (`broker.backends.gpus.read_health`; never by the pod agent, which must
load no GPU library), after an attempt on the GPU failed. A card whose volatile uncorrected ECC count rose
since the last reading, with pages pending retirement, or with a failed row remap is failing, whatever
the job printed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuHealth:
    ecc_uncorrected: int = 0
    """Volatile uncorrected ECC errors since the driver loaded."""
    retired_pages_pending: bool = False
    remap_failed: bool = False


def worse(before: GpuHealth | None, after: GpuHealth) -> str | None:
    """Why `after` shows a hardware fault that `before` (the last reading) did not; None when it does not."""
    base = before or GpuHealth()
    if after.ecc_uncorrected > base.ecc_uncorrected:
        return f"NVML: {after.ecc_uncorrected - base.ecc_uncorrected} new uncorrectable ECC error(s)"
    if after.remap_failed:
        return "NVML: a row remap failed"
    if after.retired_pages_pending:
        return "NVML: pages pending retirement"
    return None


HealthReader = Callable[[Sequence[str]], Awaitable[Mapping[str, GpuHealth]]]
"""Reads the health of these device keys; keys NVML cannot read (virtual GPUs) are left out."""
