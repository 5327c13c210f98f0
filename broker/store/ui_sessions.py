"""`SqlSessionStore`: the dashboard-session port on the job store's database (the `ui_sessions` table)."""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa

from broker.ports.ui_sessions import UiSession
from broker.store.engines import WRITE
from broker.store.schema import ui_sessions
from broker.store.sqlerrors import translated

_COLUMNS = ("id_digest", "caller", "token_digest", "created_at", "last_seen", "expires_at")
_IN_CHUNK = 500


class SqlSessionStore:
    blocking = True

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def _write(self) -> sa.Connection:
        return self._engine.connect().execution_options(**{WRITE: True})

    def get(self, id_digest: str) -> UiSession | None:
        with translated("ui session get"), self._engine.connect() as conn:
            row = conn.execute(sa.select(ui_sessions).where(ui_sessions.c.id_digest == id_digest)).mappings().first()
        return None if row is None else UiSession(**{c: row[c] for c in _COLUMNS})

    def put(self, session: UiSession) -> None:
        with translated("ui session put"), self._write() as conn, conn.begin():
            conn.execute(ui_sessions.insert(), {c: getattr(session, c) for c in _COLUMNS})

    def touch(self, id_digest: str, last_seen: float) -> None:
        with translated("ui session touch"), self._write() as conn, conn.begin():
            conn.execute(ui_sessions.update().where(ui_sessions.c.id_digest == id_digest)
                         .values(last_seen=last_seen))

    def delete(self, id_digest: str) -> None:
        with translated("ui session delete"), self._write() as conn, conn.begin():
            conn.execute(ui_sessions.delete().where(ui_sessions.c.id_digest == id_digest))

    def delete_except(self, token_digests: Collection[str], before: float) -> int:
        keep = set(token_digests)
        with translated("ui session purge"), self._write() as conn, conn.begin():
            ended = conn.execute(ui_sessions.delete().where(ui_sessions.c.expires_at < before)).rowcount
            held = conn.execute(sa.select(ui_sessions.c.token_digest).distinct()
                                .where(ui_sessions.c.token_digest.startswith("sha256:"))).scalars().all()
            gone = sorted(set(held) - keep)  # the credentials no longer in the tokens file: few, usually none
            for i in range(0, len(gone), _IN_CHUNK):
                ended += conn.execute(ui_sessions.delete().where(
                    ui_sessions.c.token_digest.in_(gone[i:i + _IN_CHUNK]))).rowcount
        return int(ended)
