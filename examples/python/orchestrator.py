#!/usr/bin/env python3
"""An orchestrator in Python with the sandboxd client package
(clients/python): request a sandbox with Postgres (pg_trgm) and Redis,
wait until it is ready, use both from the Docker host, touch it, release it.

    pip install ./clients/python          # psycopg 3 is its one dependency
    DATABASE_URL=postgres://agents:...@127.0.0.1:5432/sandboxd \\
        python3 examples/python/orchestrator.py [SANDBOX_ID]

Exits 1 on failure, with what sandboxd said.
"""
import os
import socket
import sys
import time
import uuid

import psycopg

import sandboxd

TIMEOUT = 90.0  # seconds to wait for ready


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def redis_ping(port, user, password):
    """AUTH and PING over raw RESP (no client library); PING's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        replies = s.makefile("rb")

        def call(*args):  # a command is an array of bulk strings
            words = [a.encode() for a in args]
            s.sendall(b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words))
            answer = replies.readline().decode(errors="replace").strip()
            if not answer.startswith("+"):  # "-WRONGPASS ...", "-ERR ..."
                fail(f"redis {args[0]} answered {answer or 'nothing'}")
            return answer[1:]

        call("AUTH", user, password)
        return call("PING")


def main():
    url = os.environ.get("DATABASE_URL") or fail("set DATABASE_URL to the state database")
    sid = sys.argv[1] if len(sys.argv) > 1 else f"example-py-{uuid.uuid4().hex[:8]}"
    with sandboxd.Client(url) as client:
        revision = client.request(sid, ["postgres", "redis"], {"postgres": ["pg_trgm"]},
                                  idle_timeout=30 * 60)
        print(f"requested {sid} at generation {revision.generation}, incarnation {revision.incarnation}")
        print(f"waiting for {sid} to be ready (at most {TIMEOUT:.0f} s)")
        started = time.monotonic()
        status = client.wait(sid, revision, timeout=TIMEOUT)  # woken by LISTEN sandbox_status
        pg, redis = status.engines["postgres"], status.engines["redis"]
        print(f"ready {sid} after {time.monotonic() - started:.1f} s: postgres on "
              f"127.0.0.1:{pg.host_port}, redis on 127.0.0.1:{redis.host_port}")

        # host_port is published on 127.0.0.1 for clients on the Docker host.
        with psycopg.connect(host="127.0.0.1", port=pg.host_port, user=pg.user,
                             password=pg.password, dbname=pg.database,
                             connect_timeout=10) as db:
            who, sim = db.execute("SELECT current_user, similarity('sandbox', 'sandboxd')").fetchone()
        print(f"connected to the sandbox postgres as {who}: pg_trgm similarity = {sim}")
        # Redis's login is its default user (the URL is redis://:PASSWORD@host:port/0).
        pong = redis_ping(redis.host_port, redis.user or "default", redis.password)
        print(f"connected to the sandbox redis: PING answered {pong}")

        if not client.touch(sid):
            fail(f"sandbox {sid} could not be touched: gone or being released")
        print(f"touched {sid}")
        if not client.release(sid):
            fail(f"sandbox {sid} could not be released: no such row")
        print(f"released {sid}")


if __name__ == "__main__":
    try:
        main()
    except (sandboxd.SandboxdError, psycopg.Error, OSError) as e:
        fail(f"{type(e).__name__}: {e}")
