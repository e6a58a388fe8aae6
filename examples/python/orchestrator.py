#!/usr/bin/env python3
"""An orchestrator in Python with psycopg 3 (docs/contract.md, "Plain SQL"): request a
sandbox with Postgres (pg_trgm) and Redis, wait until it is ready, use both
from the Docker host, touch it, release it.

    DATABASE_URL=postgres://agents:...@127.0.0.1:5432/sandboxd \
        python3 examples/python/orchestrator.py [SANDBOX_ID]

Needs psycopg >= 3.2 (pip install 'psycopg[binary]'). Exits 1 on failure.
"""
import os
import socket
import sys
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

TIMEOUT = 90.0  # seconds to wait for ready


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def request(conn, sid):
    """sandbox_request and the row's incarnation, in one transaction."""
    with conn.transaction():
        (gen,) = conn.execute(
            "SELECT sandbox_request(%s, NULL, '{postgres,redis}', %s, p_idle_timeout => '30 min')",
            (sid, Jsonb({"postgres": ["pg_trgm"]})),
        ).fetchone()
        (inc,) = conn.execute(
            "SELECT incarnation FROM sandbox_desired WHERE id = %s", (sid,)
        ).fetchone()
    return gen, inc


def wait_ready(conn, sid, gen, inc):
    """The status of this incarnation at this generation once ready."""
    conn.execute("LISTEN sandbox_status")  # payload: a status's incarnation, never an id
    deadline = time.monotonic() + TIMEOUT
    while True:
        row = conn.execute(
            "SELECT phase, observed_generation, incarnation, message, services"
            " FROM sandbox_status WHERE id = %s",
            (sid,),
        ).fetchone()
        if row and row[2] == inc and row[1] >= gen:
            if row[0] == "ready":
                return row[4]
            if row[0] == "failed":
                fail(f"sandbox {sid} failed: {row[3]}")
        mine = conn.execute(
            "SELECT 1 FROM sandbox_desired WHERE id = %s AND incarnation = %s", (sid, inc)
        ).fetchone()
        if not mine:
            fail(f"sandbox {sid} was released while waiting for it")
        if time.monotonic() > deadline:
            phase = f"{row[0]} at generation {row[1]} of {gen}: {row[3]}" if row else "no status yet"
            fail(f"sandbox {sid} is not ready after {TIMEOUT:.0f} s ({phase})")
        # Wake on a notification, or after a second anyway: NOTIFY is lost
        # while disconnected, and its payload may be another sandbox's row.
        for _ in conn.notifies(timeout=1.0, stop_after=1):
            pass


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
    # Autocommit: every SELECT sees what sandboxd committed since, and the
    # session is idle between them, so notifications arrive.
    with psycopg.connect(url, autocommit=True) as conn:
        gen, inc = request(conn, sid)
        print(f"requested {sid} at generation {gen}, incarnation {inc}")
        print(f"waiting for {sid} to be ready (at most {TIMEOUT:.0f} s)")
        started = time.monotonic()
        services = wait_ready(conn, sid, gen, inc)
        pg, redis = services["postgres"], services["redis"]
        print(f"ready {sid} after {time.monotonic() - started:.1f} s: postgres on "
              f"127.0.0.1:{pg['host_port']}, redis on 127.0.0.1:{redis['host_port']}")

        # host_port is published on 127.0.0.1 for clients on the Docker host.
        with psycopg.connect(host="127.0.0.1", port=pg["host_port"], user=pg["user"],
                             password=pg["password"], dbname=pg["database"],
                             connect_timeout=10) as db:
            who, sim = db.execute("SELECT current_user, similarity('sandbox', 'sandboxd')").fetchone()
        print(f"connected to the sandbox postgres as {who}: pg_trgm similarity = {sim}")
        # Redis's login is its default user (the URL is redis://:PASSWORD@host:port/0).
        pong = redis_ping(redis["host_port"], redis.get("user") or "default", redis["password"])
        print(f"connected to the sandbox redis: PING answered {pong}")

        (touched,) = conn.execute("SELECT sandbox_touch(%s)", (sid,)).fetchone()
        if not touched:
            fail(f"sandbox_touch({sid}) returned false: gone or being released")
        print(f"touched {sid}")
        (released,) = conn.execute("SELECT sandbox_release(%s)", (sid,)).fetchone()
        if not released:
            fail(f"sandbox_release({sid}) returned false: no such row")
        print(f"released {sid}")


if __name__ == "__main__":
    try:
        main()
    except (psycopg.Error, OSError) as e:
        fail(f"{type(e).__name__}: {e}")
