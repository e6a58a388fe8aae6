//! Tenants in the state database (issue 29), with two own-rows-only
//! orchestrator roles on a real Postgres (and, where it matters, a real
//! controller on Docker):
//!
//! - a released sandbox's credentials: cleared from its status in the
//!   releasing transaction, never written back for an old incarnation, and
//!   a status is seen only with its row's incarnation, so the tenant that
//!   takes the id next reads nothing of the last one's;
//! - checkpoints and resets: written only through their verbs, which
//!   refuse another tenant's sandbox and more than a bounded number of
//!   pending requests; the controller still performs them;
//! - notifications: every role may LISTEN, so no payload names a sandbox
//!   id, and a relist that no owner asked for is ignored;
//! - the row-level security helpers (issue 50): no function a tenant may
//!   call takes a role to judge, so none answers for another tenant.

use crate::common;

use common::{hold_lease, request, sandbox_id, TestEnv};
use futures::StreamExt;
use sandboxd::client::Client;
use sandboxd::domain::SandboxId;
use sandboxd::ports::store::{Store, NOTIFY_EVERY_ROW};
use serde_json::Value;
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

/// Two own-rows-only orchestrator roles of this test, A and B: their names
/// and pools.
async fn tenants(env: &TestEnv) -> [(String, PgPool); 2] {
    [
        env.own_rows_orchestrator("tenant_a").await,
        env.own_rows_orchestrator("tenant_b").await,
    ]
}

/// The status row of `id` as stored (read as the tables' owner, which
/// row-level security does not filter): its services, as JSON.
async fn stored_services(env: &TestEnv, id: &str) -> Option<Value> {
    sqlx::query_scalar("SELECT services FROM sandbox_status WHERE id = $1")
        .bind(id)
        .fetch_optional(&env.pool)
        .await
        .unwrap()
}

/// What tenant A sees of `id`'s status after inserting `id` itself, in a
/// transaction it rolls back (as a tenant may, to probe a released id).
async fn seen_after_taking(a: &PgPool, id: &str) -> Vec<String> {
    let mut tx = a.begin().await.unwrap();
    sqlx::query("INSERT INTO sandbox_desired (id, services) VALUES ($1, '{redis}')")
        .bind(id)
        .execute(&mut *tx)
        .await
        .expect("the released id is free to take");
    let seen: Vec<String> =
        sqlx::query_scalar("SELECT services::text FROM sandbox_status WHERE id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    tx.rollback().await.unwrap();
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn a_released_sandboxs_credentials_are_cleared_at_once_and_never_seen_by_the_next_tenant_of_its_id(
) {
    let env = TestEnv::new().await;
    let [(_, a), (_, b)] = tenants(&env).await;
    let controller = env.start(env.config());
    let client_b = Client::from_pool(b.clone());
    let id = sandbox_id("released");
    let mut req = request(&["redis"], &[]);
    req.owner = String::new(); // B's own role
    let ready = client_b
        .provision(&id, &req, READY)
        .await
        .expect("B's sandbox is ready");
    let password = ready.services["redis"].password.expose().to_owned();
    assert!(!password.is_empty());
    // B's checkpoint and reset go through the verbs (B may not write the
    // tables) and the controller still performs them.
    client_b
        .checkpoint(&id, "before", READY)
        .await
        .expect("B's checkpoint is taken");
    client_b
        .reset(&id, Some("before"), READY)
        .await
        .expect("B's reset is done");

    // No controller from here on: what follows is the database's alone.
    controller.stop().await;
    assert!(client_b.release(&id).await.unwrap());
    let left = stored_services(&env, id.as_str())
        .await
        .expect("the status row stays until a controller tears the sandbox down");
    assert!(
        !left.to_string().contains(&password),
        "the release left B's password in the status: {left}"
    );
    assert_eq!(left["redis"]["password"], "");
    assert_eq!(left["redis"]["url"], "");
    assert_eq!(left["redis"]["env"], serde_json::json!({}));

    // A takes the id in a transaction and looks: nothing of B's.
    let seen = seen_after_taking(&a, id.as_str()).await;
    assert!(seen.is_empty(), "A saw B's status of {id}: {seen:?}");
}

#[tokio::test]
async fn a_status_holds_credentials_only_for_its_rows_current_incarnation_and_is_seen_only_with_it()
{
    let env = TestEnv::new().await;
    let [(role_a, a), _] = tenants(&env).await;
    let term = hold_lease(&env.pool).await;
    let id = "inc-x";
    let secret = r#"{"redis": {"password": "pw-of-incarnation-one", "url": "redis://:pw-of-incarnation-one@h:6379/0", "env": {"REDIS_URL": "redis://:pw-of-incarnation-one@h:6379/0"}, "host": "h", "port": 6379, "host_port": 41234}}"#;
    sqlx::query("INSERT INTO sandbox_desired (id, owner, services) VALUES ($1, $2, '{redis}')")
        .bind(id)
        .bind(&role_a)
        .execute(&env.pool)
        .await
        .unwrap();
    let write = |incarnation: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query(&format!(
                "INSERT INTO sandbox_status (id, phase, services, incarnation, leader_term)
                 VALUES ($1, 'ready', $2::jsonb, {incarnation}, $3)
                 ON CONFLICT (id) DO UPDATE SET services = EXCLUDED.services,
                     incarnation = EXCLUDED.incarnation, leader_term = EXCLUDED.leader_term"
            ))
            .bind(id)
            .bind(secret)
            .bind(term)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    const CURRENT: &str = "(SELECT incarnation FROM sandbox_desired WHERE id = $1)";
    write(CURRENT).await;
    let services = stored_services(&env, id).await.unwrap();
    assert_eq!(services["redis"]["password"], "pw-of-incarnation-one");
    assert_eq!(services["redis"]["host_port"], 41234);
    let seen: Vec<String> = sqlx::query_scalar("SELECT id FROM sandbox_status")
        .fetch_all(&a)
        .await
        .unwrap();
    assert_eq!(seen, [id], "A sees the status of its row's incarnation");

    // A controller's write for another incarnation (it read the row before
    // it was released and inserted again) keeps no credential.
    write("gen_random_uuid()").await;
    let services = stored_services(&env, id).await.unwrap();
    assert_eq!(services["redis"]["password"], "");
    assert_eq!(services["redis"]["url"], "");
    assert_eq!(services["redis"]["env"], serde_json::json!({}));
    assert_eq!(services["redis"]["host_port"], 41234, "the rest is kept");
    let seen: Vec<String> = sqlx::query_scalar("SELECT id FROM sandbox_status")
        .fetch_all(&a)
        .await
        .unwrap();
    assert!(
        seen.is_empty(),
        "a status of another incarnation is not A's to see: {seen:?}"
    );

    // The lease lapses (no controller leads); A releases its row: the
    // credentials go in the same transaction.
    write(CURRENT).await;
    sqlx::query("SELECT sandbox_lease_release('test', $1)")
        .bind(term)
        .execute(&env.pool)
        .await
        .unwrap();
    let released: bool = sqlx::query_scalar("SELECT sandbox_release($1)")
        .bind(id)
        .fetch_one(&a)
        .await
        .expect("a release needs no leader");
    assert!(released);
    let services = stored_services(&env, id).await.unwrap();
    assert!(
        !services.to_string().contains("pw-of-incarnation-one"),
        "{services}"
    );
    // A later write for the deleted row (a controller that read it just
    // before the release) keeps none either.
    let term = hold_lease(&env.pool).await;
    sqlx::query("UPDATE sandbox_status SET services = $2::jsonb, leader_term = $3 WHERE id = $1")
        .bind(id)
        .bind(secret)
        .bind(term)
        .execute(&env.pool)
        .await
        .unwrap();
    let services = stored_services(&env, id).await.unwrap();
    assert!(
        !services.to_string().contains("pw-of-incarnation-one"),
        "{services}"
    );
    // And whoever takes the id next sees no status of the last incarnation.
    let seen = seen_after_taking(&a, id).await;
    assert!(seen.is_empty(), "{seen:?}");
}

#[tokio::test]
async fn orchestrators_write_checkpoints_and_resets_only_through_the_verbs_and_pending_requests_are_bounded(
) {
    let env = TestEnv::new().await;
    let [(role_a, a), (_, b)] = tenants(&env).await;
    sqlx::query("SELECT sandbox_request('ckpt-a', NULL, '{redis}')")
        .execute(&a)
        .await
        .unwrap();

    // No direct write, and no request number drawn by hand (a tenant that
    // could would take numbers ahead of every other tenant's requests).
    for sql in [
        format!(
            "INSERT INTO sandbox_resets (request, sandbox_id, checkpoint, owner, incarnation)
             VALUES (9000000, 'ckpt-a', 'baseline', '{role_a}',
                     (SELECT incarnation FROM sandbox_desired WHERE id = 'ckpt-a'))"
        ),
        format!(
            "INSERT INTO sandbox_checkpoints (sandbox_id, name, owner, incarnation, request)
             VALUES ('ckpt-a', 'forged', '{role_a}',
                     (SELECT incarnation FROM sandbox_desired WHERE id = 'ckpt-a'), 9000001)"
        ),
        "UPDATE sandbox_resets SET state = 'done'".to_owned(),
        "UPDATE sandbox_checkpoints SET state = 'ready'".to_owned(),
        "SELECT nextval('sandbox_checkpoint_requests')".to_owned(),
        "SELECT setval('sandbox_checkpoint_requests', 9000000)".to_owned(),
    ] {
        let (code, message) = common::refusal(&a, &sql, &[]).await;
        assert_eq!(code, "42501", "{sql}: {message}");
    }

    // Through the verbs: another tenant's sandbox is not there for B.
    for sql in [
        "SELECT sandbox_reset('ckpt-a')",
        "SELECT sandbox_checkpoint('ckpt-a', 'mine')",
    ] {
        let (code, message) = common::refusal(&b, sql, &[]).await;
        assert_eq!(code, "P0002", "{sql}: {message}");
        assert!(message.contains("that this role may see"), "{message}");
    }

    // At most 8 pending per sandbox: 7 resets and a checkpoint.
    for _ in 0..7 {
        sqlx::query("SELECT sandbox_reset('ckpt-a')")
            .execute(&a)
            .await
            .unwrap();
    }
    sqlx::query("SELECT sandbox_checkpoint('ckpt-a', 'one')")
        .execute(&a)
        .await
        .unwrap();
    // Asking again for a pending checkpoint replaces it: allowed.
    sqlx::query("SELECT sandbox_checkpoint('ckpt-a', 'one')")
        .execute(&a)
        .await
        .expect("a pending checkpoint asked again replaces its request");
    for sql in [
        "SELECT sandbox_reset('ckpt-a')",
        "SELECT sandbox_checkpoint('ckpt-a', 'two')",
    ] {
        let (code, message) = common::refusal(&a, sql, &[]).await;
        assert_eq!(code, "54000", "{sql}: {message}");
        assert!(
            message.contains("8 checkpoint and reset requests pending")
                && message.contains("wait until sandboxd has performed them"),
            "{message}"
        );
    }
    let pending: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM sandbox_resets WHERE state = 'requested')
              + (SELECT count(*) FROM sandbox_checkpoints WHERE state = 'requested')",
    )
    .fetch_one(&a)
    .await
    .unwrap();
    assert_eq!(pending, 8, "A reads its own requests");
    // The owner may raise the bound.
    sqlx::query("UPDATE sandbox_checkpoint_settings SET max_pending_per_sandbox = 9")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("SELECT sandbox_reset('ckpt-a')")
        .execute(&a)
        .await
        .expect("a ninth under a raised bound");
}

/// Tenant A asked the row-level security helpers about tenant B, naming
/// B's role, and learned that B owns a sandbox and that it runs (issue 50,
/// finding 4). Now no function a tenant may call takes a role: the
/// predicates judge the calling role, and answer A for A alone.
#[tokio::test]
async fn a_tenant_cannot_ask_the_row_level_security_helpers_about_another_tenants_sandbox() {
    let env = TestEnv::new().await;
    let [(role_a, a), (role_b, b)] = tenants(&env).await;
    let term = hold_lease(&env.pool).await;
    for (pool, id) in [(&a, "rls-a"), (&b, "rls-b")] {
        sqlx::query("SELECT sandbox_request($1, NULL, '{redis}')")
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
        common::ready_status(&env.pool, id, term).await;
    }

    // What A asked: may B see the status of rls-b, may B access B's rows.
    for sql in [
        format!("SELECT sandbox_orchestrator_may_see_status('rls-b', '{role_b}')"),
        format!("SELECT sandbox_orchestrator_may_access('{role_b}', '{role_b}')"),
    ] {
        match sqlx::query_scalar::<_, bool>(&sql).fetch_one(&a).await {
            Ok(answer) => panic!("A asked {sql} and was told {answer}"),
            Err(e) => {
                let code = e.as_database_error().and_then(|d| d.code());
                // Not there (42883), or not A's to call (42501).
                assert!(
                    matches!(code.as_deref(), Some("42883" | "42501")),
                    "{sql}: {e}"
                );
            }
        }
    }

    // No function A may execute takes a role name.
    let with_a_role: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p
          WHERE p.pronamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'sandbox_desired'::regclass)
            AND has_function_privilege($1::name, p.oid, 'EXECUTE')
            AND EXISTS (SELECT 1 FROM unnest(p.proargtypes::oid[]) t
                         WHERE t IN ('name'::regtype, 'regrole'::regtype, 'oid'::regtype))",
    )
    .bind(&role_a)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(with_a_role.is_empty(), "{with_a_role:?}");

    // What A may call answers for A: its own rows yes, B's no.
    for (pool, owner, id, yes) in [
        (&a, &role_a, "rls-a", true),
        (&a, &role_b, "rls-b", false),
        (&b, &role_b, "rls-b", true),
        (&b, &role_a, "rls-a", false),
    ] {
        let (access, status): (bool, bool) = sqlx::query_as(
            "SELECT sandbox_caller_may_access($1), sandbox_caller_may_see_status($2)",
        )
        .bind(owner)
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!((access, status), (yes, yes), "{owner} {id}");
    }
}

/// The next item of `stream` within `within`, or `None` when none came.
async fn next_within(
    stream: &mut sandboxd::ports::store::NotifyStream,
    within: Duration,
) -> Option<String> {
    tokio::time::timeout(within, stream.next())
        .await
        .ok()
        .map(|item| item.expect("the stream goes on").expect("no error"))
}

#[tokio::test]
async fn notifications_name_rows_by_incarnation_the_controller_finds_the_id_and_a_forged_relist_is_ignored(
) {
    let env = TestEnv::new().await;
    let [(_, a), (_, b)] = tenants(&env).await;
    let store =
        sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let mut controller = store.watch_desired().await.unwrap();
    // A listens on every channel it can.
    let mut listener = PgListener::connect_with(&a).await.unwrap();
    listener
        .listen_all(["sandbox_desired", "sandbox_status", "sandbox_events"])
        .await
        .unwrap();
    let quiet = Duration::from_millis(700);
    let loud = Duration::from_secs(5);

    // B's sandbox, asked for, checkpointed and released.
    let id = SandboxId::parse("b-private-project-name").unwrap();
    let incarnation: String = {
        let mut tx = b.begin().await.unwrap();
        sqlx::query("SELECT sandbox_request($1, NULL, '{redis}')")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .unwrap();
        let row = sqlx::query("SELECT incarnation::text AS i FROM sandbox_desired WHERE id = $1")
            .bind(id.as_str())
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        row.get("i")
    };
    assert_eq!(
        next_within(&mut controller, loud).await.as_deref(),
        Some(id.as_str()),
        "the controller reconciles the row at once"
    );
    sqlx::query("SELECT sandbox_checkpoint($1, 'c')")
        .bind(id.as_str())
        .execute(&b)
        .await
        .unwrap();
    assert_eq!(
        next_within(&mut controller, loud).await.as_deref(),
        Some(id.as_str())
    );
    assert!(sqlx::query_scalar::<_, bool>("SELECT sandbox_release($1)")
        .bind(id.as_str())
        .fetch_one(&b)
        .await
        .unwrap());
    assert_eq!(
        next_within(&mut controller, loud).await.as_deref(),
        Some(id.as_str()),
        "a deleted row is found by its tombstone"
    );

    // What A heard: B's incarnation, never B's id.
    let mut heard = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(quiet, listener.recv()).await {
        heard.push((n.channel().to_owned(), n.payload().to_owned()));
    }
    assert_eq!(
        heard,
        [
            ("sandbox_desired".to_owned(), incarnation.clone()),
            ("sandbox_desired".to_owned(), incarnation.clone()),
            ("sandbox_desired".to_owned(), incarnation.clone()),
        ],
        "insert, checkpoint, delete"
    );

    // Anything A makes up asks nothing of the controller.
    for forged in [
        NOTIFY_EVERY_ROW,
        id.as_str(),
        "0a0b0c0d-0000-4000-8000-000000000001",
        "not anything",
    ] {
        sqlx::query("SELECT pg_notify('sandbox_desired', $1)")
            .bind(forged)
            .execute(&a)
            .await
            .unwrap();
        assert_eq!(
            next_within(&mut controller, quiet).await,
            None,
            "A's NOTIFY {forged:?}"
        );
    }
    // The owner's relist request is heard.
    sqlx::query("SELECT * FROM sandbox_resume_reaping()")
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        next_within(&mut controller, loud).await.as_deref(),
        Some(NOTIFY_EVERY_ROW)
    );
}
