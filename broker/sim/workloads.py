"""The paper's workloads as seeded plans: what each caller submits and when, never how it runs.

A plan lists callers (agents, a trainer) that start together; each caller runs its stages in order, and a
stage's jobs run concurrently (an RL barrier) after the stage's pause (an agent's think time). Bodies are
fixed per seed (App. B.2: "job bodies are fixed-duration payloads, so differences between arms come from
acquisition, not work"), so a pair of arms in one repeat runs the same plan. Arrival patterns and Zipf
environments feed the simulator's open-loop scenarios (App. C.1, C.5).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Arm = Literal["reuse-on", "reuse-off", "fresh-pod"]
ARMS: tuple[Arm, ...] = ("reuse-on", "reuse-off", "fresh-pod")
"""§9 / App. B.3: a stable tag per caller; a fresh tag per job (a retiring boundary); a single-use pod per job."""

Pattern = Literal["steady", "bursty", "diurnal"]
PATTERNS: tuple[Pattern, ...] = ("steady", "bursty", "diurnal")

ENVIRONMENT_COUNTS = (1, 2, 4, 8, 16, 32, 64)
"""Fig. 5's x axis: E distinct environments, 1 to 64."""


@dataclass(frozen=True, slots=True)
class Job:
    kind: str
    """rollout, eval or update (W-RL); call or verify (W-Agent)."""
    body_s: float
    """The fixed-duration body (s)."""


@dataclass(frozen=True, slots=True)
class Stage:
    pause_s: float
    """Wait after the caller's previous stage finished, before submitting this one (think time)."""
    jobs: tuple[Job, ...]
    """Submitted together; the stage ends when all finish (a barrier when there are several)."""


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    stages: tuple[Stage, ...]

    @property
    def jobs(self) -> int:
        return sum(len(s.jobs) for s in self.stages)


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    seed: int
    callers: tuple[Caller, ...]

    @property
    def jobs(self) -> int:
        return sum(c.jobs for c in self.callers)

    def scaled(self, factor: float) -> Plan:
        """The plan with every body and pause multiplied by `factor` (a venue scaled in time)."""
        return Plan(f"{self.name}x{factor:g}", self.seed, tuple(
            Caller(c.name, tuple(Stage(s.pause_s * factor, tuple(Job(j.kind, j.body_s * factor) for j in s.jobs))
                                 for s in c.stages)) for c in self.callers))


def reuse_tag(arm: Arm, caller: str, job_index: int) -> str | None:
    """The reuse tag a job carries in an arm: the caller's own, a fresh one per job, or none (single-use)."""
    if arm == "reuse-on":
        return caller
    if arm == "reuse-off":
        return f"{caller}-job{job_index}"
    return None


RL_ITERATIONS = 4  # §9: "4 barrier-synchronized iterations"
RL_STAGES = (("rollout", 8), ("eval", 2), ("update", 1))  # §9: "of 8 rollouts, 2 evaluations and 1 policy update"
RL_BODY_S = (1.5, 4.0)  # §9: "fixed 1.5–4 s bodies"


def w_rl(seed: int) -> Plan:
    """W-RL (§9, App. B.2): one trainer, 4 iterations of 8 rollouts | 2 evaluations | 1 update: 44 jobs."""
    rng = random.Random(f"w-rl/{seed}")
    stages = tuple(Stage(0.0, tuple(Job(kind, rng.uniform(*RL_BODY_S)) for _ in range(n)))
                   for _ in range(RL_ITERATIONS) for kind, n in RL_STAGES)
    return Plan("w-rl", seed, (Caller("trainer", stages),))


AGENT_ITERATIONS = 3  # §9: "for 3 iterations"
AGENT_CALLS = (2, 4)  # §9: "of 2–4 calls each"
AGENT_BODY_S = (0.5, 1.6)  # §9: "fixed 0.5–1.6 s bodies, the last a verify step"
AGENT_THINK_S = (0.5, 2.0)  # §9: "0.5–2 s think pauses between calls"
AGENT_GAP_S = (2.0, 5.0)  # §9: "and 2–5 s between iterations"


def _agent(name: str, rng: random.Random, iterations: int) -> Caller:
    stages: list[Stage] = []
    for _ in range(iterations):
        calls = rng.randint(*AGENT_CALLS)
        for k in range(calls):
            pause = 0.0 if not stages else rng.uniform(*(AGENT_GAP_S if k == 0 else AGENT_THINK_S))
            kind = "verify" if k == calls - 1 else "call"
            stages.append(Stage(pause, (Job(kind, rng.uniform(*AGENT_BODY_S)),)))
    return Caller(name, tuple(stages))


def w_agent(agents: int, seed: int) -> Plan:
    """W-Agent (§9, App. B.2): `agents` concurrent agents (2 or 4), 3 iterations of 2–4 sequential calls."""
    rng = random.Random(f"w-agent/{agents}/{seed}")
    return Plan(f"w-agent-{agents}", seed, tuple(_agent(f"agent{i}", rng, AGENT_ITERATIONS) for i in range(agents)))


STANDBY_JOBS = 30  # §9.3 / Table 6: "30 sequential jobs with a fresh reuse tag each"


def standby_loop(seed: int) -> Plan:
    """The standby benchmark (§9.3, App. B.2): one caller's 30 sequential W-Agent jobs (a fresh tag each: arm
    `reuse-off`), with W-Agent's bodies and think pauses."""
    rng = random.Random(f"standby/{seed}")
    stages = tuple(Stage(0.0 if i == 0 else rng.uniform(*AGENT_THINK_S), (Job("call", rng.uniform(*AGENT_BODY_S)),))
                   for i in range(STANDBY_JOBS))
    return Plan("standby", seed, (Caller("caller", stages),))


def workload(name: str, seed: int) -> Plan:
    """A plan by name: w-rl, w-agent-2, w-agent-4 or standby."""
    if name == "w-rl":
        return w_rl(seed)
    if name.startswith("w-agent-") and name.removeprefix("w-agent-").isdigit():
        return w_agent(int(name.removeprefix("w-agent-")), seed)
    if name == "standby":
        return standby_loop(seed)
    raise ValueError(f"unknown workload {name!r} (w-rl, w-agent-2, w-agent-4, standby)")


# Arrival patterns. The paper names steady, bursty and diurnal patterns (App. C.1, Fig. 6b) without
# defining them; ours keep the same mean rate and differ only in how arrivals cluster:
BURST_PERIOD_S = 300.0
"""bursty: one burst every 5 minutes ..."""
BURST_ON_S = 60.0
"""... lasting 1 minute, carrying BURST_SHARE of the arrivals (a rate 3× the mean inside, 0.5× outside)."""
BURST_SHARE = 0.6
DIURNAL_SWING = 0.8
"""diurnal: the rate follows one sinusoidal 'day' over the horizon, from 0.2× to 1.8× the mean."""


def _rate(pattern: Pattern, t: float, mean: float, horizon_s: float) -> float:
    if pattern == "steady":
        return mean
    if pattern == "bursty":
        on = (t % BURST_PERIOD_S) < BURST_ON_S
        share = BURST_SHARE if on else 1.0 - BURST_SHARE
        span = BURST_ON_S if on else BURST_PERIOD_S - BURST_ON_S
        return mean * share * BURST_PERIOD_S / span
    return mean * (1.0 - DIURNAL_SWING * math.cos(2.0 * math.pi * t / horizon_s))


def _peak(pattern: Pattern, mean: float) -> float:
    if pattern == "steady":
        return mean
    if pattern == "bursty":
        return mean * BURST_SHARE * BURST_PERIOD_S / BURST_ON_S
    return mean * (1.0 + DIURNAL_SWING)


def arrivals(pattern: Pattern, mean_rate_per_s: float, horizon_s: float, seed: int) -> tuple[float, ...]:
    """Arrival times in [0, horizon_s): a Poisson process whose rate follows `pattern` (thinning)."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown arrival pattern {pattern!r} ({', '.join(PATTERNS)})")
    if mean_rate_per_s <= 0 or horizon_s <= 0:
        return ()
    rng = random.Random(f"arrivals/{pattern}/{seed}")
    peak = _peak(pattern, mean_rate_per_s)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= horizon_s:
            return tuple(out)
        if rng.random() * peak < _rate(pattern, t, mean_rate_per_s, horizon_s):
            out.append(t)


ZIPF_S = 1.0  # App. C.5: "Zipf (s = 1) environment popularity"


def zipf_weights(environments: int, s: float = ZIPF_S) -> tuple[float, ...]:
    """Popularity of environments 0..E-1, normalised: environment k has weight 1/(k+1)^s."""
    if environments < 1:
        raise ValueError("at least one environment")
    raw = [1.0 / (k + 1) ** s for k in range(environments)]
    total = sum(raw)
    return tuple(w / total for w in raw)


def zipf_environments(environments: int, jobs: int, seed: int, s: float = ZIPF_S) -> tuple[int, ...]:
    """The environment (0..E-1) of each of `jobs` jobs, drawn from a Zipf(s) popularity (App. C.5, Fig. 5)."""
    rng = random.Random(f"zipf/{environments}/{s}/{seed}")
    weights: Sequence[float] = zipf_weights(environments, s)
    return tuple(rng.choices(range(environments), weights=weights, k=jobs))
