//! Every wait has an end: a lock held on the state database times the
//! controller's statements out on the server, and progress resumes once
//! the lock is gone (real Docker, real Postgres).

mod common;

use common::{request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::Phase;
use std::time::Duration;

#[tokio::test]
async fn a_lock_held_on_sandbox_status_times_statements_out_on_the_server_and_progress_resumes_after(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.store_timeout = Duration::from_secs(2);
    let controller = env.start_bounded(config).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("locked");

    // Someone holds an exclusive lock on the status table.
    let mut lock = env.admin_pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE sandbox_status IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let revision = client.apply(&id, &request(&["redis"], &[])).await.unwrap();

    // The controller keeps trying, but none of its sessions waits on the
    // lock for longer than its lock timeout (1 s): the server cancels them.
    let mut waited = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(750)).await;
        let stuck: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE usename = 'sandboxd' AND wait_event_type = 'Lock'
               AND now() - query_start > interval '1.8 seconds'",
        )
        .fetch_one(&env.admin_pool)
        .await
        .unwrap();
        assert_eq!(stuck, 0, "a session waited on the lock past its timeout");
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE usename = 'sandboxd' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&env.admin_pool)
        .await
        .unwrap();
        waited += waiting;
    }
    assert!(waited > 0, "the controller never even reached the lock");
    lock.rollback().await.unwrap();

    // Progress resumes: the sandbox becomes ready.
    let status = client
        .wait_ready(&id, &revision, Duration::from_secs(60))
        .await
        .expect("ready once the lock is gone");
    assert_eq!(status.phase, Phase::Ready);
    controller.stop().await;
}
