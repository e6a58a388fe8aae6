"""Every verb of :class:`sandboxd.Client` against the real controller."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from conftest import connect, docker_kill, new_id

from sandboxd import (
    CheckpointFailedError,
    Client,
    InvalidRequestError,
    NotFoundError,
    ReleasedError,
    SandboxFailedError,
    WaitTimeoutError,
)


def test_request_wait_get_env_touch_events_release(client: Client) -> None:
    sid = new_id("py")
    revision = client.request(
        sid, ["postgres", "redis"], {"postgres": ["pg_trgm"]}, idle_timeout=1800
    )
    assert revision.generation == 1
    status = client.wait(sid, revision, timeout=90)
    assert status.phase == "ready"
    assert status.incarnation == revision.incarnation
    assert set(status.engines) == {"postgres", "redis"}
    pg = status.engines["postgres"]
    assert "pg_trgm" in pg.available_extensions
    with connect(pg) as db:
        row = db.execute("SELECT current_user, similarity('sandbox', 'sandboxd')").fetchone()
    assert row is not None and row[0] == "sandbox"

    # The provisioner's variables, under its prefix; never in a repr.
    env = status.env(prefix="ROBOCO_TEST")
    assert env["ROBOCO_TEST_DB_PASSWORD"] == pg.password
    assert env["ROBOCO_TEST_DB_PORT"] == str(pg.port)
    for name in ("DB_HOST", "DB_USER", "DB_ADMIN_DB", "REDIS_HOST", "REDIS_PORT", "REDIS_PASSWORD"):
        assert f"ROBOCO_TEST_{name}" in env, env.keys()
    assert all(k.startswith("SANDBOX_") for k in status.env())
    assert pg.password not in repr(status)

    got = client.get(sid)
    assert got is not None and got.engines["postgres"].password == pg.password
    assert client.get(new_id("absent")) is None

    assert client.touch(sid) is True
    reasons = [e.reason for e in client.events(sid)]
    assert reasons.count("provisioned") + reasons.count("claimed") == 2, reasons
    assert all(e.sandbox_id == sid for e in client.events(sid))

    # Asking again for more adds to the row: a new generation to wait for.
    grown = client.request(sid, ["postgres"], {"redis": ["search"]})
    assert grown.incarnation == revision.incarnation
    assert grown.generation > revision.generation
    assert "search" in client.wait(sid, grown).engines["redis"].available_extensions

    assert client.release(sid) is True
    assert client.release(sid) is False
    assert client.touch(sid) is False


def test_a_failed_request_raises_with_the_status_message(client: Client) -> None:
    sid = new_id("pyfail")
    with pytest.raises(SandboxFailedError) as failed:
        client.request_and_wait(sid, ["postgres"], {"postgres": ["vector"]}, timeout=90)
    assert failed.value.status.phase == "failed"
    assert "vector" in failed.value.message and "--features-image" in failed.value.message
    assert failed.value.sandbox_id == sid
    client.release(sid)


def test_refusals_are_typed_and_carry_the_server_s_message(client: Client) -> None:
    with pytest.raises(InvalidRequestError) as bad:
        client.request(new_id("pybad"), ["oracle"])
    assert bad.value.sqlstate is not None
    assert "oracle" in bad.value.message
    with pytest.raises(InvalidRequestError):
        client.request("Not An Id!", ["postgres"])
    with pytest.raises(NotFoundError):
        client.checkpoint(new_id("absent"), "one", timeout=5)
    with pytest.raises(TypeError):
        client.request(new_id("pybad"), "postgres")


def test_a_wait_that_times_out_names_the_last_phase(client: Client) -> None:
    sid = new_id("pyslow")
    revision = client.request(sid, ["postgres"])
    with pytest.raises(WaitTimeoutError) as late:
        client.wait(sid, revision, timeout=0.001)
    assert late.value.phase in (None, "pending", "provisioning")
    assert f"sandbox {sid} is not ready after" in str(late.value)
    # The same revision is still worth waiting for.
    assert client.wait(sid, revision, timeout=90).phase == "ready"
    client.release(sid)
    with pytest.raises(ReleasedError):
        client.wait(sid, revision, timeout=10)


def test_a_wait_sees_a_heal_announced_by_an_event_notice(client: Client, deployment: str) -> None:
    sid = new_id("pyheal")
    revision = client.request(sid, ["postgres"])
    before = client.wait(sid, revision).engines["postgres"]
    with client.event_notices() as notices:
        docker_kill(deployment, sid, "postgres")
        healed = next(
            n
            for n in notices.until(90)
            if n.incarnation == revision.incarnation and n.reason == "healed"
        )
    assert healed.engine == "postgres"
    after = client.wait(sid, revision, timeout=90).engines["postgres"]
    assert after.heals == 1
    assert after.instance != before.instance
    assert after.password == before.password
    with connect(after) as db:
        assert db.execute("SELECT 1").fetchone() == (1,)
    event = client.event(healed.seq)
    assert event is not None and event.sandbox_id == sid and event.reason == "healed"
    client.release(sid)


def test_event_notices_are_read_from_the_rows_they_name_and_forged_ones_are_skipped(
    client: Client, dsn: str
) -> None:
    # Any role may NOTIFY sandbox_events (issue 50): a payload that is not
    # JSON must not end the iteration, and a forged "failed" for one's own
    # sandbox must not be handed over as real.
    sid = new_id("pyforge")
    revision = client.request(sid, ["redis"])
    client.wait(sid, revision, timeout=90)
    # provisioned, or claimed from the warm pool (recorded just after the
    # status is written).
    deadline = time.monotonic() + 10
    while not (events := client.events(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    provisioned = events[0]
    forged = {
        "incarnation": revision.incarnation,
        "reason": "failed",
        "engine": "redis",
        "detail": "forged",
        "count": 1,
    }
    with client.event_notices() as notices, psycopg.connect(dsn, autocommit=True) as other:
        other.execute("NOTIFY sandbox_events, 'not json'")
        # A real event's seq, a made-up reason: the row's reason wins.
        other.execute(
            "SELECT pg_notify('sandbox_events', %s)",
            (json.dumps({**forged, "seq": provisioned.seq}),),
        )
        # An event that does not exist.
        other.execute(
            "SELECT pg_notify('sandbox_events', %s)",
            (json.dumps({**forged, "seq": 2**62}),),
        )
        got = [n for n in notices.until(3) if n.incarnation == revision.incarnation]
    assert notices.malformed == 1
    assert notices.unseen >= 1
    assert provisioned.reason != "failed"
    assert [(n.seq, n.reason, n.detail) for n in got] == [
        (provisioned.seq, provisioned.reason, provisioned.detail)
    ]
    client.release(sid)


def test_checkpoint_reset_fork_and_seeds(client: Client) -> None:
    sid = new_id("pyckpt")
    pg = client.request_and_wait(sid, ["postgres"]).engines["postgres"]
    with connect(pg) as db:
        db.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
    taken = client.checkpoint(sid, "one")
    assert taken.state == "ready" and taken.name == "one"
    assert [c.name for c in client.checkpoints(sid)] == ["one"]
    with connect(pg) as db:
        db.execute("INSERT INTO t VALUES (2)")
    client.reset(sid, "one")
    with connect(pg) as db:
        assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)
    with pytest.raises(NotFoundError):
        client.reset(sid, "never-taken")
    with pytest.raises(InvalidRequestError):
        client.checkpoint(sid, "Bad Name")

    fork = new_id("pyfork")
    copy = client.wait(fork, client.fork(sid, fork)).engines["postgres"]
    assert copy.password != pg.password
    with connect(copy) as db:
        assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)

    client.reset(sid)  # the baseline: the empty database
    with connect(pg) as db:
        assert db.execute("SELECT to_regclass('t')").fetchone() == (None,)

    seed = client.seed_put("postgres", "CREATE TABLE seeded (x int); INSERT INTO seeded VALUES (42);")
    assert seed.startswith("sha256:")
    seeded = new_id("pyseed")
    status = client.request_and_wait(seeded, ["postgres"], seeds={"postgres": seed})
    assert status.engines["postgres"].seed == seed
    with connect(status.engines["postgres"]) as db:
        assert db.execute("SELECT x FROM seeded").fetchone() == (42,)
    for done in (sid, fork, seeded):
        assert client.release(done)
    assert client.seed_delete(seed) is True


def test_a_checkpoint_of_a_sandbox_being_released_fails_with_a_message(client: Client) -> None:
    sid = new_id("pygone")
    client.request_and_wait(sid, ["redis"])
    client.release(sid)
    with pytest.raises((CheckpointFailedError, NotFoundError)):
        client.checkpoint(sid, "late", timeout=10)
