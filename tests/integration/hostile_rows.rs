//! Rows that got past the database's checks (a superuser with triggers
//! disabled) never fail or panic the controller's reads: the sandbox ends
//! `failed` with the reason, and its containers are kept untouched.

use crate::common;

use common::{eventually, request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(60);

/// Writes `sql` as the superuser with triggers disabled, then wakes the
/// controller for `id` (NOTIFY is a trigger too, so it did not fire).
async fn force(env: &TestEnv, id: &SandboxId, sql: &str) {
    let mut conn = env.admin_pool.acquire().await.unwrap();
    sqlx::query("SET session_replication_role = replica")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(sql)
        .bind(id.as_str())
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("force {sql}: {e}"));
    sqlx::query("RESET session_replication_role")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT pg_notify('sandbox_desired', $1)")
        .bind(id.as_str())
        .execute(&mut *conn)
        .await
        .unwrap();
}

async fn failed(client: &Client, id: &SandboxId) -> SandboxStatus {
    eventually(&format!("{id} failed"), WITHIN, || async {
        client
            .status(id)
            .await
            .unwrap()
            .filter(|s| s.phase == Phase::Failed)
    })
    .await
}

#[tokio::test]
async fn a_row_forced_past_the_checks_ends_failed_with_the_reason_and_nothing_panics() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());

    // A ready sandbox whose row is then forced into a shape no check allows.
    let kept = sandbox_id("kept");
    let ready = client
        .provision(&kept, &request(&["redis"], &[]), Duration::from_secs(90))
        .await
        .expect("the sandbox becomes ready");
    let before: Vec<String> = env
        .containers(Some(&kept))
        .await
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(before.len(), 1);

    let nested = sandbox_id("nested");
    let infinite = sandbox_id("infinite");
    let minus_infinite = sandbox_id("minus-inf");
    let junk = sandbox_id("junk");
    let huge = sandbox_id("huge");
    force(
        &env,
        &kept,
        "UPDATE sandbox_desired SET services = '{{redis}}', generation = 2 WHERE id = $1",
    )
    .await;
    force(
        &env,
        &nested,
        "INSERT INTO sandbox_desired (id, services) VALUES ($1, '{{redis}}')",
    )
    .await;
    force(
        &env,
        &infinite,
        "INSERT INTO sandbox_desired (id, services, expires_at) VALUES ($1, '{redis}', 'infinity')",
    )
    .await;
    force(
        &env,
        &minus_infinite,
        "INSERT INTO sandbox_desired (id, services, expires_at) VALUES ($1, '{redis}', '-infinity')",
    )
    .await;
    force(
        &env,
        &junk,
        r#"INSERT INTO sandbox_desired (id, owner, services, features, attach, updated_at)
           VALUES ($1, E'\x1b[31mred', '[0:1]={redis,NULL}', '[1]', '{{a}}', 'infinity')"#,
    )
    .await;
    force(
        &env,
        &huge,
        "INSERT INTO sandbox_desired (id, services, features)
         SELECT $1, '{redis}', jsonb_build_object('redis', jsonb_agg(to_jsonb('search'::text)))
         FROM generate_series(1, 2000000)",
    )
    .await;

    let cases: [(&SandboxId, &[&str]); 6] = [
        (
            &kept,
            &["services is not a one-dimensional list starting at index 1"],
        ),
        (
            &nested,
            &["services is not a one-dimensional list starting at index 1"],
        ),
        (&infinite, &["expires_at is not a finite time"]),
        (&minus_infinite, &["expires_at is not a finite time"]),
        (
            &junk,
            &[
                "owner must be text of at most 200 characters without control characters",
                "services is not a one-dimensional list",
                "features is not a JSON object",
                "attach is not a one-dimensional list",
                "updated_at is not a finite time",
            ],
        ),
        (&huge, &["features"]),
    ];
    for (id, fragments) in cases {
        let status = failed(&client, id).await;
        assert!(
            status.message.contains("the desired row is invalid"),
            "{id}: {}",
            status.message
        );
        for fragment in fragments {
            assert!(
                status.message.contains(fragment),
                "{id}: {:?} lacks {fragment:?}",
                status.message
            );
        }
        assert!(
            !status.message.contains('\u{1b}'),
            "{id}: {:?}",
            status.message
        );
        if id != &kept {
            assert!(
                env.containers(Some(id)).await.is_empty(),
                "{id}: nothing is created for an invalid row"
            );
        }
    }

    // The ready sandbox's container is kept as it was, credentials too.
    let after: Vec<String> = env
        .containers(Some(&kept))
        .await
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(after, before);
    let status = client.status(&kept).await.unwrap().unwrap();
    assert_eq!(status.services, ready.services);

    let metrics = controller.metrics.render();
    assert!(
        metrics.contains(r#"controller_runtime_reconcile_panics_total{controller="sandbox"} 0"#),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("panics"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Fixing the row makes it ready again with the same container and
    // credentials.
    sqlx::query("UPDATE sandbox_desired SET services = '{redis}' WHERE id = $1")
        .bind(kept.as_str())
        .execute(&env.pool)
        .await
        .unwrap();
    let fixed = eventually("the fixed row is ready again", WITHIN, || async {
        client
            .status(&kept)
            .await
            .unwrap()
            .filter(|s| s.phase == Phase::Ready && s.observed_generation == 3)
    })
    .await;
    assert_eq!(fixed.services, ready.services);
    let after: Vec<String> = env
        .containers(Some(&kept))
        .await
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(after, before);
    controller.stop().await;
}
