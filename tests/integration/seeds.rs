//! Seeds on the real Docker engine and a real state Postgres: content
//! registered once under its hash (`sandbox_seed_put`), named per engine by
//! a row's `seeds`, loaded as the agent into Postgres and Redis; a changed
//! seed is a new hash that new sandboxes get and running ones do not; a
//! row that changes its seed is re-provisioned with fresh credentials; a
//! failing seed fails the sandbox with the engine's words; seeded pools
//! serve claims with the seed's data, and a heal loads it again; a
//! `pg_dump` archive or plain dump is restored as the agent; an RDB file
//! is a file the server starts from.

use crate::common;

use common::{docker_ok, eventually, host_pg_url, request, sandbox_id, TestEnv, OWNER};
use sandboxd::client::{Client, ClientError, Request, SandboxRequest};
use sandboxd::domain::{Phase, SandboxStatus};
use sqlx::Connection;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

const SCHEMA_V1: &str = "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO items VALUES (1, 'one'), (2, 'two');";
const SCHEMA_V2: &str = "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO items VALUES (1, 'one'), (2, 'two'), (3, 'three');";
const COMMANDS: &str = "# fixtures\nSET greeting \"hello world\"\nRPUSH queue a b c\n";

fn seeded(services: &[&str], seeds: &[(&str, &str)]) -> SandboxRequest {
    SandboxRequest {
        seeds: seeds
            .iter()
            .map(|(e, h)| ((*e).to_owned(), (*h).to_owned()))
            .collect(),
        ..request(services, &[])
    }
}

/// Registers `content` as an `engine` seed of the tests' owner: its hash.
async fn put(client: &Client, engine: &str, content: impl AsRef<[u8]>) -> String {
    client
        .put_seed(engine, content.as_ref(), Some(OWNER))
        .await
        .unwrap_or_else(|e| panic!("register the {engine} seed: {e}"))
}

/// The rows of the seeded table, and who owns it.
async fn items(status: &SandboxStatus) -> (Vec<String>, String) {
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .expect("the agent logs in");
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .expect("the seed's table is there");
    let owner: String =
        sqlx::query_scalar("SELECT tableowner::text FROM pg_tables WHERE tablename = 'items'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    (names, owner)
}

async fn redis_values(status: &SandboxStatus) -> (String, Vec<String>) {
    let s = &status.services["redis"];
    let client = redis::Client::open(format!(
        "redis://:{}@127.0.0.1:{}/0",
        s.password.expose(),
        s.host_port
    ))
    .unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let greeting: String = redis::cmd("GET")
        .arg("greeting")
        .query_async(&mut con)
        .await
        .unwrap();
    let queue: Vec<String> = redis::cmd("LRANGE")
        .arg("queue")
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    (greeting, queue)
}

#[tokio::test]
async fn seeded_sandboxes_start_with_their_seed_and_a_changed_seed_reaches_new_and_reseeded_ones_only(
) {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());

    // One content, one hash, however often it is registered; another
    // engine or another content is another hash.
    let v1 = put(&client, "postgres", SCHEMA_V1.as_bytes()).await;
    let again = put(&client, "postgres", SCHEMA_V1.as_bytes()).await;
    assert_eq!(v1, again, "the same content is one hash");
    assert!(v1.starts_with("sha256:") && v1.len() == 71, "{v1}");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM sandbox_seeds WHERE hash = $1")
        .bind(&v1)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(stored, 1, "stored once");
    let commands = put(&client, "redis", COMMANDS.as_bytes()).await;
    assert_ne!(commands, v1);

    // A Postgres and Redis sandbox with both seeds.
    let a = sandbox_id("seeded");
    let first = client
        .provision(
            &a,
            &seeded(
                &["postgres", "redis"],
                &[("postgres", &v1), ("redis", &commands)],
            ),
            READY,
        )
        .await
        .unwrap();
    let (names, owner) = items(&first).await;
    assert_eq!(names, ["one", "two"]);
    assert_eq!(owner, "sandbox", "loaded as the agent, not a superuser");
    assert_eq!(
        redis_values(&first).await,
        (
            "hello world".to_owned(),
            vec!["a".into(), "b".into(), "c".into()]
        )
    );
    assert_eq!(
        first.services["postgres"].seed.as_ref().map(|h| h.as_str()),
        Some(v1.as_str())
    );
    // The events are written once the reconcile ends.
    let seeded_events = eventually("two seeded events", Duration::from_secs(10), || async {
        let events: Vec<(String, String)> = sqlx::query_as(
            "SELECT engine, message FROM sandbox_events
              WHERE sandbox_id = $1 AND reason = 'seeded' ORDER BY engine",
        )
        .bind(a.as_str())
        .fetch_all(&env.pool)
        .await
        .unwrap();
        (events.len() == 2).then_some(events)
    })
    .await;
    assert_eq!(seeded_events[0].0, "postgres");
    assert!(seeded_events[0].1.contains(&v1), "{seeded_events:?}");

    // The seed changes: a new hash. New sandboxes get the new data...
    let v2 = put(&client, "postgres", SCHEMA_V2.as_bytes()).await;
    assert_ne!(v1, v2);
    let b = sandbox_id("seeded-v2");
    let newer = client
        .provision(&b, &seeded(&["postgres"], &[("postgres", &v2)]), READY)
        .await
        .unwrap();
    assert_eq!(items(&newer).await.0, ["one", "two", "three"]);
    // ...the running one keeps its data, container and credentials.
    let a_now = client.status(&a).await.unwrap().unwrap();
    assert_eq!(
        a_now.services["postgres"].instance,
        first.services["postgres"].instance
    );
    assert_eq!(items(&a_now).await.0, ["one", "two"]);

    // Naming the new seed in its row re-provisions it: fresh credentials,
    // the new data; Redis, whose seed did not change, is left alone.
    let reseeded = client
        .request_and_wait(
            &a,
            &Request {
                seeds: [("postgres".to_owned(), v2.clone())].into(),
                ..Default::default()
            },
            READY,
        )
        .await
        .unwrap();
    assert_ne!(
        reseeded.services["postgres"].password,
        first.services["postgres"].password
    );
    assert_eq!(items(&reseeded).await.0, ["one", "two", "three"]);
    assert_eq!(
        reseeded.services["redis"].instance,
        first.services["redis"].instance
    );

    // A seed the engine refuses fails the sandbox with its words.
    let broken = put(
        &client,
        "postgres",
        b"CREATE TABLE fine (id int);\nSELECT 1/0;",
    )
    .await;
    let c = sandbox_id("seed-fails");
    let err = client
        .provision(&c, &seeded(&["postgres"], &[("postgres", &broken)]), READY)
        .await
        .unwrap_err();
    let ClientError::Failed { message, .. } = &err else {
        panic!("a failing seed fails the sandbox: {err}");
    };
    assert!(
        message.contains("seed") && message.contains("line 2: ERROR:  division by zero"),
        "the engine's words, at the seed's line: {message}"
    );
    // Redis commands run as the agent's user: one it may not run fails
    // the sandbox, naming the command.
    let admin_only = put(&client, "redis", b"SET fine 1\nCONFIG SET maxmemory 1\n").await;
    let d = sandbox_id("seed-denied");
    let err = client
        .provision(&d, &seeded(&["redis"], &[("redis", &admin_only)]), READY)
        .await
        .unwrap_err();
    let ClientError::Failed { message, .. } = &err else {
        panic!("a refused command fails the sandbox: {err}");
    };
    assert!(message.contains("line 2 (CONFIG)"), "{message}");
    controller.stop().await;
}

#[tokio::test]
async fn the_database_refuses_seeds_that_are_not_the_row_owner_s_or_are_not_seeds() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    // sandboxd's schema is the controller's to make.
    let controller = env.start(env.config());
    let theirs = client
        .put_seed("postgres", b"SELECT 1;", Some("someone-else"))
        .await
        .unwrap();
    let refused = |e: ClientError| match e {
        ClientError::Refused(m) => m,
        other => panic!("refused with a message, got {other}"),
    };
    // Another owner's hash: not one this row's owner registered.
    let err = client
        .apply(
            &sandbox_id("not-mine"),
            &seeded(&["postgres"], &[("postgres", &theirs)]),
        )
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("is not one owner"), "{text}");
    // Engines without seeds, empty and malformed content are refused.
    let mongo = refused(
        client
            .put_seed("mongo", b"{}", Some(OWNER))
            .await
            .unwrap_err(),
    );
    assert!(mongo.contains("takes no seeds"), "{mongo}");
    let empty = refused(
        client
            .put_seed("redis", b"", Some(OWNER))
            .await
            .unwrap_err(),
    );
    assert!(empty.contains("empty"), "{empty}");
    // A persistent sandbox keeps its data: no seed.
    let mine = put(&client, "postgres", b"SELECT 1;").await;
    let err = client
        .apply(
            &sandbox_id("kept"),
            &SandboxRequest {
                persistent: true,
                ..seeded(&["postgres"], &[("postgres", &mine)])
            },
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("persistent"), "{err}");

    // A seed a row names is not deleted (its sandboxes load it again on a
    // heal); once no row names it, it goes, once.
    let named = sandbox_id("names-it");
    client
        .apply(&named, &seeded(&["postgres"], &[("postgres", &mine)]))
        .await
        .unwrap();
    let (code, message) = common::refusal(
        &env.pool,
        "SELECT sandbox_seed_delete($1, $2)",
        &[&mine, OWNER],
    )
    .await;
    assert_eq!(code, "2BP01", "{message}");
    assert!(message.contains("named by 1 sandbox row"), "{message}");
    sqlx::query("DELETE FROM sandbox_desired WHERE id = $1")
        .bind(named.as_str())
        .execute(&env.pool)
        .await
        .unwrap();
    assert!(client.delete_seed(&mine, Some(OWNER)).await.unwrap());
    assert!(!client.delete_seed(&mine, Some(OWNER)).await.unwrap());
    let err = client
        .apply(
            &sandbox_id("names-gone"),
            &seeded(&["postgres"], &[("postgres", &mine)]),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is not one owner"), "{err}");
    // An orchestrator that writes only its own rows deletes only its own
    // seeds: another owner's is refused, and stays.
    let (_, restricted) = env.own_rows_orchestrator("seed_orch").await;
    let (code, message) = common::refusal(
        &restricted,
        "SELECT sandbox_seed_delete($1, $2)",
        &[&theirs, "someone-else"],
    )
    .await;
    assert_eq!(code, "42501", "{message}");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM sandbox_seeds WHERE hash = $1")
        .bind(&theirs)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(kept, 1, "another owner's seed stays");
    controller.stop().await;
}

/// The test configuration with pools learned from demand (one container
/// per key) and no periodic relist.
fn learning_pools(env: &TestEnv) -> sandboxd::config::ControllerConfig {
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(3600);
    config.warm_pool_demand = sandboxd::config::PoolDemand {
        max: 1,
        window: Duration::from_secs(600),
    };
    config
}

/// A controller with templates on (a seed's template is one) and pools
/// learned from demand, whose first `engine` request of seed `hash` (a
/// miss, loaded) has taught the pool the seed and whose pool container
/// was seeded and copied into the seed's template before it was offered:
/// the controller and the first sandbox's id.
async fn seeded_pool_with_its_template(
    env: &TestEnv,
    engine: &str,
    hash: &str,
) -> (common::RunningController, sandboxd::domain::SandboxId) {
    let mut config = learning_pools(env);
    config.templates = true;
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let first = sandbox_id("seedpool1");
    client
        .provision(&first, &seeded(&[engine], &[(engine, hash)]), READY)
        .await
        .unwrap();
    pool_ready(&controller, engine).await;
    // The first sandbox's seed and the pool container's were loaded.
    assert_eq!(seed_loads(&controller, engine), 2.0);
    let templates = seed_volumes(env, hash);
    assert_eq!(
        templates.lines().count(),
        1,
        "the seed's template: {templates}"
    );
    assert!(
        templates.contains(&format!("-seed-{engine}-")),
        "{templates}"
    );
    (controller, first)
}

/// The names of this test deployment's volumes of seed `hash`, one a line.
fn seed_volumes(env: &TestEnv, hash: &str) -> String {
    docker_ok(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=io.sandboxd.seed={hash}"),
        "--filter",
        &format!("label=io.sandboxd.deployment={}", env.deployment),
    ])
}

/// Waits until the seeded pool of `engine` holds a ready container.
async fn pool_ready(controller: &common::RunningController, engine: &str) {
    let ready = format!("sandboxd_pool_size{{engine=\"{engine}\",state=\"ready\"}}");
    eventually(
        "a ready seeded pool container",
        Duration::from_secs(90),
        || async {
            (common::sample(&controller.metrics.render(), &ready) == Some(1.0)).then_some(())
        },
    )
    .await;
}

/// How many times a seed was loaded into an `engine` container.
fn seed_loads(controller: &common::RunningController, engine: &str) -> f64 {
    common::sample(
        &controller.metrics.render(),
        &format!("sandboxd_seed_load_seconds_count{{engine=\"{engine}\",result=\"success\"}}"),
    )
    .unwrap_or(0.0)
}

/// Requests `req` for two new sandboxes at once while the seed's pool
/// holds one container: one claims it, the other starts cold while the
/// pool refills, from the seed's template, or loading the seed when the
/// template is `damaged` (their `seeded` events say so). Their statuses,
/// in the order of `ids`.
async fn two_at_once(
    client: &Client,
    ids: [&sandboxd::domain::SandboxId; 2],
    req: &SandboxRequest,
    damaged: bool,
) -> [SandboxStatus; 2] {
    let (a, b) = tokio::join!(
        client.provision(ids[0], req, READY),
        client.provision(ids[1], req, READY)
    );
    // Events are written behind the status: waited for.
    let how = |id| {
        eventually(
            "a seeded event",
            Duration::from_secs(10),
            move || async move {
                let events = client.events(id, 100).await.unwrap();
                events
                    .into_iter()
                    .rev()
                    .find(|e| e.reason == "seeded")
                    .map(|e| e.message)
            },
        )
    };
    let mut hows = [how(ids[0]).await, how(ids[1]).await];
    hows.sort();
    let cold = if damaged {
        "loaded as the agent"
    } else {
        "its seed's template"
    };
    assert!(
        hows[0].contains(cold) && hows[1].contains("warm-pool container"),
        "{hows:?}"
    );
    [a.unwrap(), b.unwrap()]
}

#[tokio::test]
async fn a_seeded_pool_serves_claims_with_the_seed_s_data_and_makes_the_seed_s_template_a_heal_starts_from(
) {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let hash = put(&client, "postgres", SCHEMA_V1.as_bytes()).await;
    let (controller, first) = seeded_pool_with_its_template(&env, "postgres", &hash).await;
    let hits = || {
        common::sample(
            &controller.metrics.render(),
            "sandboxd_pool_claims_total{engine=\"postgres\",kind=\"create\",result=\"hit\"}",
        )
        .unwrap_or(0.0)
    };
    assert_eq!(hits(), 0.0);

    // One claims the pool's container (the seed's data, the agent's own
    // password), the other starts from the seed's template. Neither
    // loads the seed.
    let (second, third) = (sandbox_id("seedpool2"), sandbox_id("seedpool3"));
    let req = seeded(&["postgres"], &[("postgres", &hash)]);
    let [a, b] = two_at_once(&client, [&second, &third], &req, false).await;
    assert_eq!(hits(), 1.0, "one served from the seeded pool");
    assert_eq!(items(&a).await.0, ["one", "two"]);
    assert_eq!(
        items(&b).await,
        (vec!["one".into(), "two".into()], "sandbox".into())
    );
    assert_eq!(
        seed_loads(&controller, "postgres"),
        2.0,
        "nothing loaded the seed again"
    );
    // Seen as the seed's: not rotated away a moment later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = client.status(&second).await.unwrap().unwrap();
    assert_eq!(settled.phase, Phase::Ready);
    assert_eq!(
        settled.services["postgres"].instance,
        a.services["postgres"].instance
    );

    // A heal (from the seed's template, or the refilled pool's container)
    // has the seed's data under the same credentials, and loads nothing.
    let (before, healed) =
        common::kill_and_wait_healed(&env, &client, &first, "postgres", Duration::from_secs(60))
            .await;
    assert_eq!(
        healed.services["postgres"].password,
        before.services["postgres"].password
    );
    assert_eq!(items(&healed).await.0, ["one", "two"]);
    assert_eq!(
        seed_loads(&controller, "postgres"),
        2.0,
        "nothing loaded the seed again"
    );

    // A seed's template damaged behind sandboxd's back costs a start the
    // load it saved, not a failure: forgotten, the seed is loaded, and a
    // pool container copies it anew, which later starts use again.
    pool_ready(&controller, "postgres").await;
    let volume = seed_volumes(&env, &hash).trim().to_owned();
    docker_ok(&[
        "run",
        "--rm",
        "--user",
        "999:999",
        "-v",
        &format!("{volume}:/v"),
        "--entrypoint",
        "rm",
        "sandboxd/postgres:17",
        "-rf",
        "/v/cluster",
    ]);
    let ids = [sandbox_id("seedpool4"), sandbox_id("seedpool5")];
    for status in two_at_once(&client, [&ids[0], &ids[1]], &req, true).await {
        assert_eq!(items(&status).await.0, ["one", "two"]);
    }
    // Refilled: its container seeded and copied again.
    pool_ready(&controller, "postgres").await;
    let ids = [sandbox_id("seedpool6"), sandbox_id("seedpool7")];
    for status in two_at_once(&client, [&ids[0], &ids[1]], &req, false).await {
        assert_eq!(items(&status).await.0, ["one", "two"]);
    }
    controller.stop().await;
}

#[tokio::test]
async fn a_redis_command_seed_s_template_serves_a_start_the_pool_cannot_without_loading_it() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let hash = put(&client, "redis", COMMANDS.as_bytes()).await;
    let (controller, _) = seeded_pool_with_its_template(&env, "redis", &hash).await;
    let req = seeded(&["redis"], &[("redis", &hash)]);
    let ids = [sandbox_id("seedtpl1"), sandbox_id("seedtpl2")];
    let started = two_at_once(&client, [&ids[0], &ids[1]], &req, false).await;
    let expected = (
        "hello world".to_owned(),
        vec!["a".into(), "b".into(), "c".into()],
    );
    for status in &started {
        assert_eq!(redis_values(status).await, expected);
    }
    assert_eq!(
        seed_loads(&controller, "redis"),
        2.0,
        "nothing loaded the seed again"
    );
    controller.stop().await;
}

/// An RDB file of a Redis 8 server holding `greeting` and `queue` as
/// [`COMMANDS`] sets them: made by the image's server in a container of
/// its own (no sandbox), which prints the file.
fn rdb_file() -> Vec<u8> {
    let out = common::docker(&[
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        "sandboxd/redis:8",
        "-c",
        "redis-server --daemonize yes --dir /tmp --save '' >/dev/null && sleep 0.3 && \
         redis-cli set greeting 'hello world' >/dev/null && redis-cli rpush queue a b c >/dev/null && \
         redis-cli save >/dev/null && cat /tmp/dump.rdb",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.starts_with(b"REDIS"), "an RDB file");
    out.stdout
}

#[tokio::test]
async fn an_rdb_seed_is_a_file_the_server_starts_from_cold_healed_and_from_the_pool() {
    let env = TestEnv::new().await;
    let controller = env.start(learning_pools(&env));
    let client = Client::from_pool(env.pool.clone());
    let hash = put(&client, "redis", rdb_file()).await;
    let ask = || seeded(&["redis"], &[("redis", &hash)]);
    let expected = (
        "hello world".to_owned(),
        vec!["a".to_owned(), "b".to_owned(), "c".to_owned()],
    );

    // Cold: the server loads the file at its start.
    let first = sandbox_id("rdbseed1");
    let cold = client.provision(&first, &ask(), READY).await.unwrap();
    assert_eq!(redis_values(&cold).await, expected);
    let volume = docker_ok(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=io.sandboxd.seed={hash}"),
    ]);
    assert_eq!(volume.lines().count(), 1, "one volume per seed: {volume}");
    let said = eventually("a seeded event", Duration::from_secs(10), || async {
        let messages: Vec<String> = sqlx::query_scalar(
            "SELECT message FROM sandbox_events WHERE sandbox_id = $1 AND reason = 'seeded'",
        )
        .bind(first.as_str())
        .fetch_all(&env.pool)
        .await
        .unwrap();
        (!messages.is_empty()).then_some(messages)
    })
    .await;
    assert!(said[0].contains("data file"), "{said:?}");

    // A heal starts from it again, with the same password.
    let (before, healed) =
        common::kill_and_wait_healed(&env, &client, &first, "redis", Duration::from_secs(60)).await;
    assert_eq!(
        healed.services["redis"].password,
        before.services["redis"].password
    );
    assert_eq!(redis_values(&healed).await, expected);

    // The first request taught the pool the seed: the next one claims a
    // container that started from the file.
    eventually(
        "a seeded pool container",
        Duration::from_secs(90),
        || async {
            (common::sample(
                &controller.metrics.render(),
                "sandboxd_pool_size{engine=\"redis\",state=\"ready\"}",
            ) == Some(1.0))
            .then_some(())
        },
    )
    .await;
    let second = sandbox_id("rdbseed2");
    let claimed = client.provision(&second, &ask(), READY).await.unwrap();
    assert_eq!(
        common::sample(
            &controller.metrics.render(),
            "sandboxd_pool_claims_total{engine=\"redis\",kind=\"create\",result=\"hit\"}",
        ),
        Some(1.0),
        "served from the seeded pool"
    );
    assert_eq!(redis_values(&claimed).await, expected);
    controller.stop().await;
}

/// What the dump's database holds: rows with the characters a `COPY`
/// block escapes, a sequence, an index, a view and a function body.
const DUMPED: &str = "CREATE TABLE items (id serial PRIMARY KEY, name text NOT NULL, note text);
INSERT INTO items (name, note) VALUES ('one', E'tab\\there'), ('two', E'line\\nbreak \\\\ back'), ('three', NULL);
CREATE INDEX items_name ON items (name);
CREATE VIEW noted AS SELECT name FROM items WHERE note IS NOT NULL;
CREATE FUNCTION shout(t text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
  RETURN upper(t) || '!';
END
$f$;
COMMENT ON TABLE items IS 'fixtures';";

/// A `pg_dump` custom-format archive and a plain dump (without owners
/// and grants, as a plain seed must be) of a database holding
/// [`DUMPED`], made by the image's own server and `pg_dump` as the
/// superuser in a container of its own (no sandbox).
fn dumps() -> (Vec<u8>, Vec<u8>) {
    let out = common::docker(&[
        "run",
        "--rm",
        "--user",
        "999",
        "--env",
        &format!("DUMPED={DUMPED}"),
        "--entrypoint",
        "sh",
        "sandboxd/postgres:17",
        "-c",
        "initdb -D /tmp/pg -U postgres >/dev/null && \
         pg_ctl -D /tmp/pg -o '-k /tmp -c listen_addresses=' -w start >/dev/null && \
         psql -h /tmp -U postgres -q -v ON_ERROR_STOP=1 -c \"$DUMPED\" postgres >/dev/null && \
         pg_dump -h /tmp -U postgres -Fc -f /tmp/archive postgres && \
         pg_dump -h /tmp -U postgres -Fp --no-owner --no-privileges -f /tmp/plain.sql postgres && \
         tar -C /tmp -cf - archive plain.sql",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = common::untar(&out.stdout);
    let custom = files.remove("archive").expect("the archive");
    assert!(custom.starts_with(b"PGDMP"), "a custom-format archive");
    (custom, files.remove("plain.sql").expect("the plain dump"))
}

/// Checks that the sandbox holds what [`DUMPED`] made, the agent's own.
async fn holds_the_dump(status: &SandboxStatus, what: &str) {
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .expect("the agent logs in");
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT name, note FROM items ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{what}: the dump's table is there: {e}"));
    let want: Vec<(String, Option<String>)> = vec![
        ("one".into(), Some("tab\there".into())),
        ("two".into(), Some("line\nbreak \\ back".into())),
        ("three".into(), None),
    ];
    assert_eq!(rows, want, "{what}: the rows, escapes and NULL kept");
    let (shout, noted, next, owner): (String, i64, i32, String) = sqlx::query_as(
        "SELECT shout('hi'), (SELECT count(*) FROM noted),
                nextval('items_id_seq')::int,
                (SELECT tableowner::text FROM pg_tables WHERE tablename = 'items')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (shout.as_str(), noted, next, owner.as_str()),
        ("HI!", 2, 4, "sandbox"),
        "{what}: the function, view and sequence, owned by the agent"
    );
}

#[tokio::test]
async fn a_pg_dump_archive_or_plain_dump_seed_is_restored_as_the_agent_and_a_broken_one_fails_saying_so(
) {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let (archive, plain) = dumps();

    // The archive: the container's pg_restore turns it into a script,
    // which runs over the agent's login.
    let from_archive = put(&client, "postgres", &archive).await;
    let a = sandbox_id("archive");
    let restored = client
        .provision(
            &a,
            &seeded(&["postgres"], &[("postgres", &from_archive)]),
            READY,
        )
        .await
        .unwrap();
    holds_the_dump(&restored, "from the archive").await;

    // The plain dump is SQL text with COPY blocks (and psql's \restrict
    // guard): the same data.
    let from_plain = put(&client, "postgres", &plain).await;
    let b = sandbox_id("plain-dump");
    let restored = client
        .provision(
            &b,
            &seeded(&["postgres"], &[("postgres", &from_plain)]),
            READY,
        )
        .await
        .unwrap();
    holds_the_dump(&restored, "from the plain dump").await;

    // An archive cut short fails the sandbox with pg_restore's words.
    let cut = put(&client, "postgres", &archive[..archive.len() / 2]).await;
    let c = sandbox_id("archive-cut");
    let err = client
        .provision(&c, &seeded(&["postgres"], &[("postgres", &cut)]), READY)
        .await
        .unwrap_err();
    let ClientError::Failed { message, .. } = &err else {
        panic!("a broken archive fails the sandbox: {err}");
    };
    assert!(message.contains("pg_restore"), "{message}");
    controller.stop().await;
}

#[tokio::test]
async fn an_rdb_seed_s_volume_is_named_by_its_whole_hash_kept_while_a_row_names_it_and_removed_a_window_after(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // Relists every second; nothing asked for a seed within two seconds
    // (and no row naming it) lets its volume go.
    config.relist_interval = Duration::from_secs(1);
    config.warm_pool_demand.window = Duration::from_secs(2);
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let hash = put(&client, "redis", rdb_file()).await;
    let volumes = || seed_volumes(&env, &hash);
    let id = sandbox_id("rdbkept");
    client
        .provision(&id, &seeded(&["redis"], &[("redis", &hash)]), READY)
        .await
        .unwrap();
    // Named by all 64 hex digits of the hash: no two seeds share a
    // volume however their hashes begin (12 digits, 48 bits, were
    // collided on purpose: a denial of service).
    assert_eq!(
        volumes().trim(),
        format!(
            "{}-seed-redis-{}",
            env.deployment,
            hash.trim_start_matches("sha256:")
        )
    );
    // Several relists and more than the window later, the row still
    // names it: kept (and mounted).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(volumes().lines().count(), 1, "kept while a row names it");
    client.release(&id).await.unwrap();
    eventually(
        "the seed's volume removed",
        Duration::from_secs(30),
        || async { volumes().is_empty().then_some(()) },
    )
    .await;
    controller.stop().await;
}

/// A Postgres seed is SQL and nothing else: psql runs it in restricted
/// mode, so a backslash command (a shell, a file) fails it, even after a
/// guessed `\unrestrict`; a seed that ends inside a quote, a comment or a
/// `COPY` block's rows never counts as loaded; a last statement without
/// its `;` still runs.
#[tokio::test]
async fn a_postgres_seed_runs_sql_only_and_counts_as_loaded_only_when_psql_reached_its_end() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let cases: [(&str, &[u8], Option<&str>); 6] = [
        (
            "shell",
            b"CREATE TABLE t (a int);\n\\! touch /tmp/pwned\n",
            Some("line 2: error: backslash commands are restricted"),
        ),
        (
            "guessed-key",
            b"\\unrestrict guess\n\\! touch /tmp/pwned\n",
            Some("backslash commands are restricted"),
        ),
        (
            "open-quote",
            b"CREATE TABLE t (a text);\nINSERT INTO t VALUES ('open",
            Some("postgres seed failed"),
        ),
        (
            "open-comment",
            b"CREATE TABLE t (a int); /* never closed",
            Some("postgres seed failed"),
        ),
        (
            "open-copy",
            b"CREATE TABLE t (a int);\nCOPY t (a) FROM stdin;\n1\n2\n",
            Some("no closing line \\."),
        ),
        (
            "no-semicolon",
            b"CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);\nINSERT INTO items VALUES (1, 'one')",
            None,
        ),
    ];
    let mut runs = Vec::new();
    for (what, content, refused) in cases {
        let hash = put(&client, "postgres", content).await;
        let client = client.clone();
        runs.push(tokio::spawn(async move {
            let id = sandbox_id(what);
            let got = client
                .provision(&id, &seeded(&["postgres"], &[("postgres", &hash)]), READY)
                .await;
            match (refused, got) {
                (None, Ok(status)) => {
                    assert_eq!(items(&status).await.0, ["one"], "{what}");
                }
                (Some(words), Err(ClientError::Failed { message, .. })) => {
                    assert!(message.contains(words), "{what}: {message}");
                }
                (want, got) => panic!("{what}: wanted {want:?}, got {got:?}"),
            }
        }));
    }
    for run in runs {
        run.await.unwrap();
    }
    controller.stop().await;
}

/// Whether the state database still holds seed `hash` of the tests' owner.
async fn stored(env: &TestEnv, hash: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sandbox_seeds WHERE owner = $1 AND hash = $2)")
        .bind(OWNER)
        .bind(hash)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_seed_no_row_names_is_deleted_a_retention_after_it_was_last_named_and_a_named_one_is_kept(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // Relists (which prune) every second; three seconds unnamed is old.
    config.relist_interval = Duration::from_secs(1);
    let retention = Duration::from_secs(3);
    config.seed_retention = retention;
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let unnamed = put(&client, "postgres", "SELECT 'nobody names me';").await;
    let named = put(&client, "postgres", SCHEMA_V1.as_bytes()).await;
    let id = sandbox_id("keeps-its-seed");
    client
        .provision(&id, &seeded(&["postgres"], &[("postgres", &named)]), READY)
        .await
        .unwrap();
    eventually(
        "the unnamed seed deleted",
        Duration::from_secs(30),
        || async { (!stored(&env, &unnamed).await).then_some(()) },
    )
    .await;
    // Well past the window, the named one is still there.
    tokio::time::sleep(retention * 2).await;
    assert!(stored(&env, &named).await, "a seed a row names is kept");
    // Released, it is kept for the window, then deleted.
    let released = std::time::Instant::now();
    assert!(client.release(&id).await.unwrap());
    eventually(
        "the released seed deleted",
        Duration::from_secs(30),
        || async { (!stored(&env, &named).await).then_some(()) },
    )
    .await;
    let after = released.elapsed();
    assert!(
        after >= retention - Duration::from_millis(500),
        "deleted {after:?} after its row was released, before the retention of {retention:?}"
    );
    // A row naming a deleted seed is refused; putting it again serves it.
    let err = client
        .apply(&id, &seeded(&["postgres"], &[("postgres", &named)]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("register it first"), "{err}");
    assert_eq!(put(&client, "postgres", SCHEMA_V1.as_bytes()).await, named);
    controller.stop().await;
}

/// Warm-pool containers of this test's deployment created between `since`
/// and `until` (Unix seconds), as Docker's event log has them.
fn pool_creates(env: &TestEnv, since: i64, until: i64) -> usize {
    docker_ok(&[
        "events",
        "--since",
        &since.to_string(),
        "--until",
        &until.to_string(),
        "--filter",
        "type=container",
        "--filter",
        "event=create",
        "--filter",
        "label=io.sandboxd.pool=1",
        "--filter",
        &format!("label=io.sandboxd.deployment={}", env.deployment),
        "--format",
        "{{.Actor.ID}}",
    ])
    .lines()
    .filter(|l| !l.trim().is_empty())
    .count()
}

fn now_s() -> i64 {
    chrono::Utc::now().timestamp()
}

#[tokio::test]
async fn a_failing_seed_s_pool_backs_off_and_stops_once_its_row_is_released_and_the_seed_deleted() {
    let env = TestEnv::new().await;
    let controller = env.start(learning_pools(&env));
    let client = Client::from_pool(env.pool.clone());
    let failing = put(&client, "postgres", "SELECT 1/0;").await;
    let id = sandbox_id("divides-by-zero");
    let start = now_s();
    let err = client
        .provision(
            &id,
            &seeded(&["postgres"], &[("postgres", &failing)]),
            READY,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("division by zero"), "{err}");
    // The pool learned the seed from the request and tried it: its starts
    // back off (2, 4, 8, 16, 32 s apart at most), or stop.
    let window = 60;
    tokio::time::sleep(Duration::from_secs(
        u64::try_from(start + window - now_s()).unwrap_or(0),
    ))
    .await;
    let during = pool_creates(&env, start, start + window);
    eprintln!("pool starts of the failing seed in its first {window} s: {during}");
    assert!(
        (1..=6).contains(&during),
        "{during} pool containers of the failing seed started in {window} s"
    );
    let failed = |c: &common::RunningController| {
        common::sample(
            &c.metrics.render(),
            "sandboxd_pool_starts_total{engine=\"postgres\",result=\"failed\"}",
        )
        .unwrap_or(0.0)
    };
    assert!(failed(&controller) >= 1.0, "the failed starts are counted");

    // Released and deleted: no start of it again.
    assert!(client.release(&id).await.unwrap());
    eventually("the row gone", Duration::from_secs(30), || async {
        client.delete_seed(&failing, Some(OWNER)).await.ok()
    })
    .await;
    let creating = "sandboxd_pool_size{engine=\"postgres\",state=\"creating\"}";
    eventually("no pool start running", Duration::from_secs(90), || async {
        (common::sample(&controller.metrics.render(), creating) == Some(0.0)).then_some(())
    })
    .await;
    let quiet = now_s();
    let before = failed(&controller);
    tokio::time::sleep(Duration::from_secs(40)).await;
    let after = pool_creates(&env, quiet, now_s());
    eprintln!("pool starts of the released, deleted seed in the 40 s after: {after}");
    // At most one start whose back-off ran out meanwhile (it finds the
    // seed gone, and the pool stops).
    assert!(
        after <= 1,
        "{after} pool containers of the released, deleted seed started in 40 s"
    );
    assert!(failed(&controller) - before <= 1.0);
    controller.stop().await;
}
