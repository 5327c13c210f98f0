"""One leader among the brokers of a store: the store's lock elects it, a term fences it, a heartbeat shows it lives.

A candidate waits on the store's lock (broker.store.leaderlocks). Holding it, it takes the next term in the
`leadership` row (`term = term + 1`, its own name and URL) and leads; from then on every write transaction of
this process first reads that row under a shared row lock and refuses to go on if the term moved (`install_fence`),
so a deposed leader can commit nothing, and the new leader's term bump waits for any write already under way.

The leader beats every `lease_s / 5`: its lock's session must still hold the lock and the beat is conditional on
the term, so a leader that finds its session gone or the term moved is deposed. A leader whose last beat is older
than `lease_s / 2` asks for one at once and deposes itself if none succeeds within `lease_s / 4` (a hung or cut-off
store); one that was merely slow, or paused while nobody took over, beats and goes on. A standby that sees the beat stand still for a whole `lease_s` (its own monotonic
clock: wall-clock jumps change nothing) ends the holder's session and takes the lock. Both bounds run on the
monotonic clock of each host, so the old leader has stopped before a standby may take over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import event

from broker.errors import Fenced
from broker.fencing import DEFAULT_LEASE_S, Term
from broker.store.engines import WRITE
from broker.store.leaderlocks import StoreLock, lock_for
from broker.store.schema import leadership

log = logging.getLogger("firepool.leadership")

WARM_SESSIONS = 4
BLOCKED_S = 0.2
"""How long the term bump waits on the old leader's transactions before it ends their sessions."""
WAIT_S = 0.25
"""A standby's longest wait on the lock before it looks at the leader's heartbeat again."""

_ROW = leadership.c.id == 1


@dataclass(frozen=True)
class Leader:
    term: int
    holder: str
    url: str
    beat: int


def read_leader(conn: sa.Connection) -> Leader:
    row = conn.execute(sa.select(leadership.c.term, leadership.c.holder, leadership.c.url, leadership.c.beat)
                       .where(_ROW)).one()
    return Leader(int(row.term), row.holder, row.url, int(row.beat))


def install_fence(engine: sa.Engine, term: Term) -> None:
    """Every write transaction on `engine` first checks, under a shared lock on the leadership row, that this
    broker's term is still the newest; if not, the broker is deposed (`term.deposed`) and the write refused."""
    check = sa.select(leadership.c.term).where(_ROW).with_for_update(read=True)

    @event.listens_for(engine, "begin")
    def _fence(conn: sa.Connection) -> None:
        if term.value and conn.get_execution_options().get(WRITE):
            newest = conn.execute(check).scalar_one()
            if newest != term.value:
                term.deposed(f"the store is at term {newest}, this broker led term {term.value}")
                raise Fenced(f"write refused: this broker's term {term.value} is not the newest ({newest})",
                             {"term": term.value, "newest": int(newest)})


class Election:
    """This broker's candidacy: `campaign` blocks (in a thread) until it leads, then `lead` keeps the lease."""

    def __init__(self, engine: sa.Engine, term: Term, *, holder: str, url: str, lease_s: float = DEFAULT_LEASE_S,
                 lock: StoreLock | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.term = term
        self.holder = holder
        self.url = url
        self.lease_s = lease_s
        self.lock = lock or lock_for(engine)
        self.monotonic = monotonic
        self.leader: Leader | None = None
        """The leader as this standby last read it (its URL goes into NotLeader answers)."""
        self.stopping = threading.Event()
        self._last_beat = monotonic()
        self._beating: threading.Thread | None = None
        self._kick = threading.Event()
        self._campaigning = False
        self.first_try = threading.Event()
        """Set once the lock was tried: a broker that got it at once starts serving only when it leads."""
        self.locked_at: float | None = None
        """When this broker got the store's lock (monotonic): the start of its take-over."""

    def known_leader(self) -> tuple[str | None, int]:
        """(URL, term) of the leader as last read; the URL is None while the row names nobody or a stale one."""
        leader = self.leader
        if leader is None:
            return None, 0
        return (leader.url or None), leader.term

    # -- standby ---------------------------------------------------------------------------------

    def campaign(self) -> int:
        """Wait for the store's lock, breaking a leader whose heartbeat stood still for a lease; then take the
        next term and return it. Returns 0 if `stopping` was set first."""
        self._campaigning = True
        try:
            self.warm()
            return self._wait_for_the_lock()
        finally:
            self._campaigning = False

    def warm(self, sessions: int = WARM_SESSIONS) -> None:
        """Open `sessions` pooled connections now, while standing by: the take-over's first queries and writes run
        at once on several of them (a new MariaDB session costs ~30 ms). The campaign's reads then cycle through the
        pool (it hands out its oldest idle connection first), which keeps them alive."""
        opened = [self.engine.connect() for _ in range(sessions)]
        for conn in opened:
            conn.close()

    def _wait_for_the_lock(self) -> int:
        seen: tuple[int, int] | None = None
        changed = self.monotonic()
        while not self.stopping.is_set():
            got = self.lock.acquire(WAIT_S)
            self.first_try.set()
            if got:
                if self.stopping.is_set():
                    break
                self.locked_at = self.monotonic()
                return self._take_term()
            try:
                with self.engine.connect() as conn:
                    self.leader = read_leader(conn)
            except sa.exc.SQLAlchemyError as exc:
                log.warning("standby: reading the leader's heartbeat failed: %s", exc)
                continue
            now = self.monotonic()
            if (self.leader.term, self.leader.beat) != seen:
                seen, changed = (self.leader.term, self.leader.beat), now
            elif now - changed > self.lease_s:
                log.warning("leader %s (term %d) has not beaten for %.1f s (lease %.1f s): ending its store "
                            "session", self.leader.holder, self.leader.term, now - changed, self.lease_s)
                if not self.lock.break_holder():
                    log.warning("its store session could not be ended here; waiting for it to end")
                changed = now  # give the next holder a whole lease too
        self.lock.close()  # here, not in stop(): this thread is the one that uses the lock's session
        return 0

    def _take_term(self) -> int:
        """Take the next term. The bump waits for the write transactions that still hold the row under the old
        term (each holds it shared from its fence): those of a paused or cut-off leader are ended after
        BLOCKED_S, so they roll back and the bump goes through."""
        taken: list[Leader] = []
        failed: list[BaseException] = []
        session: list[int] = []

        def bump() -> None:
            try:
                with self.engine.connect() as conn, conn.execution_options(**{WRITE: True}).begin():
                    session.append(self.lock.session(conn))
                    conn.execute(leadership.update().where(_ROW).values(
                        term=leadership.c.term + 1, holder=self.holder, url=self.url, beat=0, since=time.time()))
                    taken.append(read_leader(conn))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the campaign's thread below
                failed.append(exc)

        worker = threading.Thread(target=bump, name="firepool-term", daemon=True)
        worker.start()
        worker.join(BLOCKED_S)
        while worker.is_alive():
            if session and (ended := self.lock.end_blockers(session[0])):
                log.warning("ended %d store session(s) of the previous leader that held the leadership row", ended)
            worker.join(BLOCKED_S)
        if failed:
            raise failed[0]
        self.leader = taken[0]
        self._last_beat = self.monotonic()
        log.info("leading the store at term %d as %s (%.3f s after taking its lock)", self.leader.term, self.holder,
                 self.monotonic() - (self.locked_at or self.monotonic()))
        return self.leader.term

    # -- leader ----------------------------------------------------------------------------------

    def lead(self) -> None:
        """Keep the lease until deposed or stopped: beat every lease/5 on the lock's session, and depose this
        broker once it has not beaten for lease/2. Runs in its own threads, so a busy event loop or a hung
        store call cannot keep a broker leading past its lease."""
        self._beating = threading.Thread(target=self._beat, name="firepool-lease", daemon=True)
        self._beating.start()
        threading.Thread(target=self._watch, name="firepool-lease-watch", daemon=True).start()

    def _beat(self) -> None:
        """Every lease/5 (or when the watch asks): the lock's session must still hold the lock (else a standby
        ended it, and may lead: deposed at once), and the conditional beat must find this broker's term."""
        update = leadership.update().where(_ROW, leadership.c.term == self.term.value).values(
            beat=leadership.c.beat + 1)
        while True:
            self._kick.wait(self.lease_s / 5)
            self._kick.clear()
            if self.stopping.is_set():
                return
            try:
                self.lock.check()
            except Exception as exc:  # noqa: BLE001 - whatever ended the session, the lock is gone with it
                if not self._retake(exc):
                    return
            try:
                with self.engine.begin() as conn:  # not a fenced write: the UPDATE's own WHERE is the fence
                    moved = conn.execute(update).rowcount == 0
            except Exception as exc:  # noqa: BLE001 - the watch deposes this broker if beats keep failing
                log.warning("leader heartbeat failed (the store's lock is still held): %s", exc)
                continue
            if moved:
                self.term.deposed(f"another broker took a newer term than {self.term.value}")
                return
            self._last_beat = self.monotonic()

    def _retake(self, lost: BaseException) -> bool:
        """The lock's session ended (a database restart, a dropped connection, or a standby that ended it): take
        the lock again at once if it is free, and the beat that follows checks the term did not move. Held by
        another broker: deposed (False). The store unreachable: try again at the next beat; the watch bounds
        how long."""
        self.lock.close()
        try:
            got = self.lock.acquire(0.0)
        except Exception as exc:  # noqa: BLE001 - unreachable for now: the next beat tries again
            log.warning("the store lock's session ended (%s) and the store does not answer: %s", lost, exc)
            return True
        if not got:
            self.term.deposed(f"the store lock's session ended ({lost}) and another broker holds the lock")
            return False
        log.warning("the store lock's session ended (%s); took the lock again, checking the term", lost)
        return True

    def _watch(self) -> None:
        """A beat older than lease/2 (a hung store, a paused process that just woke up): ask for one now and
        give it lease/4; no beat by then and this broker deposes itself, before a standby may take over (a whole
        lease after the beat it saw last). A broker that was only slow beats in time and goes on leading."""
        while not self.stopping.wait(0.05):
            if self.monotonic() - self._last_beat <= self.lease_s / 2:
                continue
            self._kick.set()
            deadline = self.monotonic() + self.lease_s / 4
            while self.monotonic() < deadline and not self.stopping.is_set():
                if self.monotonic() - self._last_beat <= self.lease_s / 2:
                    break
                time.sleep(0.01)
            silent = self.monotonic() - self._last_beat
            if silent > self.lease_s / 2 and not self.stopping.is_set():
                self.term.deposed(f"no heartbeat for {silent:.1f} s (lease {self.lease_s:.1f} s): "
                                  "a standby may lead now")
                return

    def stop(self) -> None:
        """Stop campaigning or leading; a leader's lock is released once its heartbeat has stopped (a campaign
        releases its own as it returns)."""
        self.stopping.set()
        self._kick.set()
        if self._beating is not None:
            self._beating.join(5)
        if not self._campaigning:
            self.lock.close()
