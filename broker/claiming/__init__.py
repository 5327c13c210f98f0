"""The claim path: a queued job admitted, ordered and bound to its whole pod set under the tracker's one lock.

admission (checks at the door) -> jobbook (queued jobs by pool) -> dispatching (event-driven passes) ->
tracker (the lock; tracking holds its indexes, searching its search order, gangclaims and reserving the gangs').
"""
