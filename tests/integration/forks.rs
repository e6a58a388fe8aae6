//! Forks on the real Docker engine and a real state Postgres
//! (`sandbox_fork`): a fork's Postgres and Redis start with the source's
//! rows and keys as they were at the fork (the last row written just
//! before included), under credentials of their own, while the source
//! keeps serving its open sessions; both diverge afterwards; a heal of the
//! fork starts from its copy again; its copies go with it; Valkey forks
//! too; a Postgres or Redis source forks however it started (claimed from
//! the warm pool, healed from it, rotated, cold, or a fork). Refusals: a source the role cannot see is not found, the owner is
//! the source's, an id is taken once, a fork's services stay its
//! source's, and a fork counts against its owner's quota like any
//! sandbox.

use crate::common;

use common::{docker_ok, eventually, host_pg_url, request, sandbox_id, TestEnv, OWNER};
use sandboxd::adapters::postgres::{PgStore, QuotaSetting};
use sandboxd::client::Client;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use sqlx::{Connection, PgConnection};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

async fn connect(status: &SandboxStatus) -> PgConnection {
    PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .expect("the agent logs in")
}

async fn names(conn: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM items WHERE id > 0 ORDER BY id")
        .fetch_all(conn)
        .await
        .expect("the table is there")
}

async fn count(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM items")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A connection to `engine` of `status`, as the agent.
async fn resp(status: &SandboxStatus, engine: &str) -> redis::aio::MultiplexedConnection {
    let s = &status.services[engine];
    redis::Client::open(format!(
        "redis://:{}@127.0.0.1:{}/0",
        s.password.expose(),
        s.host_port
    ))
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .expect("the agent logs in")
}

async fn set(con: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async::<()>(con)
        .await
        .unwrap();
}

async fn get(con: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(con).await.unwrap()
}

async fn events(env: &TestEnv, id: &SandboxId, reason: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT coalesce(detail, ''), message FROM sandbox_events
          WHERE sandbox_id = $1 AND reason = $2 ORDER BY seq",
    )
    .bind(id.as_str())
    .bind(reason)
    .fetch_all(&env.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_fork_has_the_sources_rows_its_own_credentials_diverges_and_heals_from_its_copy() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());

    let src = sandbox_id("fork-src");
    let source = client
        .provision(&src, &request(&["postgres", "redis"], &[]), READY)
        .await
        .unwrap();
    let mut cache = resp(&source, "redis").await;
    set(&mut cache, "greeting", "hello").await;
    let mut at_source = connect(&source).await;
    sqlx::raw_sql(
        "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, pad text);
         INSERT INTO items SELECT -g, 'bulk', repeat('x', 200) FROM generate_series(1, 20000) g;
         INSERT INTO items VALUES (1, 'one', NULL), (2, 'two', NULL);",
    )
    .execute(&mut at_source)
    .await
    .unwrap();
    // Committed just before the fork (the sandbox commits asynchronously:
    // the copy must still have it).
    sqlx::query("INSERT INTO items VALUES (3, 'three', NULL)")
        .execute(&mut at_source)
        .await
        .unwrap();

    let fork = sandbox_id("fork-new");
    let revision = client.fork(&src, &fork, None).await.unwrap();
    let forked = client.wait_ready(&fork, &revision, READY).await.unwrap();

    // The source's rows, the last one included, under credentials of its own.
    let mut at_fork = connect(&forked).await;
    assert_eq!(names(&mut at_fork).await, ["one", "two", "three"]);
    assert_eq!(count(&mut at_fork).await, 20_003);
    let (f, s) = (&forked.services["postgres"], &source.services["postgres"]);
    assert_ne!(
        f.password.expose(),
        s.password.expose(),
        "fresh credentials"
    );
    assert_ne!(f.host_port, s.host_port);
    assert_ne!(forked.network, source.network, "a network of its own");
    let stolen = format!(
        "postgres://{}:{}@127.0.0.1:{}/{}",
        s.user,
        s.password.expose(),
        f.host_port,
        s.database
    );
    assert!(
        PgConnection::connect(&stolen).await.is_err(),
        "the source's password does not open the fork"
    );
    // The source kept its session through the fork and still serves it.
    assert_eq!(names(&mut at_source).await, ["one", "two", "three"]);
    // Its Redis too: the keys, under a password of its own.
    let mut forked_cache = resp(&forked, "redis").await;
    assert_eq!(
        get(&mut forked_cache, "greeting").await.as_deref(),
        Some("hello")
    );
    assert_ne!(
        forked.services["redis"].password.expose(),
        source.services["redis"].password.expose()
    );
    set(&mut forked_cache, "greeting", "forked").await;
    assert_eq!(get(&mut cache, "greeting").await.as_deref(), Some("hello"));

    // They diverge.
    sqlx::query("INSERT INTO items VALUES (4, 'fork only', NULL)")
        .execute(&mut at_fork)
        .await
        .unwrap();
    sqlx::query("INSERT INTO items VALUES (5, 'source only', NULL)")
        .execute(&mut at_source)
        .await
        .unwrap();
    assert_eq!(
        names(&mut at_fork).await,
        ["one", "two", "three", "fork only"]
    );
    assert_eq!(
        names(&mut at_source).await,
        ["one", "two", "three", "source only"]
    );

    // Forking again into the same id from the same source is the same fork.
    let again = client.fork(&src, &fork, None).await.unwrap();
    assert_eq!(again.generation, revision.generation);
    assert_eq!(again.incarnation, revision.incarnation);

    // Said once, with the source named.
    let said = eventually("a forked event", Duration::from_secs(10), || async {
        let e = events(&env, &fork, "forked").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(said.len(), 2, "one per engine: {said:?}");
    assert!(
        said.iter().all(|(source, _)| source == src.as_str()),
        "{said:?}"
    );
    assert!(
        said[0].1.contains("taken with the source frozen"),
        "{said:?}"
    );
    let text = controller.metrics.render();
    assert_eq!(
        common::total(&text, "sandboxd_fork_copy_seconds_count"),
        2.0,
        "one copy per engine"
    );
    assert!(
        text.contains("sandboxd_fork_copy_seconds_count{engine=\"postgres\",result=\"success\"} 1"),
        "{text}"
    );

    // Two forks of one source at once: one copy at a time (a second
    // freeze must not be thawed by the first), both whole.
    let (x, y) = (sandbox_id("fork-x"), sandbox_id("fork-y"));
    let (rx, ry) = tokio::join!(client.fork(&src, &x, None), client.fork(&src, &y, None));
    let (rx, ry) = (rx.unwrap(), ry.unwrap());
    let (fx, fy) = tokio::join!(
        client.wait_ready(&x, &rx, READY),
        client.wait_ready(&y, &ry, READY)
    );
    for forked in [fx.unwrap(), fy.unwrap()] {
        let mut at = connect(&forked).await;
        assert_eq!(names(&mut at).await, ["one", "two", "three", "source only"]);
        assert_eq!(count(&mut at).await, 20_004);
    }
    client.release(&x).await.unwrap();
    client.release(&y).await.unwrap();

    // A heal of the fork starts from its copy again: the source's rows at
    // the fork, not what either wrote since, and the same credentials.
    drop(at_fork);
    let container = env
        .containers(Some(&fork))
        .await
        .into_iter()
        .find(|c| c.labels.engine == "postgres")
        .expect("the fork's container");
    docker_ok(&["kill", container.id.as_str()]);
    let healed = eventually("the fork healed", READY, || async {
        client
            .status(&fork)
            .await
            .unwrap()
            .filter(|s| s.phase == Phase::Ready && s.services["postgres"].heals == 1)
    })
    .await;
    assert_eq!(
        healed.services["postgres"].password.expose(),
        f.password.expose()
    );
    let mut at_fork = connect(&healed).await;
    assert_eq!(names(&mut at_fork).await, ["one", "two", "three"]);
    drop(at_fork);
    assert_eq!(
        names(&mut at_source).await,
        ["one", "two", "three", "source only"],
        "the source is untouched by the fork's heal"
    );

    // Released, the fork's copies go with it; the source stays.
    let copies = format!("sandboxd.{}.{}.", env.deployment.as_str(), fork.as_str());
    let listed = || docker_ok(&["volume", "ls", "-q", "--filter", &format!("name={copies}")]);
    let mut volumes: Vec<String> = listed().lines().map(str::to_owned).collect();
    volumes.sort();
    assert_eq!(
        volumes,
        [
            format!("{copies}postgres.fork"),
            format!("{copies}redis.fork")
        ]
    );
    client.release(&fork).await.unwrap();
    eventually(
        "the fork's copies removed",
        Duration::from_secs(60),
        || async { listed().trim().is_empty().then_some(()) },
    )
    .await;
    assert_eq!(get(&mut cache, "greeting").await.as_deref(), Some("hello"));
    assert_eq!(count(&mut at_source).await, 20_004);
    let helpers = docker_ok(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=io.sandboxd.fork-helper={}", fork.as_str()),
    ]);
    assert!(helpers.trim().is_empty(), "no helper left: {helpers}");
    controller.stop().await;
}

/// The events of `reason` for `id`, once there is one (they are written
/// in batches, after the status).
async fn said(env: &TestEnv, id: &SandboxId, reason: &str) -> Vec<(String, String)> {
    eventually(reason, Duration::from_secs(10), || async {
        let e = events(env, id, reason).await;
        (!e.is_empty()).then_some(e)
    })
    .await
}

/// Writes `name` as the only row of the source's `items`.
async fn mark(status: &SandboxStatus, name: &str) {
    let mut conn = connect(status).await;
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY, name text NOT NULL, pad text);
         DELETE FROM items;
         INSERT INTO items VALUES (1, '{name}', NULL);"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
}

/// The engine whose data a source forks, and how the test marks a
/// source's data and reads a fork's.
#[derive(Clone, Copy)]
enum Data {
    /// The rows of `items`.
    Postgres,
    /// The key `mark`.
    Redis,
}

impl Data {
    fn engine(self) -> &'static str {
        match self {
            Data::Postgres => "postgres",
            Data::Redis => "redis",
        }
    }

    /// A feature no pool holds: a source rotates to it, and starts cold
    /// with it.
    fn feature(self) -> &'static str {
        match self {
            Data::Postgres => "pg_trgm",
            Data::Redis => "json",
        }
    }

    /// Makes `name` the source's only mark.
    async fn mark(self, status: &SandboxStatus, name: &str) {
        match self {
            Data::Postgres => mark(status, name).await,
            Data::Redis => set(&mut resp(status, "redis").await, "mark", name).await,
        }
    }

    /// The marks `status`'s sandbox holds.
    async fn marks(self, status: &SandboxStatus) -> Vec<String> {
        match self {
            Data::Postgres => names(&mut connect(status).await).await,
            Data::Redis => get(&mut resp(status, "redis").await, "mark")
                .await
                .into_iter()
                .collect(),
        }
    }
}

/// Forks `src` (which started `how`) into `fork` and checks the fork holds
/// the source's only mark, `name`.
async fn forks_with(
    client: &Client,
    data: Data,
    (src, how): (&SandboxId, &str),
    fork: &SandboxId,
    name: &str,
) {
    let revision = client.fork(src, fork, None).await.unwrap();
    let forked = client
        .wait_ready(fork, &revision, READY)
        .await
        .unwrap_or_else(|e| panic!("a source {how} forks: {e}"));
    assert_eq!(
        data.marks(&forked).await,
        [name],
        "the fork of a source {how} has its data"
    );
}

/// The ready status of `id` once `done` holds of it.
async fn ready_when(
    client: &Client,
    id: &SandboxId,
    what: &str,
    done: impl Fn(&SandboxStatus) -> bool,
) -> SandboxStatus {
    eventually(what, READY, || async {
        client
            .status(id)
            .await
            .unwrap()
            .filter(|s| s.phase == Phase::Ready && done(s))
    })
    .await
}

#[tokio::test]
async fn a_source_forks_however_it_started_claimed_from_the_pool_healed_from_it_rotated_cold_or_forked(
) {
    forks_however_it_started(Data::Postgres).await;
}

#[tokio::test]
async fn a_redis_source_forks_however_it_started_claimed_from_the_pool_healed_from_it_rotated_cold_or_forked(
) {
    forks_however_it_started(Data::Redis).await;
}

/// A source of `data`'s engine forks, its data in the fork, however it
/// started: claimed from the warm pool, healed from it, rotated, cold, or
/// forked itself.
async fn forks_however_it_started(data: Data) {
    let engine = data.engine();
    let id = |what: &str| sandbox_id(&format!("{engine}-{what}"));
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.warm_pool = sandboxd::config::warm_pools(&[format!("{engine}=1")]).unwrap();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let pool_ready = || async {
        let metric = format!("sandboxd_pool_size{{engine=\"{engine}\",state=\"ready\"}}");
        eventually("a ready pool container", READY, || async {
            let text = controller.metrics.render();
            (common::sample(&text, &metric) == Some(1.0)).then_some(())
        })
        .await
    };

    // Claimed from the warm pool (every plain request under run.sh's
    // defaults): its container carries the pool's labels, its claim says
    // whose it is.
    pool_ready().await;
    let src = id("fork-pooled");
    let source = client
        .provision(&src, &request(&[engine], &[]), READY)
        .await
        .unwrap();
    let claimed = said(&env, &src, "claimed").await;
    assert_eq!(claimed.len(), 1, "served from the pool: {claimed:?}");
    data.mark(&source, "claimed").await;
    let first = id("fork-of-pooled");
    let how = (&src, "claimed from the pool");
    forks_with(&client, data, how, &first, "claimed").await;

    // Healed from the pool: another pool container, claimed by the heal.
    pool_ready().await;
    let name = format!("sandboxd.{}.{}.{engine}", env.deployment, src);
    docker_ok(&["kill", &name]);
    let healed = ready_when(&client, &src, "the source healed", |s| {
        s.services[engine].heals == 1
    })
    .await;
    let heal = said(&env, &src, "healed").await;
    assert!(
        heal.iter().any(|(_, m)| m.contains("from the warm pool")),
        "healed from the pool: {heal:?}"
    );
    data.mark(&healed, "healed").await;
    let how = (&src, "healed from the pool");
    forks_with(&client, data, how, &id("fork-of-healed"), "healed").await;

    // Rotated: a feature the container lacks, so a new container (cold:
    // no pool holds it) replaced the claimed one under its name.
    let grown = client
        .apply(&src, &request(&[engine], &[(engine, data.feature())]))
        .await
        .unwrap();
    let rotated = ready_when(&client, &src, "the source rotated", |s| {
        s.observed_generation >= grown.generation
    })
    .await;
    assert_eq!(said(&env, &src, "rotated").await.len(), 1);
    data.mark(&rotated, "rotated").await;
    let how = (&src, "rotated");
    forks_with(&client, data, how, &id("fork-of-rotated"), "rotated").await;

    // Cold: a feature set no pool holds.
    let cold = id("fork-cold");
    let with_feature = request(&[engine], &[(engine, data.feature())]);
    let cold_status = client.provision(&cold, &with_feature, READY).await.unwrap();
    let created = said(&env, &cold, "provisioned").await;
    assert!(
        created.iter().any(|(origin, _)| origin == "cold"),
        "{created:?}"
    );
    data.mark(&cold_status, "cold").await;
    forks_with(&client, data, (&cold, "cold"), &id("fork-of-cold"), "cold").await;

    // Forked: a fork of the first fork has what the fork was made with.
    let how = (&first, "forked");
    forks_with(&client, data, how, &id("fork-of-fork"), "claimed").await;
    controller.stop().await;
}

#[tokio::test]
async fn forks_are_refused_for_unseen_sources_other_owners_taken_ids_and_new_services_and_wait_for_quota(
) {
    let env = TestEnv::new().await;
    let store = PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let mut config = env.config();
    config.images = common::test_images_with_valkey();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let src = sandbox_id("fork-ref");
    client
        .provision(&src, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();

    // An orchestrator that sees only its own rows cannot fork another's.
    let (role, theirs) = env.own_rows_orchestrator("fork_orch").await;
    let fork_sql = "SELECT sandbox_fork($1, $2, $3)";
    let stolen = sandbox_id("fork-stolen");
    let (code, message) =
        common::refusal(&theirs, fork_sql, &[src.as_str(), stolen.as_str(), &role]).await;
    assert_eq!(code, "P0002", "{message}");
    assert!(message.contains("is not found"), "{message}");
    // Nor by naming it in a row of its own.
    let incarnation = client.incarnation(&src).await.unwrap().unwrap().to_string();
    let forged = sandbox_id("fork-forged");
    let (code, message) = common::refusal(
        &theirs,
        "INSERT INTO sandbox_desired (id, services, fork_of, fork_of_incarnation)
         VALUES ($1, '{postgres}', $2, $3::uuid)",
        &[forged.as_str(), src.as_str(), &incarnation],
    )
    .await;
    assert_eq!(code, "P0002", "{message}");

    // A fork is its source's owner's.
    let other = sandbox_id("fork-o");
    let (code, message) = common::refusal(
        &env.pool,
        fork_sql,
        &[src.as_str(), other.as_str(), "mallory"],
    )
    .await;
    assert_eq!(code, "23514", "{message}");
    assert!(
        message.contains("belongs to its source's owner"),
        "{message}"
    );
    // An id is taken once.
    let (code, message) =
        common::refusal(&env.pool, fork_sql, &[src.as_str(), src.as_str(), OWNER]).await;
    assert_eq!(code, "23505", "{message}");
    assert!(message.contains("is taken"), "{message}");

    // A fork counts against its owner's quota like any sandbox: with room
    // for one, it waits.
    store
        .set_quota(OWNER, QuotaSetting::To(1), QuotaSetting::Keep)
        .await
        .unwrap();
    let fork = sandbox_id("fork-q");
    client.fork(&src, &fork, None).await.unwrap();
    eventually(
        "the fork waits for quota",
        Duration::from_secs(30),
        || async {
            client
                .status(&fork)
                .await
                .unwrap()
                .filter(|s| s.phase == Phase::Pending && s.message.contains("waiting for quota"))
        },
    )
    .await;
    assert!(
        env.containers(Some(&fork)).await.is_empty(),
        "nothing created"
    );

    // A fork's services are its source's.
    let (code, message) = common::refusal(
        &env.pool,
        "SELECT sandbox_request($1, NULL, '{postgres,redis}')",
        &[fork.as_str()],
    )
    .await;
    assert_eq!(code, "23514", "{message}");
    assert!(
        message.contains("are its source's at the fork"),
        "{message}"
    );
    client.release(&fork).await.unwrap();
    store
        .set_quota(OWNER, QuotaSetting::Unlimited, QuotaSetting::Keep)
        .await
        .unwrap();

    // Valkey forks like Redis (the same copy, with valkey-cli).
    let cache = sandbox_id("fork-valkey");
    let source = client
        .provision(&cache, &request(&["valkey"], &[]), READY)
        .await
        .unwrap();
    set(&mut resp(&source, "valkey").await, "k", "v").await;
    let child = sandbox_id("fork-valkey-new");
    let revision = client.fork(&cache, &child, None).await.unwrap();
    let forked = client.wait_ready(&child, &revision, READY).await.unwrap();
    assert_eq!(
        get(&mut resp(&forked, "valkey").await, "k")
            .await
            .as_deref(),
        Some("v")
    );
    controller.stop().await;
}
