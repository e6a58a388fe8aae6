"""sandboxd's client for orchestrators in Python.

Request throwaway Postgres, Redis, Valkey and Mongo sandboxes through
sandboxd's state database, wait for them (woken by ``LISTEN``), and read
their credentials, events and checkpoints::

    from sandboxd import Client

    with Client("postgres://orchestrator:...@127.0.0.1:5432/sandboxd") as c:
        status = c.request_and_wait("agent-7", ["postgres", "redis"],
                                    {"postgres": ["pg_trgm"]})
        env = status.env(prefix="ROBOCO_TEST")   # ROBOCO_TEST_DB_HOST, ...
        ...
        c.release("agent-7")

The contract behind it: docs/contract.md of the sandboxd repository.
"""

from ._errors import (
    CheckpointFailedError,
    CheckpointTimeoutError,
    ConflictError,
    InvalidRequestError,
    LimitExceededError,
    NotFoundError,
    PermissionDeniedError,
    RefusedError,
    ReleasedError,
    SandboxdError,
    SandboxFailedError,
    UnsupportedError,
    WaitTimeoutError,
)
from ._types import Checkpoint, Engine, Event, EventNotice, Phase, Revision, Status
from .aio import AsyncClient, AsyncEventNotices
from .client import Client, EventNotices

__all__ = [
    "AsyncClient",
    "AsyncEventNotices",
    "Checkpoint",
    "CheckpointFailedError",
    "CheckpointTimeoutError",
    "Client",
    "ConflictError",
    "Engine",
    "Event",
    "EventNotice",
    "EventNotices",
    "InvalidRequestError",
    "LimitExceededError",
    "NotFoundError",
    "PermissionDeniedError",
    "Phase",
    "RefusedError",
    "ReleasedError",
    "Revision",
    "SandboxFailedError",
    "SandboxdError",
    "Status",
    "UnsupportedError",
    "WaitTimeoutError",
]

__version__ = "0.1.0"
