"""Every verb of :class:`sandboxd.AsyncClient` against the real controller."""

from __future__ import annotations

import asyncio

import pytest
from conftest import connect, docker_kill, new_id

from sandboxd import (
    AsyncClient,
    InvalidRequestError,
    SandboxFailedError,
    WaitTimeoutError,
)


def test_the_async_client_does_what_the_blocking_one_does(dsn: str, deployment: str) -> None:
    asyncio.run(_every_verb(dsn, deployment))


async def _every_verb(dsn: str, deployment: str) -> None:
    async with await AsyncClient.connect(dsn) as client:
        sid = new_id("pyaio")
        revision = await client.request(sid, ["postgres"], idle_timeout=600)
        with pytest.raises(WaitTimeoutError):
            await client.wait(sid, revision, timeout=0.001)
        status = await client.wait(sid, revision)
        assert status.phase == "ready"
        pg = status.engines["postgres"]
        got = await client.get(sid)
        assert got is not None and got.incarnation == revision.incarnation
        assert await client.touch(sid)

        # The async iterator of event notices sees the heal; two waits
        # run at once on two clients.
        async with client.event_notices() as notices:
            docker_kill(deployment, sid, "postgres")
            async for notice in notices.until(90):
                if notice.incarnation == revision.incarnation and notice.reason == "healed":
                    break
            else:
                raise AssertionError("no healed notice within 90 s")
        async with await AsyncClient.connect(dsn) as other:
            second = new_id("pyaio2")
            healed, ready = await asyncio.gather(
                client.wait(sid, revision), other.request_and_wait(second, ["redis"])
            )
            assert healed.engines["postgres"].heals == 1
            assert healed.engines["postgres"].password == pg.password
            assert ready.phase == "ready"
            assert await other.release(second)
        assert [e.reason for e in await client.events(sid)][-1] == "healed"

        with connect(healed.engines["postgres"]) as db:
            db.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (7)")
        assert (await client.checkpoint(sid, "seven")).state == "ready"
        fork = new_id("pyaiofork")
        await client.wait(fork, await client.fork(sid, fork))
        await client.reset(sid)
        assert [c.name for c in await client.checkpoints(sid)] == ["seven"]
        await client.reset(sid, "seven")
        with connect(healed.engines["postgres"]) as db:
            assert db.execute("SELECT x FROM t").fetchone() == (7,)

        seed = await client.seed_put("redis", "SET greeting hello\n")
        seeded = new_id("pyaioseed")
        loaded = await client.request_and_wait(seeded, ["redis"], seeds={"redis": seed})
        assert loaded.engines["redis"].seed == seed
        failing = new_id("pyaiofail")
        with pytest.raises(SandboxFailedError):
            await client.request_and_wait(failing, ["postgres"], {"postgres": ["vector"]})
        with pytest.raises(InvalidRequestError):
            await client.request(new_id("pyaiobad"), ["oracle"])
        for done in (sid, fork, seeded, failing):
            assert await client.release(done)
        assert await client.seed_delete(seed)
