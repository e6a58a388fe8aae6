//! Checkpoints and resets end to end, against real engines and a real
//! state database: `sandbox_checkpoint` records a sandbox's data,
//! `sandbox_reset` brings it back (or back to the baseline, the empty
//! database with its features) with the same credentials and endpoint,
//! closing connected clients' sessions; the refusals say what to do; the
//! events say what happened and hold no password.

use crate::common;

use common::{eventually, host_pg_url, request, sandbox_id, TestEnv};
use sandboxd::client::{Client, ClientError};
use sandboxd::domain::{SandboxId, SandboxStatus};
use sqlx::{Connection, PgConnection};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// The table's row count and a checksum of its rows.
async fn fingerprint(con: &mut PgConnection, table: &str) -> (i64, i64) {
    sqlx::query_as(&format!(
        "SELECT count(*), coalesce(sum(hashtext(id::text || v)::bigint), 0)::bigint FROM {table}"
    ))
    .fetch_one(con)
    .await
    .unwrap()
}

/// The user tables of the database.
async fn user_tables(con: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1",
    )
    .fetch_all(con)
    .await
    .unwrap()
}

/// The sandbox's events as (reason, detail, message).
async fn events(env: &TestEnv, id: &SandboxId) -> Vec<(String, Option<String>, String)> {
    sqlx::query_as(
        "SELECT reason, detail, message FROM sandbox_events WHERE sandbox_id = $1 ORDER BY seq",
    )
    .bind(id.as_str())
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

/// Waits until the sandbox has recorded an event of `reason` with `detail`.
async fn event(env: &TestEnv, id: &SandboxId, reason: &str, detail: &str) -> String {
    eventually(
        &format!("a {reason} {detail} event"),
        Duration::from_secs(10),
        || async {
            events(env, id)
                .await
                .into_iter()
                .find_map(|(r, d, m)| (r == reason && d.as_deref() == Some(detail)).then_some(m))
        },
    )
    .await
}

fn same_endpoint_and_credentials(before: &SandboxStatus, after: &SandboxStatus, engine: &str) {
    let (b, a) = (&before.services[engine], &after.services[engine]);
    assert_eq!(a.password, b.password, "{engine}: same password");
    assert_eq!(a.user, b.user);
    assert_eq!(a.host_port, b.host_port, "{engine}: same published port");
    assert_eq!(a.host, b.host);
    assert_eq!(a.instance, b.instance, "{engine}: same container");
}

#[tokio::test]
async fn a_postgres_sandbox_resets_to_its_100_mb_checkpoint_and_to_its_baseline_with_the_same_credentials(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // A 100 MB table, its checkpoint and a reset's copy fit.
    config.limits.memory_bytes = 768 * 1024 * 1024;
    config.limits.tmpfs_bytes = 768 * 1024 * 1024;
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckpt-pg");
    let before = client
        .provision(
            &id,
            &request(&["postgres"], &[("postgres", "citext")]),
            WAIT,
        )
        .await
        .expect("postgres sandbox ready");
    let url = host_pg_url(&before.services["postgres"]);
    let password = before.services["postgres"].password.expose().to_owned();

    let mut con = PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TABLE big AS SELECT g AS id, md5(g::text) || repeat('x', 60) AS v FROM generate_series(1, 750000) g",
    )
    .execute(&mut con)
    .await
    .unwrap();
    let size: i64 = sqlx::query_scalar("SELECT pg_total_relation_size('big')")
        .fetch_one(&mut con)
        .await
        .unwrap();
    assert!(size > 95 * 1024 * 1024, "a table of about 100 MB: {size}");
    let filled = fingerprint(&mut con, "big").await;

    let checkpoint = client
        .checkpoint(&id, "filled", WAIT)
        .await
        .expect("checkpoint recorded");
    assert_eq!(checkpoint.state, "ready");
    assert!(checkpoint.size_bytes.unwrap() > 95 * 1024 * 1024);
    // The checkpoint closed the session it needed the database free of.
    assert!(sqlx::query("SELECT 1").execute(&mut con).await.is_err());

    // Other data, and a session held open across the reset.
    let mut con = PgConnection::connect(&url).await.unwrap();
    sqlx::query("DROP TABLE big")
        .execute(&mut con)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE other AS SELECT g AS id, 'other' AS v FROM generate_series(1, 1000) g",
    )
    .execute(&mut con)
    .await
    .unwrap();
    client
        .reset(&id, Some("filled"), WAIT)
        .await
        .expect("reset to the checkpoint");
    let closed = sqlx::query("SELECT 1").execute(&mut con).await;
    assert!(closed.is_err(), "the connected session was closed");

    let mut con = PgConnection::connect(&url)
        .await
        .expect("the same URL and password log in after the reset");
    assert_eq!(
        fingerprint(&mut con, "big").await,
        filled,
        "the table is back exactly"
    );
    assert_eq!(
        user_tables(&mut con).await,
        ["big"],
        "the other data is gone"
    );
    let after = client.status(&id).await.unwrap().unwrap();
    same_endpoint_and_credentials(&before, &after, "postgres");

    // The checkpoint is no database the agent can use.
    let (server, _) = url.rsplit_once('/').unwrap();
    let ckpt_url = format!("{server}/sandboxd_checkpoint_filled");
    let refused = PgConnection::connect(&ckpt_url)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("not currently accepting connections"),
        "{refused}"
    );
    let copy = sqlx::query("CREATE DATABASE mine TEMPLATE sandboxd_checkpoint_filled")
        .execute(&mut con)
        .await
        .unwrap_err()
        .to_string();
    assert!(copy.contains("permission denied"), "{copy}");

    // The baseline: empty, with its features.
    con.close().await.unwrap();
    client
        .reset(&id, None, WAIT)
        .await
        .expect("reset to the baseline");
    let mut con = PgConnection::connect(&url).await.unwrap();
    assert!(user_tables(&mut con).await.is_empty(), "no user table left");
    let citext: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'citext'")
            .fetch_one(&mut con)
            .await
            .unwrap();
    assert_eq!(citext, 1, "the baseline keeps the features");
    // The agent still owns its database and schema.
    sqlx::query("CREATE TABLE mine (x citext)")
        .execute(&mut con)
        .await
        .unwrap();
    con.close().await.unwrap();

    let took = event(&env, &id, "checkpointed", "filled").await;
    assert!(took.contains("checkpoint filled recorded"), "{took}");
    event(&env, &id, "reset", "filled").await;
    let baseline = event(&env, &id, "reset", "baseline").await;
    assert!(
        baseline.contains("connected sessions were closed"),
        "{baseline}"
    );
    for (_, _, message) in events(&env, &id).await {
        assert!(!message.contains(&password), "no password in {message}");
    }

    client.release(&id).await.unwrap();
    eventually("postgres torn down", Duration::from_secs(30), || async {
        env.containers(Some(&id)).await.is_empty().then_some(())
    })
    .await;
    controller.stop().await;
}

async fn cmd<T: redis::FromRedisValue>(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> redis::RedisResult<T> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(con).await
}

#[tokio::test]
async fn redis_and_valkey_keys_reset_to_their_checkpoint_and_to_the_empty_baseline() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.images = common::test_images_with_valkey();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckpt-resp");
    let before = client
        .provision(
            &id,
            &request(&["redis", "valkey"], &[("redis", "json")]),
            WAIT,
        )
        .await
        .expect("redis and valkey ready");
    for engine in ["redis", "valkey"] {
        let mut con = common::host_redis(&before.services[engine]).await;
        for i in 0..500 {
            let () = cmd(
                &mut con,
                &["SET", &format!("key:{i}"), &format!("value {i}")],
            )
            .await
            .unwrap();
        }
        let () = cmd(&mut con, &["HSET", "hash", "field", "kept"])
            .await
            .unwrap();
        // The agent has none of the commands a checkpoint uses.
        for admin in [
            &["SAVE"][..],
            &["DEBUG", "RELOAD"],
            &["CONFIG", "SET", "dbfilename", "x.rdb"],
        ] {
            let refused = cmd::<String>(&mut con, admin)
                .await
                .unwrap_err()
                .to_string();
            assert!(
                refused.contains("NOPERM") || refused.contains("not allowed"),
                "{engine} {admin:?}: {refused}"
            );
        }
    }
    if let Some(json) = before.services.get("redis") {
        let mut con = common::host_redis(json).await;
        let () = cmd(&mut con, &["JSON.SET", "doc", "$", r#"{"a":1}"#])
            .await
            .unwrap();
    }

    client
        .checkpoint(&id, "keys", WAIT)
        .await
        .expect("checkpoint");
    let mut held = Vec::new();
    for engine in ["redis", "valkey"] {
        let mut con = common::host_redis(&before.services[engine]).await;
        let _: i64 = cmd(&mut con, &["DEL", "key:7", "hash"]).await.unwrap();
        let () = cmd(&mut con, &["SET", "new", "after"]).await.unwrap();
        held.push(con);
    }
    client
        .reset(&id, Some("keys"), WAIT)
        .await
        .expect("reset to keys");
    for con in &mut held {
        let gone: redis::RedisResult<String> = cmd(con, &["PING"]).await;
        assert!(gone.is_err(), "the connected client's session was closed");
    }
    let after = client.status(&id).await.unwrap().unwrap();
    for engine in ["redis", "valkey"] {
        same_endpoint_and_credentials(&before, &after, engine);
        let mut con = common::host_redis(&after.services[engine]).await;
        let size: i64 = cmd(&mut con, &["DBSIZE"]).await.unwrap();
        let json = usize::from(engine == "redis");
        assert_eq!(size as usize, 501 + json, "{engine}: the keys are back");
        let v: String = cmd(&mut con, &["GET", "key:7"]).await.unwrap();
        assert_eq!(v, "value 7");
        let h: String = cmd(&mut con, &["HGET", "hash", "field"]).await.unwrap();
        assert_eq!(h, "kept");
        let new: Option<String> = cmd(&mut con, &["GET", "new"]).await.unwrap();
        assert_eq!(new, None, "{engine}: what came after is gone");
        if engine == "redis" {
            let doc: String = cmd(&mut con, &["JSON.GET", "doc"]).await.unwrap();
            assert_eq!(doc, r#"{"a":1}"#, "a module's value is back");
        }
    }

    client
        .reset(&id, None, WAIT)
        .await
        .expect("reset to the baseline");
    for engine in ["redis", "valkey"] {
        let mut con = common::host_redis(&after.services[engine]).await;
        let size: i64 = cmd(&mut con, &["DBSIZE"]).await.unwrap();
        assert_eq!(size, 0, "{engine}: the baseline is the empty keyspace");
    }
    event(&env, &id, "checkpointed", "keys").await;
    event(&env, &id, "reset", "keys").await;
    event(&env, &id, "reset", "baseline").await;
    for (_, _, message) in events(&env, &id).await {
        for engine in ["redis", "valkey"] {
            assert!(!message.contains(before.services[engine].password.expose()));
        }
    }

    client.release(&id).await.unwrap();
    controller.stop().await;
}

#[tokio::test]
async fn invalid_reserved_and_unknown_names_and_too_many_checkpoints_are_refused_with_what_to_do() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckpt-refusals");
    // The row alone: the database refuses before sandboxd is involved.
    client
        .apply(&id, &request(&["redis"], &[]))
        .await
        .expect("row written");
    let refused = |r: Result<i64, ClientError>| match r {
        Err(ClientError::Refused(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let invalid = refused(client.request_checkpoint(&id, "Bad Name").await);
    assert!(invalid.contains("is not valid"), "{invalid}");
    let reserved = refused(client.request_checkpoint(&id, "baseline").await);
    assert!(reserved.contains("reserved"), "{reserved}");
    let unknown_sandbox = refused(
        client
            .request_checkpoint(&SandboxId::parse("no-such-sandbox").unwrap(), "a")
            .await,
    );
    assert!(
        unknown_sandbox.contains("request it first"),
        "{unknown_sandbox}"
    );
    let unknown = refused(client.request_reset(&id, Some("never-taken")).await);
    assert!(unknown.contains("has no checkpoint"), "{unknown}");

    sqlx::query("UPDATE sandbox_checkpoint_settings SET max_per_sandbox = 2")
        .execute(&env.pool)
        .await
        .unwrap();
    client.request_checkpoint(&id, "one").await.unwrap();
    client.request_checkpoint(&id, "two").await.unwrap();
    // Taking one again under its name replaces it: allowed.
    client.request_checkpoint(&id, "two").await.unwrap();
    let many = refused(client.request_checkpoint(&id, "three").await);
    assert!(many.contains("the most a sandbox may have"), "{many}");
    // A reset to a checkpoint asked for (not failed) is accepted.
    client.request_reset(&id, Some("one")).await.unwrap();

    // An orchestrator that sees only its own rows cannot reach another's.
    let (pool, _) = env.create_login_role("ckpt-orch").await;
    sqlx::query("SELECT sandbox_grant_orchestrator('ckpt-orch', true)")
        .execute(&env.pool)
        .await
        .unwrap();
    let theirs = Client::from_pool(pool);
    let hidden = refused(theirs.request_checkpoint(&id, "mine").await);
    assert!(hidden.contains("that this role may see"), "{hidden}");
    let hidden = refused(theirs.request_reset(&id, None).await);
    assert!(hidden.contains("that this role may see"), "{hidden}");
    assert!(theirs.checkpoints(&id).await.unwrap().is_empty());
    // Its own sandbox it may checkpoint.
    let own = sandbox_id("ckpt-own");
    let mut mine = request(&["redis"], &[]);
    mine.owner = "ckpt-orch".into();
    theirs.apply(&own, &mine).await.unwrap();
    theirs.request_checkpoint(&own, "mine").await.unwrap();
    assert_eq!(theirs.checkpoints(&own).await.unwrap().len(), 1);

    // A released sandbox's checkpoints and resets go with its row.
    theirs.release(&own).await.unwrap();
    assert!(theirs.checkpoints(&own).await.unwrap().is_empty());
    client.release(&id).await.unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM sandbox_checkpoints) + (SELECT count(*) FROM sandbox_resets)",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_checkpoint_that_would_not_fit_under_the_memory_cap_is_refused_with_a_message() {
    let env = TestEnv::new().await;
    // The tests' cap: 256 MiB, of which a checkpoint must leave 10% free.
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckpt-cap");
    let status = client
        .provision(&id, &request(&["postgres"], &[]), WAIT)
        .await
        .expect("postgres ready");
    let mut con = PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE big AS SELECT g AS id, md5(g::text) || repeat('x', 60) AS v FROM generate_series(1, 750000) g",
    )
    .execute(&mut con)
    .await
    .unwrap();
    let refused = client.checkpoint(&id, "too-big", WAIT).await.unwrap_err();
    let message = refused.to_string();
    assert!(
        matches!(refused, ClientError::CheckpointFailed { .. }),
        "{message}"
    );
    assert!(message.contains("would not fit"), "{message}");
    assert!(message.contains("memory cap"), "{message}");
    // Nothing was copied, and the data is untouched.
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM big")
        .fetch_one(&mut con)
        .await
        .unwrap();
    assert_eq!(count, 750000);
    event(&env, &id, "failed", "checkpoint").await;

    client.release(&id).await.unwrap();
    controller.stop().await;
}

/// Runs `js` with mongosh in the sandbox's Mongo container, logged in as
/// the agent (its password read from the shim's tmpfs file): what it printed.
async fn mongosh(env: &TestEnv, id: &SandboxId, js: &str) -> String {
    let container = env
        .containers(Some(id))
        .await
        .into_iter()
        .find(|c| c.labels.engine == "mongo")
        .expect("a mongo container");
    let script = format!(
        r#"mongosh --quiet --host 127.0.0.1 --eval '
            db.getSiblingDB("admin").auth(process.env.SANDBOXD_USER, fs.readFileSync("/run/sandboxd/password", "utf8"));
            const d = db.getSiblingDB(process.env.SANDBOXD_DATABASE);
            {js}'"#
    );
    let (code, out) = common::exec_in(env, &container.name, &script, Vec::new()).await;
    assert_eq!(code, 0, "{out}");
    out.trim().to_owned()
}

#[tokio::test]
#[ignore = "needs a mongo:8 image; Debian ships no MongoDB server (scripts/test.sh runs it when the image exists)"]
async fn a_mongo_sandbox_resets_to_its_checkpoint_and_to_the_empty_baseline() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckpt-mongo");
    client
        .provision(&id, &request(&["mongo"], &[]), WAIT)
        .await
        .expect("mongo ready");
    mongosh(&env, &id, "d.things.insertOne({n: 1})").await;
    client.checkpoint(&id, "one", WAIT).await.unwrap();
    mongosh(
        &env,
        &id,
        "d.things.insertOne({n: 2}); d.more.insertOne({x: 1})",
    )
    .await;
    client.reset(&id, Some("one"), WAIT).await.unwrap();
    let counts = mongosh(
        &env,
        &id,
        "print(d.things.countDocuments({}), d.more.countDocuments({}))",
    )
    .await;
    assert!(counts.ends_with("1 0"), "{counts}");
    client.reset(&id, None, WAIT).await.unwrap();
    let names = mongosh(&env, &id, "print(d.getCollectionNames().length)").await;
    assert!(names.ends_with('0'), "{names}");
    client.release(&id).await.unwrap();
    controller.stop().await;
}

/// Runs the `sandboxd` binary against the test's state database (off the
/// runtime's thread: the controller runs in this process meanwhile).
async fn cli(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let url = env.url.clone();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(common::BIN)
            .args(&args)
            .env("DATABASE_URL", url)
            .output()
            .expect("run sandboxd")
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_cli_checkpoints_and_resets_and_says_why_it_refuses() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckpt-cli");
    let status = client
        .provision(&id, &request(&["redis"], &[]), WAIT)
        .await
        .expect("redis ready");
    let mut con = common::host_redis(&status.services["redis"]).await;
    let () = cmd(&mut con, &["SET", "k", "before"]).await.unwrap();

    let out = cli(&env, &["checkpoint", id.as_str(), "cli-one", "--wait"]).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("checkpoint cli-one of"), "{said}");
    let () = cmd(&mut con, &["SET", "k", "after"]).await.unwrap();
    let out = cli(&env, &["reset", id.as_str(), "cli-one", "--wait"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut con = common::host_redis(&status.services["redis"]).await;
    let v: String = cmd(&mut con, &["GET", "k"]).await.unwrap();
    assert_eq!(v, "before");
    let out = cli(&env, &["reset", id.as_str(), "--wait"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut con = common::host_redis(&status.services["redis"]).await;
    let n: i64 = cmd(&mut con, &["DBSIZE"]).await.unwrap();
    assert_eq!(n, 0);

    // Without --wait: the request's number; refusals exit 1 with the reason.
    let out = cli(&env, &["checkpoint", id.as_str(), "later"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("asked (request"));
    let out = cli(&env, &["reset", id.as_str(), "nope", "--wait"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no checkpoint 'nope'"), "{err}");
    let out = cli(&env, &["checkpoint", id.as_str(), "baseline"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("reserved"));

    client.release(&id).await.unwrap();
    controller.stop().await;
}

/// What a reset to the baseline does, held at the moment between making
/// the new database and creating its features in it: a `psql` that waits
/// there (a bash function the script's `psql` calls resolve to, defined in a
/// file `BASH_ENV` names: the runtime tmpfs is noexec, a sourced file needs
/// no exec bit) until the test lets it go.
const HOLD_BEFORE_FEATURES: &str = r#"
psql() {
	local a prev= i
	for a; do
		if [[ $prev == -d && $a == "$SANDBOXD_DATABASE" ]]; then
			: >/var/run/postgresql/test-held
			for ((i = 0; i < 600; i++)); do
				[[ -e /var/run/postgresql/test-go ]] && break
				sleep 0.1
			done
		fi
		prev=$a
	done
	command psql "$@"
}
"#;

/// Issue 29, hole 4: a reset to the baseline used to make the agent's
/// database owned by the agent, open to its logins, and only then create
/// the features in `public` as the superuser, so the agent could connect in
/// between and plant objects for the extension scripts to call. Now the
/// database is the superuser's and closed to the agent until its features
/// are in, then handed over as provisioning made it.
#[tokio::test]
async fn a_baseline_reset_keeps_the_agent_out_until_the_features_are_in_then_hands_the_database_over(
) {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckpt-hold");
    let status = client
        .provision(
            &id,
            &request(&["postgres"], &[("postgres", "citext")]),
            WAIT,
        )
        .await
        .expect("postgres sandbox ready");
    // Nobody else execs into the container or probes it while the reset
    // is held (a probe failing meanwhile could start a heal).
    controller.stop().await;
    let pg = &status.services["postgres"];
    let url = host_pg_url(pg);
    let container = env
        .containers(Some(&id))
        .await
        .into_iter()
        .find(|c| c.labels.engine == "postgres")
        .expect("a postgres container")
        .name;
    let hook = "/var/run/postgresql/test-hold.sh";
    let (code, out) = common::exec_in(
        &env,
        &container,
        &format!("cat >{hook} <<'EOF'\n{HOLD_BEFORE_FEATURES}\nEOF"),
        Vec::new(),
    )
    .await;
    assert_eq!(code, 0, "{out}");

    let postgres = sandboxd::engine::lookup("postgres").unwrap();
    let credentials = sandboxd::engine::Credentials {
        user: pg.user.clone(),
        password: pg.password.clone(),
        database: pg.database.clone(),
    };
    let reset = postgres
        .reset_command(
            &credentials,
            &sandboxd::domain::checkpoint::CheckpointName::baseline(),
        )
        .expect("postgres resets");
    let held = async {
        eventually(
            "the reset held before the features",
            Duration::from_secs(30),
            || async {
                let (code, _) = common::exec_in(
                    &env,
                    &container,
                    "test -e /var/run/postgresql/test-held",
                    Vec::new(),
                )
                .await;
                (code == 0).then_some(())
            },
        )
        .await;
        // The new database exists now; the agent's login to it must fail.
        let login = PgConnection::connect(&url).await;
        let (code, out) = common::exec_in(
            &env,
            &container,
            "touch /var/run/postgresql/test-go",
            Vec::new(),
        )
        .await;
        assert_eq!(code, 0, "{out}");
        login.map(drop)
    };
    let ((code, out), login) = tokio::join!(
        common::exec_argv(&env, &container, reset, vec![format!("BASH_ENV={hook}")]),
        held
    );
    assert_eq!((code, out.trim()), (0, "reset"), "{out}");
    let refused = login.expect_err("the agent cannot log in before the features are in");
    assert!(
        refused
            .to_string()
            .contains("permission denied for database"),
        "{refused}"
    );

    // Handed over as provisioning made it: the agent owns the database and
    // public and may connect (as may PUBLIC); the features are the
    // superuser's.
    let mut con = PgConnection::connect(&url)
        .await
        .expect("the agent logs in");
    let (db_owner, public_owner, public_connects): (String, String, bool) = sqlx::query_as(
        "SELECT d.datdba::regrole::text, \
                (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'public'), \
                EXISTS (SELECT FROM aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a \
                        WHERE a.grantee = 0 AND a.privilege_type = 'CONNECT') \
         FROM pg_database d WHERE d.datname = current_database()",
    )
    .fetch_one(&mut con)
    .await
    .unwrap();
    assert_eq!(
        (db_owner.as_str(), public_owner.as_str(), public_connects),
        (pg.user.as_str(), pg.user.as_str(), true)
    );
    let (owner, schema, same): (String, String, bool) = sqlx::query_as(
        "SELECT e.extowner::regrole::text, e.extnamespace::regnamespace::text, 'A'::citext = 'a' \
         FROM pg_extension e WHERE e.extname = 'citext'",
    )
    .fetch_one(&mut con)
    .await
    .expect("citext is back");
    assert_eq!(
        (owner.as_str(), schema.as_str(), same),
        ("postgres", "public", true)
    );
    con.close().await.unwrap();
}
