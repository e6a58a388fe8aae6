"""The blocking client: :class:`Client`, which runs the verbs' plans
(:mod:`sandboxd._plans`) with blocking calls."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

import psycopg

from . import _plans, _sql
from ._errors import refusals
from ._types import Checkpoint, Event, EventNotice, Revision, Status, notice_seq

T = TypeVar("T")


def _connect(dsn: str, connect_timeout: float) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(connect_timeout)))


class Client:
    """An orchestrator's connection to sandboxd's state database.

    ``dsn`` is a libpq connection string or URL for a role registered with
    ``sandboxd grant-orchestrator`` (docs/contract.md, "Roles"). The
    connection is in autocommit mode: each call sees what sandboxd
    committed, and waits are woken by ``LISTEN``. Not safe to share
    between threads; use one client per thread, or :class:`AsyncClient`.
    """

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._conn = _connect(dsn, connect_timeout)
        self._listening: set[str] = set()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, plan: _plans.Plan[T]) -> T:
        """Runs ``plan``, answering each of its steps."""
        try:
            step = next(plan)
            while True:
                step = plan.send(self._do(step))
        except StopIteration as done:
            result: T = done.value
            return result

    def _do(self, step: _plans.Step) -> Any:
        conn = self._conn
        with refusals():
            if isinstance(step, _plans.One):
                return conn.execute(step.sql, step.params).fetchone()
            if isinstance(step, _plans.All):
                return conn.execute(step.sql, step.params).fetchall()
            if isinstance(step, _plans.Transaction):
                with conn.transaction():
                    return [conn.execute(s.sql, s.params).fetchone() for s in step.statements]
            if isinstance(step, _plans.Listen):
                if step.channel not in self._listening:
                    conn.execute(f"LISTEN {step.channel}")
                    self._listening.add(step.channel)
                return None
            for _ in conn.notifies(timeout=max(step.seconds, 0.0), stop_after=1):
                pass
            return None

    def request(
        self,
        id: str,
        services: Iterable[str],
        features: Mapping[str, Iterable[str]] | None = None,
        *,
        owner: str | None = None,
        idle_timeout: timedelta | float | None = None,
        persistent: bool | None = None,
        owner_container: str | None = None,
        attach: Iterable[str] | None = None,
        idle_action: str | None = None,
        isolation: str | None = None,
        seeds: Mapping[str, str] | None = None,
    ) -> Revision:
        """Asks for sandbox ``id`` with ``services`` (``["postgres",
        "redis"]``) and ``features`` (``{"postgres": ["pg_trgm"]}``), or
        adds them to its row (``sandbox_request``: additive, never removes).
        Returns the revision to :meth:`wait` for."""
        params = _sql.request_params(
            id,
            services,
            features,
            owner=owner,
            idle_timeout=idle_timeout,
            persistent=persistent,
            owner_container=owner_container,
            attach=attach,
            idle_action=idle_action,
            isolation=isolation,
            seeds=seeds,
        )
        return self._run(_plans.request(id, params))

    def wait(self, id: str, revision: Revision, timeout: float = 90.0) -> Status:
        """Waits until the status of ``revision`` is ready and returns it.

        Raises :class:`SandboxFailedError` (with the status's message) when
        it failed, :class:`ReleasedError` when the row was released
        meanwhile, and :class:`WaitTimeoutError` (naming the last phase)
        after ``timeout`` seconds."""
        return self._run(_plans.wait(id, revision, timeout))

    def request_and_wait(
        self,
        id: str,
        services: Iterable[str],
        features: Mapping[str, Iterable[str]] | None = None,
        *,
        timeout: float = 90.0,
        **options: Any,
    ) -> Status:
        """:meth:`request`, then :meth:`wait` for it."""
        revision = self.request(id, services, features, **options)
        return self.wait(id, revision, timeout)

    def get(self, id: str) -> Status | None:
        """The sandbox's status, if sandboxd wrote one (and this role may
        see it)."""
        return self._run(_plans.get(id))

    def touch(self, id: str) -> bool:
        """Marks the sandbox used (its idle timeout restarts; a paused one
        resumes). False if there was no row to touch."""
        return self._run(_plans.answer(_sql.TOUCH, id))

    def release(self, id: str) -> bool:
        """Deletes the row; sandboxd tears the containers down. False if
        there was no row."""
        return self._run(_plans.answer(_sql.RELEASE, id))

    def fork(
        self,
        source: str,
        id: str,
        *,
        owner: str | None = None,
        idle_timeout: timedelta | float | None = None,
        owner_container: str | None = None,
        attach: Iterable[str] | None = None,
    ) -> Revision:
        """Asks for sandbox ``id`` as a copy of ``source``'s data now
        (``sandbox_fork``); :meth:`wait` for the revision."""
        return self._run(_plans.fork(source, id, owner, idle_timeout, owner_container, attach))

    def checkpoint(self, id: str, name: str, timeout: float = 60.0) -> Checkpoint:
        """Records the sandbox's data as checkpoint ``name`` and waits until
        sandboxd took it."""
        return self._run(_plans.checkpoint(id, name, timeout))

    def reset(self, id: str, name: str | None = None, timeout: float = 60.0) -> None:
        """Puts the sandbox's data back to checkpoint ``name`` (``None``: the
        empty baseline) and waits until sandboxd did."""
        self._run(_plans.reset(id, name, timeout))

    def checkpoints(self, id: str) -> list[Checkpoint]:
        """The sandbox's checkpoints, by name."""
        return self._run(_plans.checkpoints(id))

    def seed_put(self, engine: str, content: bytes | str, *, owner: str | None = None) -> str:
        """Registers seed ``content`` (SQL or a ``pg_dump`` archive for
        Postgres, commands for Redis/Valkey) and returns its hash, to name
        in ``request(..., seeds={engine: hash})``."""
        return self._run(_plans.seed_put(engine, content, owner))

    def seed_delete(self, hash: str, *, owner: str | None = None) -> bool:
        """Deletes a seed; False if there was none."""
        return self._run(_plans.answer(_sql.SEED_DELETE, hash, owner))

    def events(self, id: str, limit: int = 50) -> list[Event]:
        """The sandbox's newest ``limit`` events, oldest first."""
        return self._run(_plans.events(id, limit))

    def event(self, seq: int) -> Event | None:
        """The event numbered ``seq``, if this role may see it."""
        return self._run(_plans.event(seq))

    def event_notices(self) -> EventNotices:
        """Every event of the sandboxes this role may see that sandboxd
        records from the moment this is entered, as its ``NOTIFY
        sandbox_events`` announces it::

            with client.event_notices() as notices:
                ...                                  # nothing is missed from here
                for notice in notices.until(60):     # or: for notice in notices
                    if notice.incarnation == revision.incarnation: ...

        A notification is a hint: any role may send one, and it names only
        the event's ``seq``. Each is yielded after its event's row is read
        from ``sandbox_events`` (under this role's row-level security), so
        what a notice says is the row's: a payload that is not sandboxd's
        is skipped and counted in ``malformed``, one naming an event this
        role may not see (another owner's, or gone) in ``unseen``. A
        notification is lost while the database skips them (its queue is
        filling) or the connection is down: read :meth:`events` for what
        matters. Listens and reads on two connections of its own, so the
        client stays usable meanwhile."""
        return EventNotices(self._dsn, self._connect_timeout)


class EventNotices:
    """A listener on ``sandbox_events``: see :meth:`Client.event_notices`."""

    def __init__(self, dsn: str, connect_timeout: float) -> None:
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        # The listening connection is busy while notifications are
        # awaited: rows are read on another.
        self._reader: psycopg.Connection[Any] | None = None
        #: Payloads skipped because they were not sandboxd's.
        self.malformed = 0
        #: Notices skipped because they named no event this role may see.
        self.unseen = 0

    def __enter__(self) -> EventNotices:
        self._reader = _connect(self._dsn, self._connect_timeout)
        self._conn = _connect(self._dsn, self._connect_timeout)
        self._conn.execute("LISTEN sandbox_events")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._reader is not None:
            self._reader.close()

    def __iter__(self) -> Iterator[EventNotice]:
        return self.until(None)

    def until(self, timeout: float | None) -> Iterator[EventNotice]:
        """The notices that arrive within ``timeout`` seconds (``None``:
        for ever)."""
        if self._conn is None or self._reader is None:
            raise RuntimeError("use `with client.event_notices() as notices:`")
        for n in self._conn.notifies(timeout=timeout):
            if n.channel != "sandbox_events":
                continue
            seq = notice_seq(n.payload)
            if seq is None:
                self.malformed += 1
                continue
            with refusals():
                row = self._reader.execute(_sql.EVENT, (seq,)).fetchone()
            if row is None:
                self.unseen += 1
                continue
            yield EventNotice.from_event(_sql.event_from_row(row))
