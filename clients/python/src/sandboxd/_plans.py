"""Each verb as a plan: a generator that yields the steps it needs (a
query, a transaction, a LISTEN, a doze until a notification) and gets
their answers back, with no I/O of its own. :class:`~sandboxd.Client` runs
plans with blocking calls and :class:`~sandboxd.AsyncClient` with awaited
ones, so the two cannot drift apart (the shape of h11 and other sans-I/O
protocol libraries)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from . import _sql
from ._errors import CheckpointTimeoutError, WaitTimeoutError
from ._types import Checkpoint, Event, Revision, Status, status_from_row

T = TypeVar("T")

Row = tuple[Any, ...]


@dataclass(frozen=True)
class One:
    """Run ``sql``; answer its first row (``None``: none)."""

    sql: str
    params: Any = None


@dataclass(frozen=True)
class All:
    """Run ``sql``; answer all its rows."""

    sql: str
    params: Any = None


@dataclass(frozen=True)
class Transaction:
    """Run each statement in one transaction; answer each one's first row."""

    statements: tuple[One, ...]


@dataclass(frozen=True)
class Listen:
    """``LISTEN channel`` on the client's connection (once); answers ``None``."""

    channel: str


@dataclass(frozen=True)
class Doze:
    """Wait until a notification arrives or ``seconds`` pass; answers ``None``."""

    seconds: float


Step = One | All | Transaction | Listen | Doze
Plan = Generator[Step, Any, T]


def _revision(sql: str, params: Mapping[str, Any], sandbox_id: str) -> Plan[Revision]:
    generation, incarnation = yield Transaction(
        (One(sql, params), One(_sql.INCARNATION, (sandbox_id,)))
    )
    return _sql.revision(
        generation and generation[0], incarnation and incarnation[0], sandbox_id
    )


def request(sandbox_id: str, params: Mapping[str, Any]) -> Plan[Revision]:
    return (yield from _revision(_sql.REQUEST, params, sandbox_id))


def fork(
    source: str,
    sandbox_id: str,
    owner: str | None,
    idle_timeout: timedelta | float | None,
    owner_container: str | None,
    attach: Iterable[str] | None,
) -> Plan[Revision]:
    params = {
        "source": source,
        "id": sandbox_id,
        "owner": owner,
        "idle_timeout": _sql.interval(idle_timeout),
        "owner_container": owner_container,
        "attach": None if attach is None else list(attach),
    }
    return (yield from _revision(_sql.FORK, params, sandbox_id))


def _until(
    channel: str,
    timeout: float,
    look: Callable[[], Plan[T | None]],
    late: Callable[[], Exception],
) -> Plan[T]:
    """Looks (``look``: a plan answering ``None`` while not done) after
    each notification on ``channel`` and every second, until it answers or
    ``timeout`` passes (then raises ``late()``)."""
    yield Listen(channel)
    deadline = time.monotonic() + timeout
    while True:
        done = yield from look()
        if done is not None:
            return done
        left = deadline - time.monotonic()
        if left <= 0:
            raise late()
        yield Doze(min(left, _sql.RECHECK))


def wait(sandbox_id: str, revision: Revision, timeout: float) -> Plan[Status]:
    seen: list[Status | None] = [None]

    def look() -> Plan[Status | None]:
        status, ready = _sql.judge(sandbox_id, revision, (yield One(_sql.WAIT, (sandbox_id,))))
        seen[0] = status
        return status if ready else None

    return (
        yield from _until(
            "sandbox_status", timeout, look, lambda: WaitTimeoutError(sandbox_id, timeout, seen[0])
        )
    )


def checkpoint(sandbox_id: str, name: str, timeout: float) -> Plan[Checkpoint]:
    asked = yield One(_sql.CHECKPOINT, (sandbox_id, name))
    request = int(asked[0]) if asked else 0

    def look() -> Plan[Checkpoint | None]:
        row = yield One(_sql.CHECKPOINT_ROW, (sandbox_id, name))
        return _sql.checkpoint_outcome(sandbox_id, name, request, row)

    return (
        yield from _until(
            "sandbox_events",
            timeout,
            look,
            lambda: CheckpointTimeoutError(sandbox_id, "checkpoint", name, timeout),
        )
    )


def reset(sandbox_id: str, name: str | None, timeout: float) -> Plan[bool]:
    asked = yield One(_sql.RESET, (sandbox_id, name))
    request = int(asked[0]) if asked else 0
    shown = name or "baseline"

    def look() -> Plan[bool | None]:
        row = yield One(_sql.RESET_ROW, (request,))
        return True if _sql.reset_outcome(sandbox_id, shown, row) else None

    return (
        yield from _until(
            "sandbox_events",
            timeout,
            look,
            lambda: CheckpointTimeoutError(sandbox_id, "reset", shown, timeout),
        )
    )


def get(sandbox_id: str) -> Plan[Status | None]:
    row = yield One(_sql.GET, (sandbox_id,))
    return None if row is None else status_from_row(row)


def answer(sql: str, *params: Any) -> Plan[bool]:
    """A function that answers true or false (``sandbox_touch``, ...)."""
    row = yield One(sql, params)
    return bool(row and row[0])


def seed_put(engine: str, content: bytes | str, owner: str | None) -> Plan[str]:
    data = content.encode() if isinstance(content, str) else content
    row = yield One(_sql.SEED_PUT, (engine, data, owner))
    return str(row[0]) if row else ""


def checkpoints(sandbox_id: str) -> Plan[list[Checkpoint]]:
    rows = yield All(_sql.CHECKPOINTS, (sandbox_id,))
    return [_sql.checkpoint_from_row(r) for r in rows]


def events(sandbox_id: str, limit: int) -> Plan[list[Event]]:
    rows = yield All(_sql.EVENTS, (sandbox_id, limit))
    return [_sql.event_from_row(r) for r in rows]


def event(seq: int) -> Plan[Event | None]:
    row = yield One(_sql.EVENT, (seq,))
    return None if row is None else _sql.event_from_row(row)
