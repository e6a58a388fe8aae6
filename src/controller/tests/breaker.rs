//! The reaping circuit breaker.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_truncated_desired_table_pauses_reaping_until_an_operator_resumes_it() {
    let mut h = Harness::new();
    h.config.grace = Duration::ZERO;
    let controller = h.controller();
    let probes = controller.probes();
    let (stop, task) = start(controller);
    let names = names("s", 6);
    all_ready(&h, &names).await;

    h.store.truncate_desired();
    tokio::time::sleep(Duration::from_secs(120)).await;
    for n in &names {
        assert_eq!(h.containers(&id(n)).len(), 1, "{n} is kept while paused");
    }
    assert!(h.store.reaping_paused(), "the pause is recorded");
    assert_eq!(h.metric("sandboxd_reaping_paused"), 1.0);
    assert_eq!(h.metric("sandboxd_sandboxes_row_missing"), 6.0);
    let why = probes.ready().await.unwrap_err();
    assert!(why.contains("reaping paused: 6 of 6 sandboxes"), "{why}");
    assert!(why.contains("sandboxd resume-reaping"), "{why}");

    h.store.resume_reaping();
    until("all six reaped after the resume", || {
        names.iter().all(|n| h.containers(&id(n)).is_empty())
    })
    .await;
    assert_eq!(h.metric("sandboxd_reaping_paused"), 0.0);
    assert!(probes.ready().await.is_ok());
    drop(stop);
    let _ = task.await;
}

#[tokio::test(start_paused = true)]
async fn deleting_one_row_among_many_reaps_it_without_pausing() {
    let mut h = Harness::new();
    h.config.grace = Duration::ZERO;
    let (stop, task) = start(h.controller());
    all_ready(&h, &["a".into(), "b".into(), "c".into()]).await;
    h.store.delete_desired(&id("a"));
    until("a reaped", || h.containers(&id("a")).is_empty()).await;
    assert_eq!(h.containers(&id("b")).len(), 1);
    assert!(!h.store.reaping_paused());
    drop(stop);
    let _ = task.await;
}

#[tokio::test(start_paused = true)]
async fn releasing_every_sandbox_row_by_row_reaps_them_all_without_pausing() {
    let mut h = Harness::new();
    h.config.grace = Duration::ZERO;
    let (stop, task) = start(h.controller());
    let names = names("r", 6);
    all_ready(&h, &names).await;
    // DELETE, one row at a time: each leaves a tombstone.
    for n in &names {
        h.store.delete_desired(&id(n));
    }
    until("all six reaped", || {
        names.iter().all(|n| h.containers(&id(n)).is_empty())
    })
    .await;
    assert!(!h.store.reaping_paused());
    assert_eq!(h.metric("sandboxd_reaping_paused"), 0.0);
    drop(stop);
    let _ = task.await;
}
