"""Prometheus exposition of the control plane's own counters: acquisitions by path, start-latency
histograms, pods by state, jobs finished, resets."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from broker.control import ControlPlane
from broker.warmth.poolview import GAUGE_FIELDS


class _Collector:
    def __init__(self, cp: ControlPlane, caller_labels: bool) -> None:
        self.cp = cp
        self.caller_labels = caller_labels

    def collect(self) -> Iterator[Metric]:
        stats = self.cp.stats
        acq = CounterMetricFamily("firepool_acquisitions", "Pods acquired by jobs, by path", labels=["pool", "path"])
        for (pool, path), n in sorted(stats.acquisitions.items()):
            acq.add_metric([pool, path], n)
        yield acq
        hist = HistogramMetricFamily("firepool_start_latency_seconds", "Submit to first instruction",
                                     labels=["pool", "path"])
        for (pool, path), h in sorted(stats.start_latency.items()):
            hist.add_metric([pool, path], h.cumulative(), h.total)
        yield hist
        pods = GaugeMetricFamily("firepool_pods", "Tracked pods by pool and state", labels=["pool", "state"])
        now = self.cp.clock.now()
        by: Counter[tuple[str, str]] = Counter()
        for pod in self.cp.tracker.snapshot():
            state = "held" if pod.held(now) else pod.state.value
            if pod.standby and state in ("starting", "idle"):
                state = "standby"  # a zero-VRAM standby on an active pod's GPU
            by[(pod.pool, state)] += 1
        for (pool, state), n in sorted(by.items()):
            pods.add_metric([pool, state], n)
        yield pods
        queued = GaugeMetricFamily("firepool_queued_jobs", "Jobs waiting to be placed", labels=["pool"])
        q: Counter[str] = Counter(j.spec.pool for j in self.cp.dispatcher.queued.values())
        for pool in self.cp.catalog.pools:
            queued.add_metric([pool], q.get(pool, 0))
        yield queued
        yield from _pool_gauges(self.cp, self.caller_labels)
        done = CounterMetricFamily("firepool_jobs_finished", "Jobs that reached a terminal state",
                                   labels=["pool", "state"])
        for (pool, state), n in sorted(stats.jobs_finished.items()):
            done.add_metric([pool, state], n)
        yield done
        writer = self.cp.book.writer
        yield CounterMetricFamily("firepool_store_commits", "Group commits of job rows (one transaction each)",
                                  value=writer.commits)
        yield CounterMetricFamily("firepool_store_writes", "Job row writes and inserts, in all group commits",
                                  value=writer.writes)
        yield CounterMetricFamily("firepool_store_commit_cpu_seconds", "CPU the store writer spent in group commits",
                                  value=writer.cpu_s)
        resets = CounterMetricFamily("firepool_resets", "Pod resets by outcome", labels=["pool", "clean"])
        for (pool, clean), n in sorted(stats.resets.items()):
            resets.add_metric([pool, "true" if clean else "false"], n)
        yield resets
        events = CounterMetricFamily("firepool_events", "Fleet events by kind (GET /v1/events)", labels=["kind"])
        cost = CounterMetricFamily("firepool_event_cost_gpu_seconds", "GPU-seconds fleet events cost, by kind",
                                   labels=["kind"])
        for kind, n in sorted(self.cp.events.by_kind.items()):
            events.add_metric([kind], n)
            cost.add_metric([kind], self.cp.events.cost_by_kind.get(kind, 0.0))
        yield events
        yield cost
        created = CounterMetricFamily("firepool_pods_created", "Pods created", labels=["pool"])
        for pool, n in sorted(stats.pods_created.items()):
            created.add_metric([pool], n)
        yield created


def _pool_gauges(cp: ControlPlane, caller_labels: bool) -> Iterator[Metric]:
    """The `/v1/pools` view as gauges: one family per field, labelled by pool. Holds by owner name their
    callers, so that family is published only when the operator asks (`--metrics-caller-labels`)."""
    views = cp.pools_view()
    for name in GAUGE_FIELDS:
        g = GaugeMetricFamily(f"firepool_pool_{name}", f"Pool {name.replace('_', ' ')} (see GET /v1/pools)",
                              labels=["pool"])
        for v in views:
            value = v[name]
            g.add_metric([v["name"]], math.inf if value is None else float(value))
        yield g
    placeable = GaugeMetricFamily("firepool_pool_largest_placeable", "Allocations of each shape (GPUs on one node, "
                                  "or whole nodes) placeable now on the pool's nodes", labels=["pool", "shape"])
    for v in views:
        for shape, n in v.get("largest_placeable", {}).items():
            placeable.add_metric([v["name"], shape], float(n))
    yield placeable
    fleet = GaugeMetricFamily("firepool_largest_placeable", "Allocations of each shape placeable now, per "
                              "accelerator (design §9.1: the primary capacity figure)", labels=["accelerator", "shape"])
    for model, acc in cp.fleet_view()["accelerators"].items():
        for shape, n in acc["largest_placeable"].items():
            fleet.add_metric([model, shape], float(n))
    yield fleet
    held = GaugeMetricFamily("firepool_pool_held_by", "Owner-held idle pods by owner", labels=["pool", "caller"])
    plan = GaugeMetricFamily("firepool_pool_last_plan_create", "Pods the last reconcile pass created, with its reason",
                             labels=["pool", "reason"])
    budget = GaugeMetricFamily("firepool_budget_used", "GPUs (CPU cores) reserved per accelerator",
                               labels=["accelerator"])
    limit = GaugeMetricFamily("firepool_budget_limit", "Budget per accelerator (+Inf when unbounded)",
                              labels=["accelerator"])
    for v in views:
        for caller, n in sorted(v["held_by"].items()):
            held.add_metric([v["name"], caller], n)
        if v["last_plan"] is not None:
            plan.add_metric([v["name"], v["last_plan"]["reason"]], v["last_plan"]["create"])
    ledger = cp.controller.ledger
    for accelerator in sorted(set(ledger.view()) | {spec.accelerator for spec in cp.catalog.pools.values()}):
        budget.add_metric([accelerator], ledger.used(accelerator))
        cap = ledger.limit(accelerator)
        limit.add_metric([accelerator], math.inf if cap is None else cap)
    yield from (held, plan, budget, limit) if caller_labels else (plan, budget, limit)


def registry_for(cp: ControlPlane, *, caller_labels: bool = False) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(cp, caller_labels))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
