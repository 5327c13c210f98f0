"""Per-accelerator budgets: GPUs (or CPU cores) reserved in an in-memory ledger before any pod is created.

Every pool drawing on one accelerator (a GPU model, or `cpu`) shares its ledger entry, so a 1-GPU and
an 8-GPU pool together never hold more than the limit. `reserve` checks and records under the ledger's
own small lock, so concurrent reconcilers never overshoot; a pod's reservation is released when the
backend deleted it (or its create failed). The same class holds borrowed capacity, whose limits a
capacity source lowers and raises at run time (a lowered limit may sit below what is in use until
borrowed pods are preempted; `reserve` refuses meanwhile).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from broker.pools import PoolSpec


def units_of(spec: PoolSpec) -> float:
    """What one pod of a pool draws from its accelerator's budget: its GPUs, or its CPU cores."""
    return float(spec.gpus) if spec.gpus > 0 else float(spec.cpus)


@dataclass(frozen=True)
class Reservation:
    """One pod's draw on a ledger."""

    pod: str
    accelerator: str
    units: float


class Ledger:
    """Limits and reservations by accelerator; an accelerator without a limit is unbounded."""

    def __init__(self, limits: Mapping[str, float] | None = None) -> None:
        self._lock = threading.Lock()
        self._limits: dict[str, float] = dict(limits or {})
        self._used: dict[str, float] = {}
        self._by_pod: dict[str, Reservation] = {}
        self.peak: dict[str, float] = {}
        """Highest use ever recorded per accelerator (tests check it never passed the limit)."""

    def reserve(self, pod: str, accelerator: str, units: float) -> bool:
        """Record `units` for `pod` if they fit under the limit; False (and nothing recorded) if not."""
        with self._lock:
            if pod in self._by_pod:
                return True
            used = self._used.get(accelerator, 0.0) + units
            limit = self._limits.get(accelerator)
            if limit is not None and used > limit + 1e-9:
                return False
            self._record(Reservation(pod, accelerator, units), used)
            return True

    def adopt(self, pod: str, accelerator: str, units: float) -> None:
        """Record a pod that exists already (recovered after a restart), even past the limit."""
        with self._lock:
            if pod not in self._by_pod:
                self._record(Reservation(pod, accelerator, units), self._used.get(accelerator, 0.0) + units)

    def release(self, pod: str) -> Reservation | None:
        """Give back a pod's reservation (it was deleted, or never created)."""
        with self._lock:
            r = self._by_pod.pop(pod, None)
            if r is not None:
                self._used[r.accelerator] = max(0.0, self._used.get(r.accelerator, 0.0) - r.units)
            return r

    def holds(self, pod: str) -> bool:
        return pod in self._by_pod

    def reservation(self, pod: str) -> Reservation | None:
        return self._by_pod.get(pod)

    def pods(self) -> list[str]:
        with self._lock:
            return list(self._by_pod)

    def set_limit(self, accelerator: str, limit: float | None) -> None:
        """Change (or with None, remove) an accelerator's limit."""
        with self._lock:
            if limit is None:
                self._limits.pop(accelerator, None)
            else:
                self._limits[accelerator] = limit

    def limit(self, accelerator: str) -> float | None:
        return self._limits.get(accelerator)

    def used(self, accelerator: str) -> float:
        return self._used.get(accelerator, 0.0)

    def available(self, accelerator: str) -> float | None:
        """Units still free under the limit; None when unbounded."""
        with self._lock:
            limit = self._limits.get(accelerator)
            return None if limit is None else max(0.0, limit - self._used.get(accelerator, 0.0))

    def pods_fit(self, accelerator: str, units_per_pod: float) -> int | None:
        """Whole pods of `units_per_pod` that still fit; None when unbounded."""
        free = self.available(accelerator)
        if free is None:
            return None
        return int(free // units_per_pod + 1e-9) if units_per_pod > 0 else None

    def view(self) -> dict[str, dict[str, float | None]]:
        with self._lock:
            names = sorted(set(self._limits) | set(self._used))
            return {a: {"limit": self._limits.get(a), "used": self._used.get(a, 0.0)} for a in names}

    def _record(self, r: Reservation, used: float) -> None:
        self._by_pod[r.pod] = r
        self._used[r.accelerator] = used
        if used > self.peak.get(r.accelerator, 0.0):
            self.peak[r.accelerator] = used
