//! Quotas and admission against the real controller, the real Docker
//! engine and a real state database: an owner's limit holds a row back
//! `pending` with a message naming the limit and the use, and a release
//! admits it within one reconcile (no relist); the host's memory budget
//! refuses what would overcommit it; a sandbox is never half-provisioned;
//! `sandboxd quota` sets, lists and unsets limits.

use crate::common;

use common::{eventually, sandbox_id, TestEnv, BIN};
use sandboxd::adapters::postgres::QuotaSetting;
use sandboxd::adapters::PgStore;
use sandboxd::client::{Client, Request};
use sandboxd::config::ControllerConfig;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);
/// The test configuration's memory cap per engine container.
const ENGINE: u64 = 256 << 20;

fn ask(owner: &str, services: &[&str]) -> Request {
    Request {
        owner: Some(owner.to_owned()),
        services: services.iter().map(|s| s.to_string()).collect(),
        ..Request::default()
    }
}

/// The test configuration with no periodic relist that could admit a
/// waiting row: only a reconcile that frees room does.
fn config(env: &TestEnv) -> ControllerConfig {
    let mut c = env.config();
    assert_eq!(c.limits.memory_bytes as u64, ENGINE);
    c.relist_interval = Duration::from_secs(3600);
    c
}

async fn status(client: &Client, id: &SandboxId) -> Option<SandboxStatus> {
    client.status(id).await.unwrap()
}

/// Waits until `id` is `pending` with a message containing `needle`.
async fn pending_with(client: &Client, id: &SandboxId, needle: &str) -> SandboxStatus {
    eventually(
        &format!("{id} pending with {needle:?}"),
        Duration::from_secs(30),
        || async {
            status(client, id)
                .await
                .filter(|s| s.phase == Phase::Pending && s.message.contains(needle))
        },
    )
    .await
}

async fn ready(client: &Client, id: &SandboxId, within: Duration) -> SandboxStatus {
    eventually(&format!("{id} ready"), within, || async {
        status(client, id).await.filter(|s| s.phase == Phase::Ready)
    })
    .await
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test]
async fn with_an_owner_limit_of_two_a_third_row_stays_pending_and_is_ready_within_one_reconcile_of_a_release(
) {
    let env = TestEnv::new().await;
    let store = PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    store
        .set_quota("alice", QuotaSetting::To(2), QuotaSetting::Keep)
        .await
        .unwrap();
    let controller = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let (a, b, c) = (sandbox_id("qa"), sandbox_id("qb"), sandbox_id("qc"));
    for id in [&a, &b] {
        client
            .request_and_wait(id, &ask("alice", &["redis"]), READY)
            .await
            .unwrap();
    }
    // Another owner is not held back by alice's limit.
    let other = sandbox_id("qo");
    client
        .request(&other, &ask("bob", &["redis"]))
        .await
        .unwrap();

    client.request(&c, &ask("alice", &["redis"])).await.unwrap();
    let waiting = pending_with(&client, &c, "waiting for quota").await;
    assert_eq!(
        waiting.message,
        "waiting for quota: owner 'alice' has 2 of 2 sandboxes and 512 MiB of unlimited memory (limit sandboxes=2); admitted when one of its sandboxes is released"
    );
    assert_eq!(waiting.observed_generation, 0);
    ready(&client, &other, READY).await;
    // It stays so: nothing of it is created.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(status(&client, &c).await.unwrap().phase, Phase::Pending);
    assert!(env.containers(Some(&c)).await.is_empty(), "nothing created");
    let text = controller.metrics.render();
    assert_eq!(metric(&text, "sandboxd_admission_waiting"), 1.0);
    assert_eq!(
        metric(
            &text,
            "sandboxd_quota_used{owner=\"alice\",resource=\"sandboxes\"}"
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "sandboxd_quota_limit{owner=\"alice\",resource=\"sandboxes\"}"
        ),
        2.0
    );
    let events = client.events(&c, 10).await.unwrap();
    assert!(
        events.iter().any(|e| e.reason == "waiting"),
        "a waiting event: {events:?}"
    );

    // Releasing one admits the waiting row at once: the release's
    // reconcile wakes it (the periodic relist is an hour away).
    let released = std::time::Instant::now();
    client.release(&a).await.unwrap();
    let ready_c = ready(&client, &c, Duration::from_secs(30)).await;
    assert!(ready_c.services.contains_key("redis"));
    eprintln!("c ready {:?} after a's release", released.elapsed());
    controller.stop().await;
}

#[tokio::test]
async fn the_host_memory_budget_refuses_what_would_overcommit_it() {
    let env = TestEnv::new().await;
    let mut c = config(&env);
    // One and a half engines' worth.
    c.memory_budget = Some(ENGINE * 3 / 2);
    let controller = env.start(c);
    let client = Client::from_pool(env.pool.clone());
    let (a, b) = (sandbox_id("ga"), sandbox_id("gb"));
    client
        .request_and_wait(&a, &ask("alice", &["redis"]), READY)
        .await
        .unwrap();
    // Another owner: the host's budget is everyone's.
    client.request(&b, &ask("bob", &["redis"])).await.unwrap();
    let waiting = pending_with(&client, &b, "memory budget").await;
    assert_eq!(
        waiting.message,
        "waiting for the host's memory budget: 256 MiB of 384 MiB in use, this sandbox needs 256 MiB; admitted when memory is released"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(env.containers(Some(&b)).await.is_empty(), "nothing created");
    let text = controller.metrics.render();
    assert_eq!(
        metric(&text, "sandboxd_memory_budget_bytes"),
        (ENGINE * 3 / 2) as f64
    );
    assert_eq!(
        metric(&text, "sandboxd_memory_admitted_bytes"),
        ENGINE as f64
    );
    // Once the first one's container is removed, the budget has room.
    client.release(&a).await.unwrap();
    ready(&client, &b, Duration::from_secs(30)).await;
    controller.stop().await;
}

#[tokio::test]
async fn a_sandbox_of_postgres_and_redis_where_only_one_fits_is_not_half_provisioned() {
    let env = TestEnv::new().await;
    let mut c = config(&env);
    // Two and a half engines' worth: one runs, one more fits, two do not.
    c.memory_budget = Some(ENGINE * 5 / 2);
    let controller = env.start(c);
    let client = Client::from_pool(env.pool.clone());
    let (a, both, later) = (sandbox_id("ha"), sandbox_id("hb"), sandbox_id("hc"));
    client
        .request_and_wait(&a, &ask("alice", &["redis"]), READY)
        .await
        .unwrap();
    client
        .request(&both, &ask("bob", &["postgres", "redis"]))
        .await
        .unwrap();
    let waiting = pending_with(&client, &both, "memory budget").await;
    assert_eq!(
        waiting.message,
        "waiting for the host's memory budget: 256 MiB of 640 MiB in use, this sandbox needs 512 MiB; admitted when memory is released"
    );
    // A later row that would fit does not overtake it.
    client
        .request(&later, &ask("carol", &["redis"]))
        .await
        .unwrap();
    pending_with(&client, &later, "behind").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        env.containers(Some(&both)).await.is_empty(),
        "neither engine created"
    );
    assert!(env.containers(Some(&later)).await.is_empty());

    client.release(&a).await.unwrap();
    let both_ready = ready(&client, &both, READY).await;
    assert_eq!(both_ready.services.len(), 2);
    // Now the later one waits for the budget itself (512 of 640 MiB).
    pending_with(&client, &later, "512 MiB of 640 MiB in use").await;
    controller.stop().await;
}

#[tokio::test]
async fn a_running_sandbox_that_asks_for_a_service_over_its_owners_memory_limit_stays_ready_as_it_is(
) {
    let env = TestEnv::new().await;
    let store = PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    // Two engines and a half.
    store
        .set_quota(
            "alice",
            QuotaSetting::Keep,
            QuotaSetting::To(ENGINE * 5 / 2),
        )
        .await
        .unwrap();
    let controller = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let (grows, other) = (sandbox_id("ga"), sandbox_id("gb"));
    let before = client
        .request_and_wait(&grows, &ask("alice", &["redis"]), READY)
        .await
        .unwrap();
    client
        .request_and_wait(&other, &ask("alice", &["redis"]), READY)
        .await
        .unwrap();
    // A third engine would make 768 MiB of 640 MiB.
    client
        .request(&grows, &ask("alice", &["valkey"]))
        .await
        .unwrap();
    let held = eventually(
        "the growth is held back",
        Duration::from_secs(30),
        || async {
            status(&client, &grows)
                .await
                .filter(|s| s.message.contains("waiting for quota"))
        },
    )
    .await;
    assert_eq!(held.phase, Phase::Ready, "{}", held.message);
    assert_eq!(
        held.message,
        "ready; its new engines are not created: waiting for quota: owner 'alice' has 2 of unlimited sandboxes and 512 MiB of 640 MiB memory (limit memory=640 MiB), its new engines need 256 MiB; admitted when some of the owner's memory is released"
    );
    assert_eq!(held.observed_generation, before.observed_generation);
    assert_eq!(
        held.services["redis"], before.services["redis"],
        "redis untouched"
    );
    assert!(!held.services.contains_key("valkey"));
    let engines: Vec<String> = env
        .containers(Some(&grows))
        .await
        .into_iter()
        .map(|c| c.labels.engine)
        .collect();
    assert_eq!(engines, ["redis"], "nothing of valkey created");

    client.release(&other).await.unwrap();
    let grown = eventually(
        "the growth is admitted",
        Duration::from_secs(30),
        || async {
            status(&client, &grows)
                .await
                .filter(|s| s.phase == Phase::Ready && s.services.contains_key("valkey"))
        },
    )
    .await;
    assert_eq!(grown.services["redis"], before.services["redis"]);
    assert!(grown.observed_generation > before.observed_generation);
    controller.stop().await;
}

fn sandboxd(env: &TestEnv, args: &[&str]) -> String {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", &env.url)
        .output()
        .expect("run sandboxd");
    assert!(
        out.status.success(),
        "sandboxd {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn the_quota_command_sets_lists_and_unsets_limits_and_the_default_applies_to_owners_without_a_row(
) {
    let env = TestEnv::new().await;
    let out = sandboxd(
        &env,
        &["quota", "set", "*", "--sandboxes", "5", "--memory", "4GiB"],
    );
    assert_eq!(
        out.trim(),
        "quota of \"*\": sandboxes=5 memory=4 GiB seeds=16 seed-bytes=64 MiB"
    );
    let out = sandboxd(&env, &["quota", "set", "alice", "--sandboxes", "2"]);
    assert_eq!(
        out.trim(),
        "quota of \"alice\": sandboxes=2 memory=unlimited seeds=16 seed-bytes=64 MiB"
    );
    // A limit not given keeps its value.
    let out = sandboxd(&env, &["quota", "set", "alice", "--memory", "1.5GiB"]);
    assert_eq!(
        out.trim(),
        "quota of \"alice\": sandboxes=2 memory=1.5 GiB seeds=16 seed-bytes=64 MiB"
    );

    let store = PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    use sandboxd::ports::Store;
    let alice = store.owner_quota("alice").await.unwrap();
    assert_eq!(
        (alice.sandboxes, alice.memory_bytes),
        (Some(2), Some(1536 << 20))
    );
    let bob = store.owner_quota("bob").await.unwrap();
    assert_eq!((bob.sandboxes, bob.memory_bytes), (Some(5), Some(4 << 30)));

    let list = sandboxd(&env, &["quota", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert!(lines[0].starts_with("OWNER"), "{list}");
    assert!(lines[1].starts_with('*'), "{list}");
    assert!(
        lines[2].starts_with("alice")
            && lines[2].contains("0/2")
            && lines[2].contains("0 B/1.5 GiB"),
        "{list}"
    );

    let out = sandboxd(&env, &["quota", "unset", "alice"]);
    assert!(out.contains("the default"), "{out}");
    let alice = store.owner_quota("alice").await.unwrap();
    assert_eq!(alice.sandboxes, Some(5), "the default applies again");
    sandboxd(&env, &["quota", "unset", "*"]);
    let nobody = store.owner_quota("alice").await.unwrap();
    assert_eq!((nobody.sandboxes, nobody.memory_bytes), (None, None));
}

#[tokio::test]
async fn an_orchestrator_reads_the_default_and_its_own_quota_only() {
    let env = TestEnv::new().await;
    let store = PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    for owner in ["*", "orch_q", "someone_else"] {
        store
            .set_quota(owner, QuotaSetting::To(3), QuotaSetting::Keep)
            .await
            .unwrap();
    }
    let (pool, _) = env.create_login_role("orch_q").await;
    // Not registered yet: nothing.
    let seen: Result<Vec<String>, _> =
        sqlx::query_scalar("SELECT owner FROM sandbox_quotas ORDER BY owner")
            .fetch_all(&pool)
            .await;
    assert!(seen.map(|s| s.is_empty()).unwrap_or(true));
    store.grant_orchestrator("orch_q", true).await.unwrap();
    let seen: Vec<String> = sqlx::query_scalar("SELECT owner FROM sandbox_quotas ORDER BY owner")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(seen, ["*", "orch_q"]);
    let written = sqlx::query("UPDATE sandbox_quotas SET max_sandboxes = 100")
        .execute(&pool)
        .await;
    assert!(written.is_err(), "an orchestrator cannot raise its quota");
}

/// Registers `content` as a postgres seed of `owner`: the database's
/// refusal, if any.
async fn put_seed(client: &Client, owner: &str, content: &[u8]) -> Result<String, String> {
    client
        .put_seed("postgres", content, Some(owner))
        .await
        .map_err(|e| match e {
            sandboxd::client::ClientError::Refused(m) => m,
            other => panic!("a refusal with the database's words, got {other}"),
        })
}

#[tokio::test]
async fn an_owner_over_its_seed_quota_is_refused_saying_the_limit_and_the_use_another_owner_is_not()
{
    let env = TestEnv::new().await;
    // sandboxd's schema is the controller's to make.
    let controller = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let seed = |owner: &str, i: usize| format!("-- {owner} {i}\nSELECT {i};").into_bytes();

    // No quota row: the built-in default, 16 seeds.
    let mut first = String::new();
    for i in 0..16 {
        let hash = put_seed(&client, "hoarder", &seed("hoarder", i))
            .await
            .unwrap_or_else(|m| panic!("seed {i} of 16 fits the default: {m}"));
        if i == 0 {
            first = hash;
        }
    }
    let refused = put_seed(&client, "hoarder", &seed("hoarder", 16))
        .await
        .expect_err("a 17th seed is over the default quota");
    assert!(
        refused.contains("holds 16 seeds")
            && refused.contains("at most 16")
            && refused.contains("built-in default")
            && refused.contains("sandbox_seed_delete")
            && refused.contains("--seeds"),
        "{refused}"
    );
    // The same content again is the seed it holds, not another.
    assert_eq!(
        put_seed(&client, "hoarder", &seed("hoarder", 0)).await,
        Ok(first.clone())
    );
    // Another owner's seeds are its own.
    put_seed(&client, "neighbour", &seed("neighbour", 0))
        .await
        .expect("another owner is not held back");
    // Deleting one makes room.
    assert!(client.delete_seed(&first, Some("hoarder")).await.unwrap());
    put_seed(&client, "hoarder", &seed("hoarder", 16))
        .await
        .expect("room again after a delete");

    // A quota row's byte limit, the whole seed counted.
    let out = sandboxd(&env, &["quota", "set", "bulky", "--seed-bytes", "1MiB"]);
    assert_eq!(
        out.trim(),
        "quota of \"bulky\": sandboxes=unlimited memory=unlimited seeds=16 seed-bytes=1 MiB"
    );
    let big = |i: u8| {
        let mut s = format!("-- {i}\n").into_bytes();
        s.resize(600 << 10, b' ');
        s
    };
    put_seed(&client, "bulky", &big(1)).await.unwrap();
    let refused = put_seed(&client, "bulky", &big(2))
        .await
        .expect_err("1.2 MiB is over 1 MiB");
    assert!(
        refused.contains(&format!("{} bytes together", 600 << 10))
            && refused.contains(&format!("would make {}", 1200 << 10))
            && refused.contains("at most 1048576 bytes")
            && refused.contains("quota row 'bulky'")
            && refused.contains("--seed-bytes"),
        "{refused}"
    );
    put_seed(&client, "neighbour", &big(2))
        .await
        .expect("another owner is not held back");

    // Puts at once of one owner take turns: exactly its limit fit.
    sandboxd(&env, &["quota", "set", "racer", "--seeds", "2"]);
    let puts = (0..8).map(|i| {
        let client = client.clone();
        async move { put_seed(&client, "racer", &seed("racer", i)).await }
    });
    let results = futures::future::join_all(puts).await;
    let fit = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(fit, 2, "{results:?}");
    // A snapshot older than the lock would not see the others' seeds.
    let mut tx = env.pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = sqlx::query("SELECT sandbox_seed_put('postgres', 'SELECT 99;'::bytea, 'racer')")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("runs only in READ COMMITTED"),
        "{err}"
    );
    drop(tx);
    let list = sandboxd(&env, &["quota", "list"]);
    let racer = list.lines().find(|l| l.starts_with("racer")).unwrap();
    assert!(racer.contains("2/2"), "{list}");
    controller.stop().await;
}
