//! Seeds cost the controller little memory however large they are and
//! however many load at once (issue 50): the largest seed of every kind
//! (Postgres SQL text and a `pg_dump` archive, Redis commands and an RDB
//! file, 16 MiB each, `sandbox_seed_put`'s limit), four of each at once,
//! grow a real `sandboxd run` process's resident set by at most 64 MiB,
//! read from `/proc`. Before, the controller held every seed whole, parsed
//! a command seed into a list of strings and expanded an archive into its
//! script: four command loads took it from 21 MiB to 2.6 GiB.

use crate::common;

use common::{free_port, host_pg_url, sandbox_id, TestEnv, OWNER};
use sandboxd::client::{Client, SandboxRequest};
use sandboxd::domain::SandboxStatus;
use sqlx::Connection;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The largest seed `sandbox_seed_put` takes.
const MAX_SEED: usize = 16 * 1024 * 1024;

/// How many of each kind load at once.
const EACH: usize = 4;

/// What the loads may add to the controller's resident set.
const BOUND: u64 = 64 * 1024 * 1024;

/// A field of `/proc/PID/status` in bytes (`VmRSS`, `VmHWM`).
fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process runs");
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a number in {line:?}"));
    kib * 1024
}

/// SQL text of at most [`MAX_SEED`] bytes, as a plain dump writes it: a
/// table and its rows in a `COPY` block (seed `n`'s own rows).
fn sql_seed(n: usize) -> (Vec<u8>, usize) {
    let mut sql =
        b"CREATE TABLE big (id int PRIMARY KEY, v text);\nCOPY big (id, v) FROM stdin;\n".to_vec();
    let end = b"\\.\n";
    let mut rows = 0;
    loop {
        let row = format!("{rows}\tseed {n} row {rows} {}\n", "x".repeat(80));
        if sql.len() + row.len() + end.len() > MAX_SEED {
            break;
        }
        sql.extend_from_slice(row.as_bytes());
        rows += 1;
    }
    sql.extend_from_slice(end);
    (sql, rows)
}

/// Redis commands of at most [`MAX_SEED`] bytes (seed `n`'s own keys).
fn command_seed(n: usize) -> (Vec<u8>, usize) {
    let mut commands = Vec::with_capacity(MAX_SEED);
    let mut keys = 0;
    loop {
        let line = format!("SET seed:{n}:{keys} \"value {keys} {}\"\n", "y".repeat(40));
        if commands.len() + line.len() > MAX_SEED {
            break;
        }
        commands.extend_from_slice(line.as_bytes());
        keys += 1;
    }
    (commands, keys)
}

/// Files a container of `image` writes into /out by `script`, by name.
fn made_in(image: &str, script: &str) -> HashMap<String, Vec<u8>> {
    let out = common::docker(&[
        "run",
        "--rm",
        "--user",
        "999",
        "--tmpfs",
        "/out:size=256m,uid=999",
        "--tmpfs",
        "/tmp:size=512m,uid=999",
        "--entrypoint",
        "bash",
        image,
        "-c",
        &format!("set -e; {script}; tar -C /out -cf - ."),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::untar(&out.stdout)
}

/// The files `NAME-1` to `NAME-EACH` of `files`, each starting with
/// `magic` and no larger than a seed may be.
fn numbered(files: &HashMap<String, Vec<u8>>, name: &str, magic: &[u8]) -> Vec<Vec<u8>> {
    (1..=EACH)
        .map(|n| {
            let file = &files[&format!("{name}-{n}")];
            assert!(
                file.starts_with(magic) && file.len() <= MAX_SEED,
                "{name}-{n}: {} bytes",
                file.len()
            );
            file.clone()
        })
        .collect()
}

/// [`EACH`] `pg_dump` custom-format archives of close to [`MAX_SEED`]
/// bytes whose scripts are about twice that (hex text compresses), and
/// how many rows each holds.
fn archives() -> (Vec<Vec<u8>>, usize) {
    const ROWS: usize = 250_000;
    let files = made_in(
        "sandboxd/postgres:17",
        &format!(
            "initdb -D /tmp/pg -U postgres >/dev/null
             pg_ctl -D /tmp/pg -o '-k /tmp -c listen_addresses= -c fsync=off' -w start >/dev/null
             for n in $(seq 1 {EACH}); do
               psql -h /tmp -U postgres -q -v ON_ERROR_STOP=1 -c \"DROP TABLE IF EXISTS big;
                 CREATE TABLE big AS SELECT g AS id, md5(g::text || '$n') || md5(g::text) || md5('$n' || g::text) AS v
                 FROM generate_series(1, {ROWS}) g\" postgres
               pg_dump -h /tmp -U postgres -Fc -f /out/archive-$n postgres
             done"
        ),
    );
    let archives = numbered(&files, "archive", b"PGDMP");
    (archives, ROWS)
}

/// [`EACH`] RDB files of Redis 8 of close to [`MAX_SEED`] bytes, and how
/// many keys each holds.
fn rdb_files() -> (Vec<Vec<u8>>, usize) {
    const KEYS: usize = 110_000;
    let files = made_in(
        "sandboxd/redis:8",
        &format!(
            "for n in $(seq 1 {EACH}); do
               redis-server --daemonize yes --dir /out --dbfilename rdb-$n --save '' --port 7000 >/dev/null
               until redis-cli -p 7000 ping >/dev/null 2>&1; do sleep 0.05; done
               redis-cli -p 7000 eval \"for i = 1, {KEYS} do redis.call('SET', 'rdb:' .. ARGV[1] .. ':' .. i,
                 redis.sha1hex(ARGV[1] .. i) .. redis.sha1hex(i .. ARGV[1]) .. redis.sha1hex(i .. 'x')) end\" 0 $n >/dev/null
               redis-cli -p 7000 save >/dev/null
               redis-cli -p 7000 shutdown nosave >/dev/null 2>&1 || true
               while redis-cli -p 7000 ping >/dev/null 2>&1; do sleep 0.05; done
             done"
        ),
    );
    let rdbs = numbered(&files, "rdb", b"REDIS");
    (rdbs, KEYS)
}

/// How many rows the sandbox's table `big` holds.
async fn rows(status: &SandboxStatus) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .expect("the agent logs in");
    sqlx::query_scalar("SELECT count(*) FROM big")
        .fetch_one(&mut conn)
        .await
        .expect("the seed's table is there")
}

/// How many keys the sandbox's `engine` holds.
async fn keys(status: &SandboxStatus, engine: &str) -> i64 {
    let mut con = common::host_redis(&status.services[engine]).await;
    redis::cmd("DBSIZE").query_async(&mut con).await.unwrap()
}

#[tokio::test]
async fn four_of_the_largest_seeds_of_every_kind_at_once_grow_the_controller_by_at_most_64_mib() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let made = tokio::task::spawn_blocking(|| (archives(), rdb_files()));
    let sql: Vec<(Vec<u8>, usize)> = (0..EACH).map(sql_seed).collect();
    let commands: Vec<(Vec<u8>, usize)> = (0..EACH).map(command_seed).collect();
    let ((archives, archive_rows), (rdbs, rdb_keys)) = made.await.unwrap();
    // Sixteen of the largest seeds are more than an owner's default seed
    // quota (16 seeds, 64 MiB together): the operator raises it, as
    // `sandboxd quota set OWNER --seed-bytes` would.
    sqlx::query(
        "INSERT INTO sandbox_quotas (owner, max_seeds, max_seed_bytes) VALUES ($1, $2, $3)
         ON CONFLICT (owner) DO UPDATE SET max_seeds = $2, max_seed_bytes = $3",
    )
    .bind(OWNER)
    .bind(4 * EACH as i32)
    .bind(4 * EACH as i64 * MAX_SEED as i64)
    .execute(&env.pool)
    .await
    .expect("raise the owner's seed quota");
    let put = |engine: &'static str, content: Vec<u8>| {
        let client = client.clone();
        async move {
            client
                .put_seed(engine, &content, Some(OWNER))
                .await
                .unwrap_or_else(|e| panic!("register a {engine} seed: {e}"))
        }
    };
    let mut hashes = Vec::new();
    for n in 0..EACH {
        hashes.push((
            put("postgres", sql[n].0.clone()).await,
            put("valkey", commands[n].0.clone()).await,
            put("postgres", archives[n].clone()).await,
            put("redis", rdbs[n].clone()).await,
        ));
    }

    let port = free_port();
    // No pools learned from demand: only the sandboxes load seeds.
    let process = env.spawn_binary(port, &[("SANDBOXD_WARM_POOL_DEMAND", "0")]);
    let pid = process.0.id();
    common::eventually(
        "the controller is ready",
        Duration::from_secs(60),
        || async {
            matches!(common::http_get(port, "/readyz").await, Some((200, _))).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = proc_status(pid, "VmRSS");
    // The peak from here on (writing 5 resets VmHWM to the current RSS).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");

    let seeded = |services: &[&str], seeds: [(&str, &str); 2]| SandboxRequest {
        seeds: seeds
            .iter()
            .map(|(e, h)| ((*e).to_owned(), (*h).to_owned()))
            .collect(),
        ..common::request(services, &[])
    };
    let started = Instant::now();
    let mut waits = Vec::new();
    for (n, (sql, commands, archive, rdb)) in hashes.iter().enumerate() {
        for (kind, request) in [
            (
                "text",
                seeded(
                    &["postgres", "valkey"],
                    [("postgres", sql), ("valkey", commands)],
                ),
            ),
            (
                "files",
                seeded(
                    &["postgres", "redis"],
                    [("postgres", archive), ("redis", rdb)],
                ),
            ),
        ] {
            let client = client.clone();
            let id = sandbox_id(&format!("{kind}-{n}"));
            waits.push(tokio::spawn(async move {
                let status = client
                    .provision(&id, &request, Duration::from_secs(240))
                    .await
                    .unwrap_or_else(|e| panic!("{id} with the largest seeds: {e}"));
                (kind, n, status)
            }));
        }
    }
    let mut ready = Vec::new();
    for wait in waits {
        ready.push(wait.await.unwrap());
    }
    let took = started.elapsed();
    let peak = proc_status(pid, "VmHWM");
    let after = proc_status(pid, "VmRSS");
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "seed loads: {} sandboxes ready in {took:.1?}; controller RSS {:.1} MiB before, peak {:.1} MiB (+{:.1}), {:.1} MiB after",
        ready.len(),
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before)),
        mib(after)
    );
    assert!(
        peak.saturating_sub(before) <= BOUND,
        "the controller's RSS grew from {:.1} MiB to a peak of {:.1} MiB loading {EACH} of the largest seeds of each kind at once: more than the {:.0} MiB allowed",
        mib(before),
        mib(peak),
        mib(BOUND)
    );

    // Every seed arrived whole.
    for (kind, n, status) in &ready {
        let n = *n;
        if *kind == "text" {
            assert_eq!(rows(status).await as usize, sql[n].1, "{} rows", status.id);
            assert_eq!(
                keys(status, "valkey").await as usize,
                commands[n].1,
                "{} keys",
                status.id
            );
        } else {
            assert_eq!(
                rows(status).await as usize,
                archive_rows,
                "{} rows",
                status.id
            );
            assert_eq!(
                keys(status, "redis").await as usize,
                rdb_keys,
                "{} keys",
                status.id
            );
        }
    }
    drop(process);
}
