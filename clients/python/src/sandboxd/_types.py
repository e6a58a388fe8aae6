"""What sandboxd answers, as typed values: a request's revision, a
sandbox's status and its engines, its events and checkpoints.

Each is built from the rows and JSON of docs/contract.md. A credential
(an engine's password, its URL, its environment) is never in a ``repr``,
so logging a status leaks nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

#: The phases of ``sandbox_status.phase``.
Phase = Literal[
    "pending", "provisioning", "ready", "healing", "failed", "terminating", "paused"
]

#: An engine's variables in ``env`` after the controller's ``--env-prefix``
#: (docs/contract.md): ``<PREFIX>_DB_HOST``, ``<PREFIX>_REDIS_URL`` ...
_REDIS_LIKE = ("HOST", "PORT", "PASSWORD", "DB", "URL")
_ENV_NAMES = tuple(
    f"_{family}_{name}"
    for family, names in (
        ("DB", ("HOST", "PORT", "USER", "PASSWORD", "ADMIN_DB", "NAME", "URL")),
        ("REDIS", _REDIS_LIKE),
        ("VALKEY", _REDIS_LIKE),
        ("MONGO", ("HOST", "PORT", "USER", "PASSWORD", "AUTH_DB", "DB", "URL")),
    )
    for name in names
)


@dataclass(frozen=True)
class Revision:
    """What a request asked for: wait for a status of this incarnation
    that observed at least this generation."""

    #: ``sandbox_desired.generation`` after the request.
    generation: int
    #: ``sandbox_desired.incarnation``: the row's random identity, new
    #: each time the id is inserted again.
    incarnation: str


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    text = str(value).replace("Z", "+00:00")
    return datetime.fromisoformat(text)


@dataclass(frozen=True)
class Engine:
    """One engine of a ready sandbox: where it answers and how to log in."""

    name: str
    #: Its name on the sandbox's network (``postgres``, ``redis``, ...).
    host: str
    port: int
    #: The port published on 127.0.0.1 of the Docker host (0: none).
    host_port: int
    user: str
    password: str = field(repr=False)
    database: str
    url: str = field(repr=False)
    env: Mapping[str, str] = field(repr=False)
    available_extensions: tuple[str, ...]
    #: A new random token for each container (a heal included).
    instance: str
    ready_at: datetime | None
    #: How many times this engine was healed with these credentials.
    heals: int
    image: str
    node: str | None = None
    seed: str | None = None

    @classmethod
    def from_json(cls, name: str, obj: Mapping[str, Any]) -> Engine:
        return cls(
            name=name,
            host=str(obj.get("host", "")),
            port=int(obj.get("port", 0)),
            host_port=int(obj.get("host_port", 0)),
            user=str(obj.get("user", "")),
            password=str(obj.get("password", "")),
            database=str(obj.get("database", "")),
            url=str(obj.get("url", "")),
            env={str(k): str(v) for k, v in (obj.get("env") or {}).items()},
            available_extensions=tuple(obj.get("available_extensions") or ()),
            instance=str(obj.get("instance", "")),
            ready_at=_time(obj.get("ready_at")),
            heals=int(obj.get("heals", 0)),
            image=str(obj.get("image", "")),
            node=obj.get("node"),
            seed=obj.get("seed"),
        )


@dataclass(frozen=True)
class Status:
    """A sandbox's ``sandbox_status`` row."""

    id: str
    phase: Phase
    #: The ``sandbox_desired.generation`` this status reflects.
    observed_generation: int
    #: Why (empty when ready; the error to act on when failed).
    message: str
    engines: Mapping[str, Engine]
    #: The Docker network its engines answer on.
    network: str | None
    #: The incarnation of the row it is about.
    incarnation: str | None
    updated_at: datetime | None

    def env(self, prefix: str | None = None) -> dict[str, str]:
        """Every engine's environment variables, as the provisioner
        sandboxd replaces emitted them: ``<PREFIX>_DB_HOST``, ``..._DB_PORT``,
        ``..._REDIS_PASSWORD`` and the rest. ``prefix`` (``"ROBOCO_TEST"``)
        replaces the controller's ``--env-prefix``; ``None`` keeps it."""
        out: dict[str, str] = {}
        for engine in self.engines.values():
            for key, value in engine.env.items():
                out[_reprefix(key, prefix)] = value
        return out


def _reprefix(key: str, prefix: str | None) -> str:
    """``key`` under ``prefix`` instead of the controller's (longest known
    name first: ``_DB_ADMIN_DB`` before ``_DB``); a name it does not know
    stays as it is."""
    if prefix is None:
        return key
    for name in sorted(_ENV_NAMES, key=len, reverse=True):
        if key.endswith(name) and len(key) > len(name):
            return prefix + name
    return key


def status_from_row(row: tuple[Any, ...]) -> Status:
    """A status from ``(id, phase, observed_generation, message, services,
    network, incarnation, updated_at)``."""
    sid, phase, observed, message, services, network, incarnation, updated = row
    if isinstance(services, str):
        services = json.loads(services)
    engines = {
        str(name): Engine.from_json(str(name), obj)
        for name, obj in (services or {}).items()
    }
    return Status(
        id=str(sid),
        phase=phase,
        observed_generation=int(observed),
        message=message or "",
        engines=engines,
        network=network,
        incarnation=None if incarnation is None else str(incarnation),
        updated_at=_time(updated),
    )


@dataclass(frozen=True)
class Event:
    """One row of ``sandbox_events``: what sandboxd did to a sandbox."""

    seq: int
    sandbox_id: str
    incarnation: str | None
    owner: str
    #: ``provisioned``, ``claimed``, ``healed``, ``rotated``, ``reaped``,
    #: ``failed``, ``backoff``, ``waiting``, ``paused``, ``resumed``,
    #: ``checkpointed``, ``reset``, ``seeded``, ``forked``.
    reason: str
    engine: str | None
    detail: str | None
    message: str
    count: int
    first_at: datetime
    last_at: datetime


@dataclass(frozen=True)
class EventNotice:
    """One event of a sandbox this role may see, announced by ``NOTIFY
    sandbox_events`` and read from its row in ``sandbox_events`` (the
    payload is only a hint: any role may send one). Match
    ``incarnation`` with your own rows, or read the whole event by
    ``seq`` with :meth:`Client.event`."""

    seq: int
    incarnation: str | None
    reason: str
    engine: str | None
    detail: str | None
    count: int
    first_at: datetime | None
    last_at: datetime | None

    @classmethod
    def from_event(cls, event: Event) -> EventNotice:
        return cls(
            seq=event.seq,
            incarnation=event.incarnation,
            reason=event.reason,
            engine=event.engine,
            detail=event.detail,
            count=event.count,
            first_at=event.first_at,
            last_at=event.last_at,
        )


def notice_seq(payload: str) -> int | None:
    """The event a ``NOTIFY sandbox_events`` payload names (its ``seq``),
    or None when the payload is not one sandboxd sends: any role may
    NOTIFY on the channel, so it may be anything."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    seq = obj.get("seq")
    # bool is an int to Python; a seq is a positive bigint.
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq < 2**63:
        return None
    return seq


@dataclass(frozen=True)
class Checkpoint:
    """One row of ``sandbox_checkpoints``."""

    name: str
    #: The request's number (``sandbox_checkpoint``'s answer).
    request: int
    #: ``requested``, ``ready`` or ``failed``.
    state: str
    message: str
    size_bytes: int | None
    requested_at: datetime
    done_at: datetime | None
