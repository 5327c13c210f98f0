"""Venue models as values: how long a venue takes to start, hand off to and stop a pod.

Every constant names the paper table or section it comes from; where the paper gives no figure the
comment says what we assumed. `h200` and `cpu` are the paper's production venues (App. B.1); `local` is
measured on this machine by a calibration command and loaded from the JSON it writes (`load_local`).
Cold starts are drawn with `broker.backends.startdelay.StartModel`, the sampler the local backend's
venue delay uses, so the simulator and a benchmark with a scaled venue draw from one model.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from broker.backends.startdelay import StartModel


@dataclass(frozen=True, slots=True)
class Venue:
    """One venue's costs (seconds) and the pool shape the paper ran on it."""

    name: str
    cold_start: StartModel
    """Pod creation → ready, the image cached on the node."""
    handoff_s: float
    """Assigned pod → job handed to the in-pod agent (package delivery and unpacking included)."""
    first_instruction_s: float
    """Hand-off → the job's first instruction."""
    accept_s: float
    """Submit → job accepted (durable commit)."""
    dispatch_s: float
    """Accepted → pod claimed, with event-driven dispatch."""
    promotion_s: float
    """A standby pod's promotion to active (the wait at a handover served by standby)."""
    termination_s: float
    """Pod deletion until its GPU is free for a new pod."""
    cap: int
    """Pods (GPUs or CPU pods) the benchmark pool may hold."""
    standbys_per_active: int
    """Zero-VRAM standby pods kept per active pod (0: the venue has no standby)."""

    def sample_cold_start(self, rng: random.Random, starting: int = 1) -> float:
        """One pod's start (s) with `starting` pods starting at once on the node, this one included."""
        return self.cold_start.sample(rng, starting)

    def sample_handoff(self, rng: random.Random) -> float:
        """One hand-off (s): lognormal with the venue's median and §9.2's p99/median spread."""
        return self.handoff_s * math.exp(HANDOFF_SIGMA * rng.gauss(0.0, 1.0))

    def warm_start_s(self) -> float:
        """Submit → first instruction on an idle warm pod: the sum of the control-plane and pod phases."""
        return self.accept_s + self.dispatch_s + self.handoff_s + self.first_instruction_s

    def scaled(self, factor: float) -> Venue:
        """The venue with every duration multiplied by `factor` (0.1: a tenth of the venue's time)."""
        return replace(self, name=f"{self.name}x{factor:g}", cold_start=self.cold_start.scaled(factor),
                       handoff_s=self.handoff_s * factor, first_instruction_s=self.first_instruction_s * factor,
                       accept_s=self.accept_s * factor, dispatch_s=self.dispatch_s * factor,
                       promotion_s=self.promotion_s * factor, termination_s=self.termination_s * factor)

    def to_json(self) -> dict[str, Any]:
        """The venue as the calibration file stores it."""
        return asdict(self)


HANDOFF_P99_S = 1.45
"""§9.2: code-package delivery, unpacking and job start, "p99 <=1.45 s on H200" (median 0.39 s, App. C.4)."""
Z99 = 2.3263478740408408
"""The standard normal's 99th percentile."""
HANDOFF_SIGMA = math.log(HANDOFF_P99_S / 0.39) / Z99
"""The hand-off's lognormal shape from H200's p99 over its median (App. C.4's 0.39 s); the paper gives no CPU
tail, so the CPU venue draws with the same spread around its own median (as its cold start borrows H200's p90).
The paper's p99 is an upper bound ("<="), so this spread is the widest the paper allows."""

H200_ONE_POD_READY_S = 19.8
"""Create→ready of a single pod started alone (Table 1, "1 pod: 19.8 s")."""
H200_EIGHT_AT_ONCE_S = 47.5
"""Create→ready when eight pods start together on one node (Table 1; §2.2: "from about 20 s to nearly 50 s")."""

h200 = Venue(
    name="h200",
    cold_start=StartModel(
        median_s=22.1,  # Table 1: total pod creation → first instruction, image cached, median (88 pods)
        p90_s=34.7,  # Table 1: the same, p90
        crowd_n=8,  # Table 1: "Create→Ready, 8 at once"
        crowd_factor=H200_EIGHT_AT_ONCE_S / H200_ONE_POD_READY_S,  # Table 1: 47.5 s vs 19.8 s for 1 pod (×2.40)
    ),
    handoff_s=0.39,  # App. C.4: warm start phases, hand-off 0.39 s
    first_instruction_s=0.12,  # App. C.4: first instruction 0.12 s
    accept_s=0.04,  # App. C.4: accept 0.04 s
    dispatch_s=0.01,  # App. C.4: event-driven dispatch 0.01 s (0.59 s warm start in all)
    promotion_s=0.81,  # §9.3: median queue wait over handovers served by standby promotions alone
    termination_s=0.0,  # not reported; deletion runs off the critical path (§6); the simulator may calibrate it
    cap=2,  # App. B.1 / §9: a two-GPU pool cap on one pinned 8×H200 node
    standbys_per_active=3,  # §9.1: "three zero-VRAM standby pods per active GPU"
)

cpu = Venue(
    name="cpu",
    cold_start=StartModel(
        median_s=22.0,  # Fig. 5, Fig. 6b, App. C.1: "CPU calibration with a 22 s pod start"
        # The paper gives no CPU p90; we assume Table 1's H200 spread (p90/median 34.7/22.1 = 1.57).
        p90_s=22.0 * 34.7 / 22.1,
    ),  # no contention term: the paper reports none for CPU pods
    handoff_s=0.40,  # §9.2: package delivery, unpacking and job start took 0.40–0.54 s at the median
    first_instruction_s=0.0,  # included in §9.2's 0.40 s (job start)
    accept_s=0.04,  # App. C.4 (control plane, venue-independent)
    dispatch_s=0.01,  # App. C.4
    promotion_s=0.0,  # unused: CPU has no standby (§9.1)
    termination_s=0.0,  # not reported (as h200)
    cap=16,  # App. B.1: 4 vCPU/8 GiB pods, a 16-pod cap
    standbys_per_active=0,  # §9.1: "On CPU, which has no standby"
)

VENUES = {"h200": h200, "cpu": cpu}
"""The paper's venues by name; `local` comes from a calibration file (`load_local`)."""


def save_local(venue: Venue, path: Path) -> None:
    """Write a calibrated venue where `load_local` reads it (the calibration command's output)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(venue.to_json(), indent=2) + "\n")


def load_local(path: Path) -> Venue:
    """The venue measured on this machine, from the calibration command's JSON; ValueError names a bad field."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no calibration file; run the calibration command first") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cold_start"), dict):
        raise ValueError(f"{path}: expected an object with a cold_start object")
    names = {f for f in Venue.__dataclass_fields__}
    unknown = sorted(set(raw) - names)
    missing = sorted(names - set(raw))
    if unknown or missing:
        raise ValueError(f"{path}: unknown fields {unknown}, missing fields {missing}")
    try:
        model = StartModel(**raw["cold_start"])
        return Venue(**{**raw, "cold_start": model, "name": str(raw["name"])})
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def venue(name: str, local_file: Path | None = None) -> Venue:
    """A venue by name: `h200`, `cpu`, or `local` (from `local_file`)."""
    if name == "local":
        if local_file is None:
            raise ValueError("the local venue needs its calibration file")
        return load_local(local_file)
    try:
        return VENUES[name]
    except KeyError:
        raise ValueError(f"unknown venue {name!r} (venues: h200, cpu, local)") from None
