"""Fleet health: identity epochs (design R5) and quarantine of failing GPUs and nodes (design §8).

Every decision here (an epoch that invalidates a pod's bindings, a device or node quarantined or
released) goes through `broker.health.decisions.decided`, the one place they are announced.
"""
