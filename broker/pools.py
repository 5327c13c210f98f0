"""The pool catalog: one `PoolSpec` per hardware pool, loaded strictly from YAML at start.

Unknown keys are an error, so a typo'd knob fails the start instead of silently using a default.
With no catalog the broker serves a `cpu` pool and, when GPUs exist (NVML or --virtual-gpus), a `gpu` pool.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REUSE_TAG_MODES = ("boundary", "hint")
KERNEL_MODES = ("auto", "prestart", "learned", "cold")


class CatalogError(ValueError):
    """The catalog is malformed; the message names the pool and key."""


@dataclass(frozen=True)
class PoolSpec:
    """One hardware pool (SKU) and its warmth knobs."""

    name: str
    gpus: int = 0
    """GPUs per pod; 0 for CPU pools."""
    accelerator: str = "cpu"
    """The budget ledger this pool draws from (a GPU model, or `cpu`)."""
    cpus: float = 1.0
    """CPU cores per pod (the unit of CPU budgets)."""
    min_count: int = 0
    """Floor: pods kept ready at zero demand."""
    max_idle_count: int = 2
    """Idle cap: unheld idle pods kept past their keep-alive; retains, never pre-creates."""
    max_count: int = 8
    """Ceiling: a hard cap on pods (GPU groups) this pool holds."""
    idle_timeout: float | None = 300.0
    """Keep-alive of an idle pod, seconds; None keeps pods forever (a static pool)."""
    caller_hold_seconds: float | None = None
    """Owner hold after a release; None inherits `idle_timeout`."""
    standbys_per_active: int = 0
    """Zero-VRAM standby pods staged on each active pod's GPU."""
    step: int = 4
    """At most this many pod creations per reconcile pass."""
    reuse_tag: str = "boundary"
    """`boundary`: a new tag retires the old pod after one job; `hint`: the tag only routes."""
    keep_paths: tuple[str, ...] = ()
    """Paths inside the sandbox that reset never wipes (caches)."""
    wipe_paths: tuple[str, ...] = ()
    """Paths inside the sandbox that reset always empties."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment the operator gives every job of the pool (e.g. PIP_INDEX_URL, UV_INDEX_URL for
    requirement installs); the job's own env is applied on top."""
    drain_budget: int = 1
    """Stale pods retired at a time during a template rollout."""
    borrow: bool = False
    """May place warm or burst pods on reserved-but-unused capacity a capacity source publishes."""
    template: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific pod template (image, resources, binds, start delay)."""
    reserve_gangs_after: float | None = 60.0
    """Seconds a gang (a job of several pods) waits before newly idle pods are reserved for it; null: never."""
    kernels: str = "auto"
    """Pre-imported kernel on idle pods: prestart, learned (after a kernel job), cold; auto: learned sans standby."""

    @property
    def hold_seconds(self) -> float:
        hold = self.caller_hold_seconds if self.caller_hold_seconds is not None else self.idle_timeout
        return math.inf if hold is None else hold

    @property
    def keep_alive(self) -> float:
        return math.inf if self.idle_timeout is None else self.idle_timeout

    @property
    def template_hash(self) -> str:
        """Changes when anything that shapes a pod changes; older pods are stale."""
        shape = {"gpus": self.gpus, "accelerator": self.accelerator, "cpus": self.cpus,
                 "template": self.template, "keep": self.keep_paths, "wipe": self.wipe_paths}
        return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CallerLimits:
    """Per-caller caps on what its running jobs may hold at once."""

    max_gpus: int | None = None
    max_pods: int | None = None


@dataclass(frozen=True)
class Catalog:
    pools: Mapping[str, PoolSpec]
    caller_limits: Mapping[str, CallerLimits] = field(default_factory=dict)
    """By caller; the key `default` applies to callers not named."""
    budgets: Mapping[str, float] = field(default_factory=dict)
    """Per accelerator (GPU model or `cpu`): GPUs (cores) all pools together may hold; unnamed is unbounded."""

    def limits_for(self, caller: str) -> CallerLimits:
        return self.caller_limits.get(caller) or self.caller_limits.get("default") or CallerLimits()


_POOL_FIELDS = {f.name: f for f in dataclasses.fields(PoolSpec)}
_TOP_KEYS = {"pools", "caller_limits", "budgets"}
_LIMIT_KEYS = {f.name for f in dataclasses.fields(CallerLimits)}


def _number(pool: str, key: str, value: Any, *, integer: bool, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise CatalogError(f"pool {pool!r}: {key} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if value < 0:
        raise CatalogError(f"pool {pool!r}: {key} must not be negative")
    return value


def parse_pool(raw: Mapping[str, Any]) -> PoolSpec:
    """Build one PoolSpec from a mapping, rejecting unknown keys and wrong types."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"a pool must be a mapping, got {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise CatalogError(f"pool name must be a non-empty [A-Za-z0-9_-] string, got {name!r}")
    unknown = sorted(set(raw) - set(_POOL_FIELDS))
    if unknown:
        raise CatalogError(f"pool {name!r}: unknown key(s) {', '.join(unknown)}")
    values: dict[str, Any] = {"name": name}
    for key, value in raw.items():
        if key == "name":
            continue
        if key in ("gpus", "min_count", "max_idle_count", "max_count", "standbys_per_active", "step", "drain_budget"):
            values[key] = _number(name, key, value, integer=True)
        elif key in ("idle_timeout", "caller_hold_seconds"):
            values[key] = _number(name, key, value, integer=False, allow_none=True)
        elif key == "cpus":
            values[key] = _number(name, key, value, integer=False)
        elif key == "accelerator":
            if not isinstance(value, str) or not value:
                raise CatalogError(f"pool {name!r}: accelerator must be a string")
            values[key] = value
        elif key == "borrow":
            if not isinstance(value, bool):
                raise CatalogError(f"pool {name!r}: borrow must be true or false")
            values[key] = value
        elif key == "reuse_tag":
            if value not in REUSE_TAG_MODES:
                raise CatalogError(f"pool {name!r}: reuse_tag must be one of {REUSE_TAG_MODES}, got {value!r}")
            values[key] = value
        elif key in ("keep_paths", "wipe_paths"):
            if not isinstance(value, list) or not all(isinstance(p, str) and p.startswith("/") for p in value):
                raise CatalogError(f"pool {name!r}: {key} must be a list of absolute paths")
            values[key] = tuple(value)
        elif key == "kernels":
            if value not in KERNEL_MODES:
                raise CatalogError(f"pool {name!r}: kernels must be one of {KERNEL_MODES}, got {value!r}")
            values[key] = value
        elif key == "reserve_gangs_after":
            values[key] = _number(name, key, value, integer=False, allow_none=True)
        elif key == "env":
            if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and k.replace("_", "").isalnum() and isinstance(v, str) for k, v in value.items()):
                raise CatalogError(f"pool {name!r}: env must map variable names to strings")
            values[key] = dict(value)
        elif key == "template":
            if not isinstance(value, Mapping):
                raise CatalogError(f"pool {name!r}: template must be a mapping")
            values[key] = dict(value)
    spec = PoolSpec(**values)
    if "accelerator" not in raw and spec.gpus > 0:
        spec = dataclasses.replace(spec, accelerator="gpu")
    if spec.max_count < spec.min_count:
        raise CatalogError(f"pool {name!r}: max_count {spec.max_count} is below min_count {spec.min_count}")
    if spec.step < 1:
        raise CatalogError(f"pool {name!r}: step must be at least 1")
    return spec


def parse_catalog(raw: Any) -> Catalog:
    """Build a Catalog from parsed YAML (a mapping with `pools` and optional `caller_limits`)."""
    if not isinstance(raw, Mapping):
        raise CatalogError("the catalog must be a mapping with a `pools` list")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise CatalogError(f"unknown top-level key(s) {', '.join(unknown)}")
    pools_raw = raw.get("pools")
    if not isinstance(pools_raw, list) or not pools_raw:
        raise CatalogError("`pools` must be a non-empty list")
    pools: dict[str, PoolSpec] = {}
    for entry in pools_raw:
        spec = parse_pool(entry)
        if spec.name in pools:
            raise CatalogError(f"pool {spec.name!r} is defined twice")
        pools[spec.name] = spec
    limits: dict[str, CallerLimits] = {}
    for caller, entry in (raw.get("caller_limits") or {}).items():
        if not isinstance(entry, Mapping) or set(entry) - _LIMIT_KEYS:
            raise CatalogError(f"caller_limits[{caller!r}]: keys must be among {sorted(_LIMIT_KEYS)}")
        limits[str(caller)] = CallerLimits(**{k: _number(str(caller), k, v, integer=True, allow_none=True)
                                              for k, v in entry.items()})
    budgets_raw = raw.get("budgets") or {}
    if not isinstance(budgets_raw, Mapping):
        raise CatalogError("`budgets` must map an accelerator to a number of GPUs (or CPU cores)")
    budgets = {str(a): float(_number(f"budgets[{a}]", "limit", v, integer=False)) for a, v in budgets_raw.items()}
    return Catalog(pools=pools, caller_limits=limits, budgets=budgets)


def load_catalog(text: str) -> Catalog:
    """Parse catalog YAML text."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"catalog is not valid YAML: {exc}") from exc
    return parse_catalog(raw)


def default_catalog(gpu_count: int, gpu_model: str = "gpu", cpu_pods: int = 16) -> Catalog:
    """The embedded defaults: a `cpu` pool, and a `gpu` pool with one pod per GPU when there are any."""
    pools: dict[str, PoolSpec] = {
        "cpu": PoolSpec(name="cpu", gpus=0, accelerator="cpu", max_count=cpu_pods, max_idle_count=4,
                        idle_timeout=300.0, caller_hold_seconds=300.0, step=8),
    }
    if gpu_count > 0:
        pools["gpu"] = PoolSpec(name="gpu", gpus=1, accelerator=gpu_model, max_count=gpu_count,
                                max_idle_count=gpu_count, idle_timeout=300.0, caller_hold_seconds=300.0,
                                step=gpu_count)
    return Catalog(pools=pools)
