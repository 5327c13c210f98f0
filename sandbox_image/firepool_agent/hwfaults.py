"""Hardware-class failures: is a failed attempt the GPU's fault rather than the job's?

The broker quarantines a device that keeps failing (a property of the hardware, not of the job that
happened to land on it), so the agent must tell the two apart. A failed attempt is a hardware fault when
its stderr names one the driver or CUDA runtime reports for broken hardware (an Xid of the hardware
class, an uncorrectable ECC error, `cudaErrorECCUncorrectable` and its relatives, a GPU that fell off the
bus). Application bugs (Xid 13, 31, 43: the job's own exceptions and faults) are not hardware faults. A
successful attempt is never one, whatever it printed.

The agent never loads NVML itself (a standby runs only the agent and must hold no GPU library); the
GPUs' NVML health is read on the host by the broker (`broker.health.gpuhealth`).
"""

from __future__ import annotations

import re
from pathlib import Path

STDERR_TAIL = 64 << 10
"""How much of the end of stderr is searched."""

HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
"""Xids NVIDIA documents as hardware, memory or interconnect faults (not the application's):
48 double-bit ECC, 61/62 internal micro-controller, 63/64 row remapping, 74 NVLink, 79 fallen off the bus,
92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 unrecovered ECC."""

_XID = re.compile(rb"\bXid\b[^\n:]*?(?:\([^)]*\))?\s*:?\s*(\d{1,3})\b", re.IGNORECASE)
_PATTERNS: tuple[tuple[re.Pattern[bytes], str], ...] = (
    (re.compile(rb"cudaErrorECC\w*|CUDA_ERROR_ECC_\w+"), "ECC error reported by CUDA"),
    (re.compile(rb"uncorrectable ECC error", re.IGNORECASE), "uncorrectable ECC error"),
    (re.compile(rb"GPU has fallen off the bus", re.IGNORECASE), "GPU fell off the bus"),
    (re.compile(rb"cudaErrorHardwareStackError|CUDA_ERROR_HARDWARE_STACK_ERROR"), "GPU hardware stack error"),
    (re.compile(rb"NVLink (?:error|fatal)", re.IGNORECASE), "NVLink error"),
)


def classify(stderr_tail: bytes, exit_code: int | None) -> str | None:
    """Why a finished attempt failed on hardware, or None when it did not (or it did not fail)."""
    if exit_code in (0, None):
        return None
    for match in _XID.finditer(stderr_tail):
        xid = int(match.group(1))
        if xid in HARDWARE_XIDS:
            return f"Xid {xid} (hardware)"
    for pattern, why in _PATTERNS:
        if pattern.search(stderr_tail):
            return why
    return None


def read_tail(path: Path, size: int = STDERR_TAIL) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read()
    except OSError:
        return b""
