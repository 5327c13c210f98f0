"""Fleet rules the claim path applies: pure decisions (placement, quotas, preemption), no I/O."""
