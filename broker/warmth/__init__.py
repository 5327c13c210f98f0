"""How many pods each pool keeps and which: the queue-driven scaler, budgets, owner holds, zero-VRAM standby,
template rollout, borrowed capacity, and the pool view that reports them (pooling reconciles them).
"""
