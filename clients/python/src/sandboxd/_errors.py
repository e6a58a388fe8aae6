"""The errors of the client: refusals by the state database's functions
(by SQLSTATE, with the server's message), and the outcomes of a wait."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from ._types import Status


class SandboxdError(Exception):
    """Every error this package raises."""


class RefusedError(SandboxdError):
    """A function or table of the state database refused the call; ``message``
    is the server's, which says what to do."""

    def __init__(self, sqlstate: str | None, message: str, hint: str | None = None) -> None:
        super().__init__(message if not hint else f"{message} ({hint})")
        self.sqlstate = sqlstate
        self.message = message
        self.hint = hint


class InvalidRequestError(RefusedError, ValueError):
    """A value the contract does not allow: an unknown engine or feature, a
    bad id or name, a field that may not change (22023, 23514, 23502, 22P02)."""


class PermissionDeniedError(RefusedError, PermissionError):
    """The role may not do this: not registered with ``sandboxd
    grant-orchestrator``, or another owner's row (42501)."""


class NotFoundError(RefusedError, LookupError):
    """No such sandbox (for this role), checkpoint or seed (P0002)."""


class LimitExceededError(RefusedError):
    """A limit was reached: checkpoints per sandbox, pending requests, a
    seed's size (54000)."""


class ConflictError(RefusedError):
    """The row is another's or in a state that refuses this (23505)."""


class UnsupportedError(RefusedError):
    """The engine does not do this (0A000)."""


_BY_SQLSTATE: dict[str, type[RefusedError]] = {
    "22023": InvalidRequestError,
    "23514": InvalidRequestError,
    "23502": InvalidRequestError,
    "22P02": InvalidRequestError,
    "22004": InvalidRequestError,
    "42501": PermissionDeniedError,
    "P0002": NotFoundError,
    "54000": LimitExceededError,
    "23505": ConflictError,
    "0A000": UnsupportedError,
}


def refused(error: psycopg.Error) -> RefusedError:
    """The typed error for what the server refused (a plain
    :class:`RefusedError` for a SQLSTATE without a class of its own)."""
    diag = error.diag
    cls = _BY_SQLSTATE.get(error.sqlstate or "", RefusedError)
    return cls(error.sqlstate, diag.message_primary or str(error), diag.message_hint)


@contextmanager
def refusals() -> Iterator[None]:
    """The server's refusals as typed errors; a lost connection as it is."""
    try:
        yield
    except psycopg.Error as e:
        if e.sqlstate is None or isinstance(e, psycopg.OperationalError):
            raise
        raise refused(e) from e


class SandboxFailedError(SandboxdError):
    """The sandbox's status is ``failed``: ``message`` says why."""

    def __init__(self, sandbox_id: str, status: Status) -> None:
        super().__init__(f"sandbox {sandbox_id} failed: {status.message}")
        self.sandbox_id = sandbox_id
        self.message = status.message
        self.status = status


class WaitTimeoutError(SandboxdError, TimeoutError):
    """The wait ended before the sandbox was ready; ``phase`` is the last
    phase seen for the request (``None``: no status of it yet)."""

    def __init__(self, sandbox_id: str, timeout: float, status: Status | None) -> None:
        if status is None:
            seen = "no status of this request yet"
        else:
            seen = f"last phase {status.phase}"
            if status.message:
                seen += f": {status.message}"
        super().__init__(f"sandbox {sandbox_id} is not ready after {timeout:g} s ({seen})")
        self.sandbox_id = sandbox_id
        self.timeout = timeout
        self.phase = None if status is None else status.phase
        self.status = status


class ReleasedError(SandboxdError):
    """The row was released (or released and requested again, as another
    incarnation) while waiting: request it again and wait for that."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(
            f"sandbox {sandbox_id} was released while waiting: request it again and wait for that"
        )
        self.sandbox_id = sandbox_id


class CheckpointFailedError(SandboxdError):
    """sandboxd could not take the checkpoint or do the reset; ``message``
    is what it said."""

    def __init__(self, sandbox_id: str, what: str, name: str, message: str) -> None:
        super().__init__(f"{what} {name} of sandbox {sandbox_id} failed: {message}")
        self.sandbox_id = sandbox_id
        self.what = what
        self.name = name
        self.message = message


class CheckpointTimeoutError(SandboxdError, TimeoutError):
    """The checkpoint or reset was not done within the timeout."""

    def __init__(self, sandbox_id: str, what: str, name: str, timeout: float) -> None:
        super().__init__(
            f"{what} {name} of sandbox {sandbox_id} was not done within {timeout:g} s; "
            f"is sandboxd running and the sandbox ready? (sandboxd describe {sandbox_id})"
        )
        self.sandbox_id = sandbox_id
        self.what = what
        self.name = name
        self.timeout = timeout
