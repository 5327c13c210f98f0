"""The fleet: pure decisions the claim path and the pool controller apply (no I/O, no frameworks).

`nodes` describes the machines a backend reports and what is allocated on them; `placement` decides
where a pod set goes (best-fit over topology sets, shape-aligned: docs/fleet.md); `capacity` says how
many allocations of each shape could still be placed (`largest_placeable`); `quotas` and `preemption`
decide team quotas, borrowing and who yields (docs/quotas.md).
"""
