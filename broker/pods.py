"""Pods as the tracker holds them: one slotted record each and one transition table.

"Idle", "held", "eligible" and "physical" are derived from a pod's state and fields, never kept as
parallel lists. `Pod.move` is the only state change; the tracker calls it under its lock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class PodState(enum.Enum):
    # Identity hashing: states are singletons, and Enum's Python-level __hash__ would cost more than a
    # whole claim's dict lookups under the tracker lock.
    __hash__ = object.__hash__

    STARTING = "starting"
    IDLE = "idle"
    ASSIGNED = "assigned"
    RUNNING = "running"
    RESETTING = "resetting"
    RETIRING = "retiring"
    GONE = "gone"


POD_TRANSITIONS: Mapping[PodState, frozenset[PodState]] = {
    PodState.STARTING: frozenset({
        PodState.IDLE,       # the agent answered its first health check
        PodState.RETIRING,   # the start failed or the pool no longer wants it
    }),
    PodState.IDLE: frozenset({
        PodState.ASSIGNED,   # claimed for a job under the tracker lock
        PodState.RETIRING,   # keep-alive or owner hold expired, stale, or hold broken
    }),
    PodState.ASSIGNED: frozenset({
        PodState.RUNNING,    # the job's binding committed; the launch goes out
        PodState.IDLE,       # the commit lost or failed: returned untouched (no user code ran)
        PodState.RETIRING,   # preparing the lease failed: the pod is not trusted again
    }),
    PodState.RUNNING: frozenset({
        PodState.RESETTING,  # the attempt ended; the agent resets the pod
        PodState.RETIRING,   # the pod was lost or became unreachable
    }),
    PodState.RESETTING: frozenset({
        PodState.IDLE,       # reset verified clean: held for its owner
        PodState.RETIRING,   # unclean reset, session boundary crossed, single-use, or stale
    }),
    PodState.RETIRING: frozenset({
        PodState.GONE,       # the backend deleted it
    }),
    PodState.GONE: frozenset(),
}


class Path(enum.StrEnum):
    """How a job obtained a pod, warmest first."""

    WARM = "warm"
    RECYCLED = "recycled"
    STANDBY = "standby"
    NEW = "new"
    CUSTOM_IMAGE = "custom_image"


class Origin(enum.StrEnum):
    """Why a pod was created."""

    DEMAND = "demand"      # queued jobs (or a replacement for a retiring pod) wanted it
    WARM = "warm"          # the floor kept it ahead of demand
    SINGLE_USE = "single_use"  # created for one job, deleted at its release
    STANDBY = "standby"    # staged on an active pod's GPU (broker.warmth.standby)
    CUSTOM_IMAGE = "custom_image"  # a digest-pinned custom image: made for one job, then its caller's only


SessionKey = tuple[str, str, str]
"""(caller, queue, lease_tag): jobs with equal keys share a warm pod."""


class IllegalPodTransition(Exception):
    pass


class Pod:
    """A tracked pod; about 0.5 KB with its index entries, so 100k pods fit in ~50 MB."""

    __slots__ = (
        "name", "pool", "state", "gpus", "caller", "key", "hold_until", "idle_since", "job",
        "used", "origin", "retire", "reserved_for", "template", "created_at", "path", "reason", "standby",
        "node", "image", "gang", "epoch",
    )

    def __init__(self, name: str, pool: str, gpus: tuple[str, ...] = (), *, state: PodState = PodState.STARTING,
                 origin: Origin = Origin.DEMAND, template: str = "", created_at: float = 0.0,
                 reserved_for: str | None = None, image: str = "") -> None:
        self.name = name
        self.pool = pool
        self.state = state
        self.gpus = gpus
        self.caller: str | None = None
        self.key: SessionKey | None = None
        self.hold_until = 0.0
        self.idle_since = created_at
        self.job: str | None = None
        self.used = False
        self.origin = origin
        self.retire = False
        self.reserved_for = reserved_for
        self.template = template
        self.created_at = created_at
        self.path = ""
        self.reason: str | None = None
        self.standby = False
        """A zero-VRAM standby on an active pod's GPU, until a job promotes it (broker.warmth.standby)."""
        self.node = ""
        """The node placement put the pod on (broker.fleet); empty without nodes."""
        self.image = image
        """A job's custom image the pod runs (broker.images): it never joins the shared pool."""
        self.gang = ""
        """The waiting gang this pod was made for (a placement hint: its claim takes it first, the cluster
        puts it beside the gang's other pods); any job may still take it."""
        self.epoch = ""
        """The identity epoch work is bound under (broker.health.epochs); "" until the agent first answers."""

    def move(self, to: PodState) -> None:
        """The only pod state change; callers hold the tracker lock."""
        if to not in POD_TRANSITIONS[self.state]:
            raise IllegalPodTransition(f"pod {self.name}: {self.state.value} -> {to.value}")
        self.state = to

    def held(self, now: float) -> bool:
        """Idle and reserved for its last caller."""
        return self.state is PodState.IDLE and self.caller is not None and self.hold_until > now

    def snapshot(self) -> dict[str, object]:
        return {
            "name": self.name, "pool": self.pool, "state": self.state.value, "gpus": list(self.gpus),
            "caller": self.caller, "lease_tag": self.key[2] if self.key else None,
            "queue": self.key[1] if self.key else None, "hold_until": self.hold_until or None,
            "idle_since": self.idle_since, "job": self.job, "used": self.used, "origin": self.origin.value,
            "retire_at_release": self.retire, "created_at": self.created_at, "standby": self.standby,
            "node": self.node or None,
            **({"image": self.image} if self.image else {}),
        }


ANNOTATION_PREFIX = "firepool.dev/"


def owner_annotations(pod: Pod) -> dict[str, str]:
    """What a pod record must carry so a restarted broker restores its owner and hold."""
    key = pod.key or ("", "", "")
    return {
        ANNOTATION_PREFIX + "caller": pod.caller or "",
        ANNOTATION_PREFIX + "queue": key[1],
        ANNOTATION_PREFIX + "lease-tag": key[2],
        ANNOTATION_PREFIX + "hold-until": repr(pod.hold_until),
        ANNOTATION_PREFIX + "idle-since": repr(pod.idle_since),
        ANNOTATION_PREFIX + "used": "1" if pod.used else "",
        ANNOTATION_PREFIX + "origin": pod.origin.value,
        ANNOTATION_PREFIX + "job": pod.job or "",
        ANNOTATION_PREFIX + "role": "standby" if pod.standby else "",
        ANNOTATION_PREFIX + "image": pod.image,
        ANNOTATION_PREFIX + "epoch": pod.epoch,
    }


def restore_owner(pod: Pod, annotations: Mapping[str, str]) -> None:
    """Apply owner annotations (as written by `owner_annotations`) to a recovered pod record."""
    get = annotations.get
    caller = get(ANNOTATION_PREFIX + "caller") or None
    if caller is not None:
        pod.caller = caller
        pod.key = (caller, get(ANNOTATION_PREFIX + "queue", ""), get(ANNOTATION_PREFIX + "lease-tag", ""))
    pod.hold_until = float(get(ANNOTATION_PREFIX + "hold-until") or 0.0)
    pod.idle_since = float(get(ANNOTATION_PREFIX + "idle-since") or pod.created_at)
    pod.used = bool(get(ANNOTATION_PREFIX + "used"))
    origin = get(ANNOTATION_PREFIX + "origin") or ""
    if origin in Origin._value2member_map_:
        pod.origin = Origin(origin)
    pod.standby = get(ANNOTATION_PREFIX + "role") == "standby"
    pod.image = get(ANNOTATION_PREFIX + "image", "")
