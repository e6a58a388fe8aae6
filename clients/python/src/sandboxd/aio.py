"""The asyncio client: :class:`AsyncClient`, the verbs of
:class:`sandboxd.Client` awaited (the same plans, :mod:`sandboxd._plans`,
run with awaited calls)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

import psycopg

from . import _plans, _sql
from ._errors import refusals
from ._types import Checkpoint, Event, EventNotice, Revision, Status, notice_seq

T = TypeVar("T")


async def _connect(dsn: str, connect_timeout: float) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, connect_timeout=max(1, int(connect_timeout))
    )


class AsyncClient:
    """:class:`sandboxd.Client` for asyncio: ``async with await
    AsyncClient.connect(dsn) as client:``. One operation at a time per
    client (it holds one connection); make one per task that waits
    concurrently."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], dsn: str, connect_timeout: float) -> None:
        self._conn = conn
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._listening: set[str] = set()

    @classmethod
    async def connect(cls, dsn: str, *, connect_timeout: float = 10.0) -> AsyncClient:
        return cls(await _connect(dsn, connect_timeout), dsn, connect_timeout)

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _run(self, plan: _plans.Plan[T]) -> T:
        """Runs ``plan``, answering each of its steps."""
        try:
            step = next(plan)
            while True:
                step = plan.send(await self._do(step))
        except StopIteration as done:
            result: T = done.value
            return result

    async def _do(self, step: _plans.Step) -> Any:
        conn = self._conn
        with refusals():
            if isinstance(step, _plans.One):
                return await (await conn.execute(step.sql, step.params)).fetchone()
            if isinstance(step, _plans.All):
                return await (await conn.execute(step.sql, step.params)).fetchall()
            if isinstance(step, _plans.Transaction):
                async with conn.transaction():
                    return [
                        await (await conn.execute(s.sql, s.params)).fetchone()
                        for s in step.statements
                    ]
            if isinstance(step, _plans.Listen):
                if step.channel not in self._listening:
                    await conn.execute(f"LISTEN {step.channel}")
                    self._listening.add(step.channel)
                return None
            async for _ in conn.notifies(timeout=max(step.seconds, 0.0), stop_after=1):
                pass
            return None

    async def request(
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
        """See :meth:`sandboxd.Client.request`."""
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
        return await self._run(_plans.request(id, params))

    async def wait(self, id: str, revision: Revision, timeout: float = 90.0) -> Status:
        """See :meth:`sandboxd.Client.wait`."""
        return await self._run(_plans.wait(id, revision, timeout))

    async def request_and_wait(
        self,
        id: str,
        services: Iterable[str],
        features: Mapping[str, Iterable[str]] | None = None,
        *,
        timeout: float = 90.0,
        **options: Any,
    ) -> Status:
        """:meth:`request`, then :meth:`wait` for it."""
        revision = await self.request(id, services, features, **options)
        return await self.wait(id, revision, timeout)

    async def get(self, id: str) -> Status | None:
        """See :meth:`sandboxd.Client.get`."""
        return await self._run(_plans.get(id))

    async def touch(self, id: str) -> bool:
        """See :meth:`sandboxd.Client.touch`."""
        return await self._run(_plans.answer(_sql.TOUCH, id))

    async def release(self, id: str) -> bool:
        """See :meth:`sandboxd.Client.release`."""
        return await self._run(_plans.answer(_sql.RELEASE, id))

    async def fork(
        self,
        source: str,
        id: str,
        *,
        owner: str | None = None,
        idle_timeout: timedelta | float | None = None,
        owner_container: str | None = None,
        attach: Iterable[str] | None = None,
    ) -> Revision:
        """See :meth:`sandboxd.Client.fork`."""
        return await self._run(
            _plans.fork(source, id, owner, idle_timeout, owner_container, attach)
        )

    async def checkpoint(self, id: str, name: str, timeout: float = 60.0) -> Checkpoint:
        """See :meth:`sandboxd.Client.checkpoint`."""
        return await self._run(_plans.checkpoint(id, name, timeout))

    async def reset(self, id: str, name: str | None = None, timeout: float = 60.0) -> None:
        """See :meth:`sandboxd.Client.reset`."""
        await self._run(_plans.reset(id, name, timeout))

    async def checkpoints(self, id: str) -> list[Checkpoint]:
        """See :meth:`sandboxd.Client.checkpoints`."""
        return await self._run(_plans.checkpoints(id))

    async def seed_put(self, engine: str, content: bytes | str, *, owner: str | None = None) -> str:
        """See :meth:`sandboxd.Client.seed_put`."""
        return await self._run(_plans.seed_put(engine, content, owner))

    async def seed_delete(self, hash: str, *, owner: str | None = None) -> bool:
        """See :meth:`sandboxd.Client.seed_delete`."""
        return await self._run(_plans.answer(_sql.SEED_DELETE, hash, owner))

    async def events(self, id: str, limit: int = 50) -> list[Event]:
        """See :meth:`sandboxd.Client.events`."""
        return await self._run(_plans.events(id, limit))

    async def event(self, seq: int) -> Event | None:
        """See :meth:`sandboxd.Client.event`."""
        return await self._run(_plans.event(seq))

    def event_notices(self) -> AsyncEventNotices:
        """``async with client.event_notices() as notices: async for notice
        in notices: ...``: every event sandboxd records from the moment it
        is entered; see :meth:`sandboxd.Client.event_notices`."""
        return AsyncEventNotices(self._dsn, self._connect_timeout)


class AsyncEventNotices:
    """A listener on ``sandbox_events``: see :meth:`AsyncClient.event_notices`."""

    def __init__(self, dsn: str, connect_timeout: float) -> None:
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None
        # The listening connection is busy while notifications are
        # awaited: rows are read on another.
        self._reader: psycopg.AsyncConnection[Any] | None = None
        #: Payloads skipped because they were not sandboxd's.
        self.malformed = 0
        #: Notices skipped because they named no event this role may see.
        self.unseen = 0

    async def __aenter__(self) -> AsyncEventNotices:
        self._reader = await _connect(self._dsn, self._connect_timeout)
        self._conn = await _connect(self._dsn, self._connect_timeout)
        await self._conn.execute("LISTEN sandbox_events")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._conn is not None:
            await self._conn.close()
        if self._reader is not None:
            await self._reader.close()

    def __aiter__(self) -> AsyncIterator[EventNotice]:
        return self.until(None)

    async def until(self, timeout: float | None) -> AsyncIterator[EventNotice]:
        """The notices that arrive within ``timeout`` seconds (``None``:
        for ever)."""
        if self._conn is None or self._reader is None:
            raise RuntimeError("use `async with client.event_notices() as notices:`")
        async for n in self._conn.notifies(timeout=timeout):
            if n.channel != "sandbox_events":
                continue
            seq = notice_seq(n.payload)
            if seq is None:
                self.malformed += 1
                continue
            with refusals():
                cur = await self._reader.execute(_sql.EVENT, (seq,))
                row = await cur.fetchone()
            if row is None:
                self.unseen += 1
                continue
            yield EventNotice.from_event(_sql.event_from_row(row))
