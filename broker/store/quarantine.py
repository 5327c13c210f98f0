"""`SqlQuarantineStore`: the quarantine port on the job store's database (the `quarantine` table)."""

from __future__ import annotations

import sqlalchemy as sa

from broker.ports.quarantine import QuarantineRecord
from broker.store.schema import quarantine
from broker.store.sqlerrors import translated

_COLUMNS = ("key", "kind", "node", "failures", "reason", "updated_at", "quarantined_at", "released_at",
            "released_by")


class SqlQuarantineStore:
    blocking = True

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def load(self) -> list[QuarantineRecord]:
        with translated("quarantine load"), self._engine.connect() as conn:
            rows = conn.execute(sa.select(quarantine)).mappings().all()
        return [QuarantineRecord(**{c: row[c] for c in _COLUMNS}) for row in rows]

    def save(self, record: QuarantineRecord) -> None:
        values = {c: getattr(record, c) for c in _COLUMNS}
        with translated("quarantine save"), self._engine.begin() as conn:
            conn.execute(quarantine.delete().where(quarantine.c.key == record.key))
            conn.execute(quarantine.insert(), values)
