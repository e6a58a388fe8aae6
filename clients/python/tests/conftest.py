"""Fixtures of the client's tests, which run against a real sandboxd and
its state database: tests/integration/python_client.rs (run by
scripts/test.sh) starts both and passes

- ``SANDBOXD_TEST_DSN``: an orchestrator role that sees only its own rows;
- ``SANDBOXD_TEST_DEPLOYMENT``: the controller's deployment (container names).

Its controller takes Postgres features from the plain image, which has
contrib (``pg_trgm``) but not pgvector: a request for ``vector`` fails.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from sandboxd import Client, Engine


def _setting(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: these tests run against a real controller; "
            "run them with scripts/test.sh --test integration -- python_client::"
        )
    return value


@pytest.fixture(scope="session")
def dsn() -> str:
    return _setting("SANDBOXD_TEST_DSN")


@pytest.fixture(scope="session")
def deployment() -> str:
    return _setting("SANDBOXD_TEST_DEPLOYMENT")


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    with Client(dsn) as c:
        yield c


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def connect(engine: Engine) -> psycopg.Connection[tuple[object, ...]]:
    """The sandbox's Postgres, from the Docker host."""
    return psycopg.connect(
        host="127.0.0.1",
        port=engine.host_port,
        user=engine.user,
        password=engine.password,
        dbname=engine.database,
        connect_timeout=10,
        autocommit=True,
    )


def docker_kill(deployment: str, sandbox_id: str, engine: str) -> None:
    """``docker kill`` of the sandbox's engine container, as a chaos test does."""
    subprocess.run(
        ["docker", "kill", f"sandboxd.{deployment}.{sandbox_id}.{engine}"],
        check=True,
        capture_output=True,
        timeout=30,
    )
