"""The typed results, without a database: what ``Status.env`` renames and
what a ``repr`` never shows."""

from __future__ import annotations

import pytest

from sandboxd import Status
from sandboxd._types import notice_seq
from sandboxd._types import status_from_row

SERVICES = {
    "postgres": {
        "host": "postgres", "port": 5432, "host_port": 49153, "user": "sandbox",
        "password": "hunter2-hunter2", "database": "sandbox",
        "url": "postgres://sandbox:hunter2-hunter2@postgres:5432/sandbox",
        "env": {
            "SANDBOX_DB_HOST": "postgres", "SANDBOX_DB_PORT": "5432", "SANDBOX_DB_USER": "sandbox",
            "SANDBOX_DB_PASSWORD": "hunter2-hunter2", "SANDBOX_DB_ADMIN_DB": "sandbox",
            "SANDBOX_DB_NAME": "sandbox", "SANDBOX_DB_URL": "postgres://…",
        },
        "available_extensions": ["pg_trgm"], "instance": "i1",
        "ready_at": "2026-11-30T14:28:25.123Z", "heals": 2, "image": "sandboxd/postgres:17",
    },
    "mongo": {
        "host": "mongo", "port": 27017, "host_port": 49154, "user": "sandbox",
        "password": "s3cret-s3cret", "database": "sandbox", "url": "mongodb://…",
        "env": {"SANDBOX_MONGO_AUTH_DB": "admin", "SANDBOX_MONGO_DB": "sandbox"},
        "instance": "i2", "heals": 0, "image": "mongo",
    },
}


def status() -> Status:
    return status_from_row(
        ("agent-7", "ready", 3, "", SERVICES, "sandboxd.default.agent-7", "0b6f", None)
    )


@pytest.mark.parametrize(
    ("prefix", "name", "value"),
    [
        (None, "SANDBOX_DB_HOST", "postgres"),
        ("ROBOCO_TEST", "ROBOCO_TEST_DB_HOST", "postgres"),
        ("ROBOCO_TEST", "ROBOCO_TEST_DB_ADMIN_DB", "sandbox"),
        ("ROBOCO_TEST", "ROBOCO_TEST_DB_PASSWORD", "hunter2-hunter2"),
        ("ROBOCO_TEST", "ROBOCO_TEST_MONGO_AUTH_DB", "admin"),
        ("ROBOCO_TEST", "ROBOCO_TEST_MONGO_DB", "sandbox"),
    ],
)
def test_env_gives_the_provisioner_s_names(prefix: str | None, name: str, value: str) -> None:
    env = status().env(prefix)
    assert env[name] == value
    assert len(env) == 9


def test_a_repr_never_shows_a_credential() -> None:
    s = status()
    assert s.engines["postgres"].heals == 2
    assert s.engines["postgres"].ready_at is not None
    for secret in ("hunter2", "s3cret"):
        assert secret not in repr(s)


def test_a_notice_names_only_its_seq_and_anything_else_is_malformed() -> None:
    assert (
        notice_seq(
            '{"seq": 42, "incarnation": "0b6f", "reason": "healed", "engine": "redis",'
            ' "count": 1, "first_at": "2026-12-02T00:15:47.906632Z",'
            ' "last_at": "2026-12-02T00:15:47.906632Z"}'
        )
        == 42
    )
    # Any role may NOTIFY on the channel: none of these is sandboxd's.
    for payload in (
        "not json",
        "",
        "[1]",
        "42",
        '{"reason": "failed"}',
        '{"seq": "42"}',
        '{"seq": true}',
        '{"seq": 0}',
        '{"seq": -1}',
        '{"seq": 1.5}',
        '{"seq": 9223372036854775808}',
    ):
        assert notice_seq(payload) is None, payload
