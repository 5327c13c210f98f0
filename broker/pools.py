"""The pool catalog: one `PoolSpec` per hardware pool, loaded strictly from YAML at start.

The dataclasses below are the schema: pydantic validates the YAML against them (one annotated field
and a one-line doc per knob). Unknown keys are an error, so a typo'd knob fails the start instead of
silently using a default; every problem is one `CatalogError` naming the file and the key path.
With no catalog the broker serves a `cpu` pool and, when GPUs exist (NVML or --virtual-gpus), a `gpu` pool.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
)

from broker.fleet.quotas import QuotaProblem, QuotasSpec
from broker.fleet.quotas import check as check_quotas
from broker.podtemplate import check_template, check_volumes
from broker.startmodel import from_template as venue_delay_of

ReuseTag = Literal["boundary", "hint", "retire"]
REUSE_TAG_MODES: tuple[str, ...] = get_args(ReuseTag)
KernelMode = Literal["auto", "prestart", "learned", "cold"]
Topology = Literal["node", "domain", "any"]
"""Where a job's pods may be: on one node, within one topology domain, anywhere (broker.fleet.placement)."""

# Strict: YAML `"1"`, `1.5` or `true` is not a count, `"3"` or `true` not a number of seconds.
Count = Annotated[int, Strict(), Field(ge=0)]
Number = Annotated[float, Strict(), Field(ge=0)]
Flag = Annotated[bool, Strict()]
Key = Annotated[str, BeforeValidator(lambda key: str(key) if isinstance(key, int | float) else key)]
"""A caller or accelerator name; YAML reads `1:` as a number."""


def _pool_name(name: str) -> str:
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"pool name must be a non-empty [A-Za-z0-9_-] string, got {name!r}")
    return name


def _absolute_paths(paths: tuple[str, ...]) -> tuple[str, ...]:
    if not all(p.startswith("/") for p in paths):
        raise ValueError(f"must be a list of absolute paths, got {list(paths)!r}")
    return paths


def _variable_names(env: Mapping[str, str]) -> Mapping[str, str]:
    if not all(k.replace("_", "").isalnum() for k in env):
        raise ValueError(f"must map variable names to strings, got keys {sorted(env)!r}")
    return env


def _template(template: Mapping[str, Any]) -> Mapping[str, Any]:
    # A bad `venue_delay` (the modelled cold start, broker.startmodel) or pod value (`memory: 256Potatoes`,
    # broker.podtemplate, checked with the pool's name in _checked) would otherwise surface only when a pod
    # starts, and the pool's jobs would wait for ever; the catalog refuses it with its key path instead.
    venue_delay_of(template)
    return template


LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
"""A Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters."""


def _label_key(key: str) -> str:
    if not LABEL_KEY.match(key):
        raise ValueError(f"{key!r} is not a Kubernetes label key (prefix/name, e.g. topology.kubernetes.io/zone)")
    return key


Paths = Annotated[tuple[str, ...], AfterValidator(_absolute_paths)]


class CatalogError(ValueError):
    """The catalog is malformed; the message names the file (or pool) and the key path."""


@dataclass(frozen=True)
class PoolSpec:
    """One hardware pool (SKU) and its warmth knobs."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    name: Annotated[str, Strict(), AfterValidator(_pool_name)]
    gpus: Count = 0
    """GPUs per pod; 0 for CPU pools."""
    accelerator: Annotated[str, Strict(), Field(min_length=1)] = "cpu"
    """The budget ledger this pool draws from (a GPU model, or `cpu`)."""
    cpus: Number = 1.0
    """CPU cores per pod (the unit of CPU budgets)."""
    min_count: Count = 0
    """Floor: pods kept ready at zero demand."""
    max_idle_count: Count = 2
    """Idle cap: unheld idle pods kept past their keep-alive; retains, never pre-creates."""
    max_count: Count = 8
    """Ceiling: a hard cap on pods (GPU groups) this pool holds."""
    idle_timeout: Number | None = 300.0
    """Keep-alive of an idle pod, seconds; None keeps pods forever (a static pool)."""
    caller_hold_seconds: Number | None = None
    """Owner hold after a release; None inherits `idle_timeout`."""
    standbys_per_active: Count = 0
    """Zero-VRAM standby pods staged on each active pod's GPU."""
    step: Annotated[int, Strict(), Field(ge=1)] = 4
    """At most this many pod creations per reconcile pass."""
    reuse_tag: ReuseTag = "boundary"
    """`boundary`: a new tag empties the caller's pod, which then serves the new session; `hint`: the tag
    only routes (the workspace survives it); `retire`: the paper's rule, one job on the old pod, then it retires."""
    keep_paths: Paths = ()
    """Paths inside the sandbox that reset never wipes (caches), kept per caller (docs/security.md)."""
    shared_paths: Paths = ()
    """Read-only caches shared by every caller of the pool, filled only by the operator on the host
    (`firepool cache dir POOL PATH` names the directory); no job can write them."""
    wipe_paths: Paths = ()
    """Paths inside the sandbox that reset always empties."""
    env: Annotated[Mapping[str, str], AfterValidator(_variable_names)] = field(default_factory=dict)
    """Environment the operator gives every job of the pool (e.g. PIP_INDEX_URL, UV_INDEX_URL for
    requirement installs); the job's own env is applied on top."""
    drain_budget: Count = 1
    """Stale pods retired at a time during a template rollout."""
    borrow: Flag = False
    """May place warm or burst pods on reserved-but-unused capacity a capacity source publishes."""
    template: Annotated[Mapping[str, Any], AfterValidator(_template)] = field(default_factory=dict)
    """Backend-specific pod template (image, resources, binds, start delay)."""
    reserve_gangs_after: Number | None = 60.0
    """Seconds a gang (a job of several pods) waits before newly idle pods are reserved for it; null: never."""
    reservation_alert_after: Number | None = 14400.0
    """Seconds a gang's reservation may stay short of pods before a `reservation.alert` capacity event says the
    pool cannot host it (R2's starvation guard, 4 h); null: never."""
    kernels: KernelMode = "auto"
    """Pre-imported kernel on idle non-standby pods: prestart (always), learned (while the pool serves kernel
    jobs: learned per pool, forgotten after its keep-alive), cold (never); auto: learned."""
    topology: Topology = "any"
    """Default for the pool's jobs: `node` keeps a job's pods on one node, `domain` in one topology domain,
    `any` prefers one node (docs/fleet.md)."""
    node_selector: Mapping[str, Key] = field(default_factory=dict)
    """Node labels a node must carry for this pool's pods (shape segregation: a node set for sub-node shapes)."""
    images: tuple[Annotated[str, Strict(), Field(min_length=1)], ...] = ()
    """Custom images a job of this pool may name (`image`): shell globs over the whole reference, e.g.
    `registry.example/team/*`; empty allows none. A mutable tag runs on a single-use pod; a digest-pinned
    image's pod serves only its caller's jobs of that image (broker.images)."""
    max_output_bytes: Annotated[int, Strict(), Field(ge=4096, le=1 << 40)] = 64 << 20
    """Bytes kept per stream (combined, stdout, stderr) of an attempt; past it the log ends with a marker line and
    the rest is dropped, in the pod and again in the broker's log store (docs/security.md, "Output budget")."""

    @property
    def hold_seconds(self) -> float:
        hold = self.caller_hold_seconds if self.caller_hold_seconds is not None else self.idle_timeout
        return math.inf if hold is None else hold

    @property
    def keep_alive(self) -> float:
        return math.inf if self.idle_timeout is None else self.idle_timeout

    @functools.cached_property
    def template_hash(self) -> str:
        """Changes when anything that shapes a pod changes; older pods are stale. Computed once per spec
        (the spec is frozen; a catalog change makes a new one): every reconcile pass reads it per pod."""
        shape = {"gpus": self.gpus, "accelerator": self.accelerator, "cpus": self.cpus,
                 "template": self.template, "keep": self.keep_paths, "wipe": self.wipe_paths}
        if self.shared_paths:  # only when set: adding the knob leaves existing pods current
            shape["shared"] = self.shared_paths
        return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CallerLimits:
    """Per-caller caps on what its running jobs may hold at once."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    max_gpus: Count | None = None
    max_pods: Count | None = None


@dataclass(frozen=True)
class CreateRate:
    """Client-side pacing of this broker's pod creates (the kubernetes backend; 429s are retried too)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    qps: Annotated[float, Strict(), Field(gt=0)] = 20.0
    """Creates per second, sustained."""
    burst: Annotated[int, Strict(), Field(ge=1)] = 40
    """Creates at once after a quiet spell."""


@dataclass(frozen=True)
class QuarantineSettings:
    """When a failing GPU or node stops getting pods (design §8; broker.health.quarantine)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    threshold: Annotated[int, Strict(), Field(ge=1)] = 3
    """Hardware-class failures (Xid, ECC, NVML health, refused launches) of one device that quarantine it."""
    node_threshold: Annotated[int, Strict(), Field(ge=1)] = 2
    """Quarantined devices on one node that quarantine the whole node (the node is at fault, not a card)."""
    free_requeues: Annotated[int, Strict(), Field(ge=0)] = 3
    """Re-queues after a hardware fault that do not count against a job's max_retries."""


@dataclass(frozen=True)
class Catalog:
    pools: Mapping[str, PoolSpec]
    caller_limits: Mapping[str, CallerLimits] = field(default_factory=dict)
    """By caller; the key `default` applies to callers not named."""
    budgets: Mapping[str, float] = field(default_factory=dict)
    """Per accelerator (GPU model or `cpu`): GPUs (cores) all pools together may hold; unnamed is unbounded."""
    create_rate: CreateRate = CreateRate()
    """How fast the broker may create pods (a cluster's API server is shared)."""
    quotas: QuotasSpec | None = None
    """Team quotas with borrowing and preemption (docs/quotas.md); None: no quotas, nothing is preempted."""
    quarantine: QuarantineSettings = QuarantineSettings()
    topology_domain_labels: tuple[str, ...] | None = None
    """Node labels whose value is a node's topology domain, first set wins (the kubernetes backend reads its
    Node objects' labels); None: the backend's default (`firepool.io/topology-domain`, then
    `topology.kubernetes.io/zone`)."""

    def limits_for(self, caller: str) -> CallerLimits:
        return self.caller_limits.get(caller) or self.caller_limits.get("default") or CallerLimits()


class _CatalogFile(BaseModel):
    """The catalog file's top level."""

    model_config = ConfigDict(extra="forbid")

    pools: Annotated[list[PoolSpec], Field(min_length=1)]
    caller_limits: dict[Key, CallerLimits] | None = None
    budgets: dict[Key, Number] | None = None
    create_rate: CreateRate | None = None
    quotas: QuotasSpec | None = None
    quarantine: QuarantineSettings | None = None
    topology_domain_labels: Annotated[tuple[Annotated[str, AfterValidator(_label_key)], ...],
                                      Field(min_length=1)] | None = None


@functools.cache
def _catalog_adapter() -> TypeAdapter[_CatalogFile]:
    return TypeAdapter(_CatalogFile)


@functools.cache
def _pool_adapter() -> TypeAdapter[PoolSpec]:
    return TypeAdapter(PoolSpec)


def _where(loc: tuple[int | str, ...]) -> str:
    """('pools', 0, 'max_count') -> pools[0].max_count"""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _problem(error: Mapping[str, Any]) -> str:
    """One pydantic error in the catalog's own words."""
    kind, given, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return "unknown key"
    if kind in ("missing", "missing_argument"):
        return "is required"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {given!r}"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number, got {given!r}"
    if kind == "greater_than_equal":
        return "must not be negative" if ctx.get("ge") == 0 else f"must be at least {ctx.get('ge')}"
    if kind == "bool_type":
        return "must be true or false"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {given!r}"
    if kind == "string_type":
        return f"must be a string, got {given!r}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "too_short":
        return "must be a non-empty list"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {given!r}"
    if kind in ("dict_type", "mapping_type", "dataclass_type", "model_type", "model_attributes_type"):
        return f"must be a mapping, got {given!r}"
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"])
    return str(error["msg"])


def _catalog_error(source: str, exc: ValidationError) -> CatalogError:
    """Every problem pydantic found, on one line: `pools.yaml: pools[0].max_cout: unknown key; ...`"""
    problems = []
    for error in exc.errors():
        where = _where(tuple(error["loc"]))
        problem = _problem(error)
        # "pools[0].gpus must be an integer" reads as a sentence; "pools[0].max_cout: unknown key" as a label.
        problems.append(f"{where}{' ' if problem.startswith(('must', 'is ')) else ': '}{problem}" if where else problem)
    return CatalogError(f"{source}: {'; '.join(problems)}")


def _checked(spec: PoolSpec, raw: Mapping[str, Any], where: str) -> PoolSpec:
    """The rules across knobs, which a per-field type cannot say."""
    if "accelerator" not in raw and spec.gpus > 0:
        spec = dataclasses.replace(spec, accelerator="gpu")
    if spec.max_count < spec.min_count:
        raise CatalogError(f"{where}: max_count {spec.max_count} is below min_count {spec.min_count}")
    try:  # the pool's own cpus are the template's default: a pool of `cpus: 0` has no CPU to give a pod
        check_template(spec.template, spec.cpus)
        check_volumes(spec.keep_paths, spec.wipe_paths, spec.shared_paths)
    except ValueError as exc:
        raise CatalogError(f"{where if repr(spec.name) in where else f'{where} ({spec.name})'}: {exc}") from None
    return spec


def parse_pool(raw: Mapping[str, Any]) -> PoolSpec:
    """Build one PoolSpec from a mapping, rejecting unknown keys and wrong types."""
    name = raw.get("name") if isinstance(raw, Mapping) else None
    where = f"pool {name!r}" if isinstance(name, str) else "pool"
    try:
        spec = _pool_adapter().validate_python(raw)
    except ValidationError as exc:
        raise _catalog_error(where, exc) from None
    return _checked(spec, raw, where)


def parse_catalog(raw: Any, source: str = "catalog") -> Catalog:
    """Build a Catalog from parsed YAML; `source` (the file) leads every error message."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{source}: the catalog must be a mapping with a `pools` list")
    try:
        parsed = _catalog_adapter().validate_python(raw)
    except ValidationError as exc:
        raise _catalog_error(source, exc) from None
    pools: dict[str, PoolSpec] = {}
    for index, (spec, entry) in enumerate(zip(parsed.pools, raw["pools"], strict=True)):
        spec = _checked(spec, entry, f"{source}: pools[{index}]")
        if spec.name in pools:
            raise CatalogError(f"{source}: pools[{index}].name: pool {spec.name!r} is defined twice")
        pools[spec.name] = spec
    if parsed.quotas is not None:
        try:
            check_quotas(parsed.quotas)
        except QuotaProblem as exc:
            raise CatalogError(f"{source}: quotas.{exc}") from None
    return Catalog(pools=pools, caller_limits=dict(parsed.caller_limits or {}),
                   budgets={a: float(v) for a, v in (parsed.budgets or {}).items()},
                   create_rate=parsed.create_rate or CreateRate(), quotas=parsed.quotas,
                   quarantine=parsed.quarantine or QuarantineSettings(),
                   topology_domain_labels=parsed.topology_domain_labels)


def load_catalog(text: str, source: str = "catalog") -> Catalog:
    """Parse catalog YAML text; `source` names it in errors."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {exc}") from None
    return parse_catalog(raw, source)


def load_catalog_file(path: str | Path) -> Catalog:
    """Read and parse a catalog file; a missing or unreadable file is a CatalogError too."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror or exc}") from None
    return load_catalog(text, str(path))


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
