"""The fleet: nodes, topology-aware placement and the capacity they leave (pure; no I/O, no frameworks).

`nodes` describes the machines a backend reports and what is allocated on them; `placement` decides
where a pod set goes (best-fit over topology sets, shape-aligned: docs/fleet.md); `capacity` says how
many allocations of each shape could still be placed (`largest_placeable`).
"""
