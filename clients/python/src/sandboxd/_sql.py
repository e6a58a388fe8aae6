"""The statements the verbs' plans send, and what they make of the
answers: one place for the contract's SQL (docs/contract.md, "Plain SQL")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from ._errors import (
    CheckpointFailedError,
    ReleasedError,
    SandboxFailedError,
)
from ._types import Checkpoint, Event, Revision, Status, status_from_row

REQUEST = """SELECT sandbox_request(%(id)s, %(owner)s, %(services)s, %(features)s,
    p_idle_timeout => %(idle_timeout)s, p_persistent => %(persistent)s,
    p_owner_container => %(owner_container)s, p_attach => %(attach)s,
    p_idle_action => %(idle_action)s, p_isolation => %(isolation)s, p_seeds => %(seeds)s)"""

FORK = """SELECT sandbox_fork(%(source)s, %(id)s, %(owner)s, %(idle_timeout)s,
    %(owner_container)s, %(attach)s)"""

INCARNATION = "SELECT incarnation::text FROM sandbox_desired WHERE id = %s"

STATUS_COLUMNS = (
    "s.id, s.phase, s.observed_generation, s.message, s.services, s.network,"
    " s.incarnation::text, s.updated_at"
)

GET = f"SELECT {STATUS_COLUMNS} FROM sandbox_status s WHERE s.id = %s"

#: The row's incarnation and the status, read in one snapshot.
WAIT = f"""SELECT d.incarnation::text, {STATUS_COLUMNS}
  FROM (SELECT %s::text AS id) k
  LEFT JOIN sandbox_desired d ON d.id = k.id
  LEFT JOIN sandbox_status s ON s.id = k.id"""

TOUCH = "SELECT sandbox_touch(%s)"
RELEASE = "SELECT sandbox_release(%s)"
CHECKPOINT = "SELECT sandbox_checkpoint(%s, %s)"
RESET = "SELECT sandbox_reset(%s, %s)"
CHECKPOINT_ROW = """SELECT name, request, state, message, size_bytes, requested_at, done_at
  FROM sandbox_checkpoints WHERE sandbox_id = %s AND name = %s"""
CHECKPOINTS = """SELECT name, request, state, message, size_bytes, requested_at, done_at
  FROM sandbox_checkpoints WHERE sandbox_id = %s ORDER BY name"""
RESET_ROW = "SELECT state, message FROM sandbox_resets WHERE request = %s"
SEED_PUT = "SELECT sandbox_seed_put(%s, %s, %s)"
SEED_DELETE = "SELECT sandbox_seed_delete(%s, %s)"
EVENT_COLUMNS = (
    "seq, sandbox_id, incarnation::text, owner, reason, engine, detail, message,"
    " count, first_at, last_at"
)
EVENTS = f"""SELECT * FROM (SELECT {EVENT_COLUMNS} FROM sandbox_events
  WHERE sandbox_id = %s ORDER BY seq DESC LIMIT %s) newest ORDER BY seq"""
EVENT = f"SELECT {EVENT_COLUMNS} FROM sandbox_events WHERE seq = %s"

#: How often a wait looks again without a notification: NOTIFY is lost
#: while a connection is down, and a payload may be another row's.
RECHECK = 1.0


def interval(value: timedelta | float | None) -> timedelta | None:
    """A timeout as Postgres takes it: a timedelta, or seconds."""
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def request_params(
    sandbox_id: str,
    services: Iterable[str],
    features: Mapping[str, Iterable[str]] | None,
    *,
    owner: str | None,
    idle_timeout: timedelta | float | None,
    persistent: bool | None,
    owner_container: str | None,
    attach: Iterable[str] | None,
    idle_action: str | None,
    isolation: str | None,
    seeds: Mapping[str, str] | None,
) -> dict[str, Any]:
    if isinstance(services, str):
        raise TypeError("services is a list of engines, e.g. ['postgres', 'redis']")
    return {
        "id": sandbox_id,
        "owner": owner,
        "services": list(services),
        "features": Jsonb({e: list(f) for e, f in (features or {}).items()}),
        "idle_timeout": interval(idle_timeout),
        "persistent": persistent,
        "owner_container": owner_container,
        "attach": None if attach is None else list(attach),
        "idle_action": idle_action,
        "isolation": isolation,
        "seeds": None if seeds is None else Jsonb(dict(seeds)),
    }


def revision(generation: Any, incarnation: Any, sandbox_id: str) -> Revision:
    if generation is None or incarnation is None:
        raise ReleasedError(sandbox_id)
    return Revision(generation=int(generation), incarnation=str(incarnation))


def judge(
    sandbox_id: str, revision: Revision, row: tuple[Any, ...] | None
) -> tuple[Status | None, bool]:
    """One look of a wait: the status if it is the request's (its
    incarnation, at least its generation), and whether it is ready.
    Raises when it failed or the row is gone."""
    if row is None:
        raise ReleasedError(sandbox_id)
    desired, status_row = row[0], row[1:]
    status = None if status_row[0] is None else status_from_row(status_row)
    mine = (
        status is not None
        and status.incarnation == revision.incarnation
        and status.observed_generation >= revision.generation
    )
    if mine and status is not None:
        if status.phase == "ready":
            return status, True
        if status.phase == "failed":
            raise SandboxFailedError(sandbox_id, status)
    if desired != revision.incarnation:
        raise ReleasedError(sandbox_id)
    # The last status of this incarnation (an earlier generation's
    # included), for the timeout's message.
    same = status if status is not None and status.incarnation == revision.incarnation else None
    return same, False


def checkpoint_from_row(row: tuple[Any, ...]) -> Checkpoint:
    name, request, state, message, size, requested_at, done_at = row
    return Checkpoint(
        name=name,
        request=int(request),
        state=state,
        message=message,
        size_bytes=size,
        requested_at=requested_at,
        done_at=done_at,
    )


def checkpoint_outcome(
    sandbox_id: str, name: str, request: int, row: tuple[Any, ...] | None
) -> Checkpoint | None:
    """The checkpoint once sandboxd recorded it; ``None`` while requested."""
    c = None if row is None else checkpoint_from_row(row)
    if c is None or c.request != request:
        raise CheckpointFailedError(
            sandbox_id,
            "checkpoint",
            name,
            "it was asked again, or the sandbox was released, while waiting",
        )
    if c.state == "failed":
        raise CheckpointFailedError(sandbox_id, "checkpoint", name, c.message)
    return c if c.state == "ready" else None


def reset_outcome(sandbox_id: str, name: str, row: tuple[Any, ...] | None) -> bool:
    """Whether the reset is done; raises when it failed or went away."""
    if row is None:
        raise ReleasedError(sandbox_id)
    state, message = row
    if state == "failed":
        raise CheckpointFailedError(sandbox_id, "reset", name, message)
    return bool(state == "done")


def event_from_row(row: tuple[Any, ...]) -> Event:
    seq, sid, inc, owner, reason, engine, detail, message, count, first_at, last_at = row
    return Event(
        seq=int(seq),
        sandbox_id=sid,
        incarnation=inc,
        owner=owner,
        reason=reason,
        engine=engine,
        detail=detail,
        message=message,
        count=int(count),
        first_at=first_at,
        last_at=last_at,
    )
