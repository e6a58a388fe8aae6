//! Admission: quotas and the host's memory budget.

use super::*;

fn quota(sandboxes: Option<u64>, memory_bytes: Option<u64>) -> crate::domain::admission::Quota {
    crate::domain::admission::Quota {
        sandboxes,
        memory_bytes,
    }
}

/// `name`, inserted `second` seconds after [`created`] (arrival order).
fn arriving(name: &str, second: i64) -> DesiredSandbox {
    DesiredSandbox {
        created_at: created() + chrono::Duration::seconds(second),
        ..row(name)
    }
}

#[tokio::test]
async fn a_third_row_over_the_owner_limit_stays_pending_with_the_limit_and_creates_nothing() {
    let h = Harness::new();
    h.store.set_quota("*", quota(Some(2), None));
    let ctx = h.context();
    for (n, name) in ["a", "b", "c"].into_iter().enumerate() {
        h.store.put_desired(arriving(name, n as i64));
        reconcile(&ctx, &id(name)).await.unwrap();
    }
    h.published(&id("a"));
    h.published(&id("b"));
    let c = h.store.status_of(&id("c")).expect("a status");
    assert_eq!(c.phase, Phase::Pending);
    assert_eq!(
        c.message,
        "waiting for quota: owner 'test' has 2 of 2 sandboxes and 1 GiB of unlimited memory (limit sandboxes=2); admitted when one of its sandboxes is released"
    );
    assert_eq!(
        c.observed_generation, 0,
        "its generation is not observed yet"
    );
    assert!(h.containers(&id("c")).is_empty(), "nothing created");
    assert_eq!(h.metric("sandboxd_admission_waiting"), 1.0);
    assert_eq!(
        h.metric("sandboxd_quota_used{owner=\"test\",resource=\"sandboxes\"}"),
        2.0
    );
    assert_eq!(
        h.metric("sandboxd_quota_limit{owner=\"test\",resource=\"sandboxes\"}"),
        2.0
    );
    let events = h.store.events_of(&id("c"));
    assert!(
        events.iter().any(|(e, _)| e.reason.as_str() == "waiting"),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pending_row_becomes_ready_within_one_reconcile_of_releasing_another() {
    let mut h = Harness::new();
    // No periodic relist could be what admits it.
    h.config.relist_interval = Duration::from_secs(3600);
    h.store.set_quota("test", quota(Some(2), None));
    let (stop, task) = start(h.controller());
    for (n, name) in ["a", "b", "c"].into_iter().enumerate() {
        h.store.put_desired(arriving(name, n as i64));
    }
    until("c waits for the quota", || {
        h.store
            .status_of(&id("c"))
            .is_some_and(|s| s.phase == Phase::Pending && s.message.contains("2 of 2 sandboxes"))
    })
    .await;
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Ready));
    assert_eq!(h.store.phase_of(&id("b")), Some(Phase::Ready));
    let reconciles =
        h.metric("controller_runtime_reconcile_total{controller=\"sandbox\",result=\"success\"}");
    // Released: its containers wait out the grace window, but they no
    // longer count against the owner.
    h.store.delete_desired(&id("a"));
    for _ in 0..20 {
        if h.store.phase_of(&id("c")) == Some(Phase::Ready) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        h.store.phase_of(&id("c")),
        Some(Phase::Ready),
        "{:?}",
        h.store.status_of(&id("c"))
    );
    let after =
        h.metric("controller_runtime_reconcile_total{controller=\"sandbox\",result=\"success\"}");
    assert!(
        after - reconciles <= 3.0,
        "a's reconcile, then c's: {reconciles} -> {after}"
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn the_host_memory_budget_refuses_what_would_overcommit_it() {
    let mut h = Harness::new();
    // One and a half engines' worth.
    h.config.memory_budget = Some(768 << 20);
    let ctx = h.context();
    h.store.put_desired(arriving("a", 0));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
    h.store.put_desired(arriving("b", 1));
    reconcile(&ctx, &id("b")).await.unwrap();
    let b = h.store.status_of(&id("b")).unwrap();
    assert_eq!(b.phase, Phase::Pending);
    assert_eq!(
        b.message,
        "waiting for the host's memory budget: 512 MiB of 768 MiB in use, this sandbox needs 512 MiB; admitted when memory is released"
    );
    assert!(h.containers(&id("b")).is_empty());
    assert_eq!(
        h.metric("sandboxd_memory_budget_bytes"),
        (768u64 << 20) as f64
    );
    assert_eq!(
        h.metric("sandboxd_memory_admitted_bytes"),
        (512u64 << 20) as f64
    );
}

#[tokio::test]
async fn the_budget_is_the_hosts_memory_minus_the_reserve() {
    let h = Harness::new();
    // 3 GiB minus the default 2 GiB reserve: two engines fit.
    h.runtime.set_host_memory(Some(3 << 30));
    let ctx = h.context();
    for (n, name) in ["a", "b", "c"].into_iter().enumerate() {
        h.store.put_desired(arriving(name, n as i64));
        reconcile(&ctx, &id(name)).await.unwrap();
    }
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Ready));
    assert_eq!(h.store.phase_of(&id("b")), Some(Phase::Ready));
    let c = h.store.status_of(&id("c")).unwrap();
    assert!(c.message.contains("1 GiB of 1 GiB in use"), "{}", c.message);
    assert_eq!(
        h.metric("sandboxd_memory_budget_bytes"),
        (1u64 << 30) as f64
    );
}

#[tokio::test]
async fn a_heal_is_never_held_back_by_a_quota_lowered_under_what_runs() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(arriving("a", 0));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (before, _) = h.published(&id("a"));
    h.store.set_quota("*", quota(Some(0), Some(0)));
    h.runtime.kill(&before, false);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (after, _) = h.published(&id("a"));
    assert_ne!(before, after, "healed");
}

#[tokio::test]
async fn a_failing_quota_read_fails_the_reconcile_and_creates_nothing() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.faults.set(StoreOp::Quota, Fault::Fail(1));
    h.store.put_desired(arriving("a", 0));
    assert!(reconcile(&ctx, &id("a")).await.is_err());
    assert!(h.containers(&id("a")).is_empty());
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
}

#[tokio::test]
async fn a_row_admitted_while_its_image_is_fetched_keeps_its_place_ahead_of_later_rows() {
    let mut h = Harness::new();
    // One engine's worth.
    h.config.memory_budget = Some(512 << 20);
    let ctx = h.context();
    h.runtime.remove_image("fakedb:1");
    h.runtime
        .publish_image("fakedb:1", Duration::from_millis(50));
    h.store.put_desired(arriving("a", 0));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Provisioning));
    // The later row does not take the room while a's image is fetched.
    h.store.put_desired(arriving("b", 1));
    reconcile(&ctx, &id("b")).await.unwrap();
    let b = h.store.status_of(&id("b")).unwrap();
    assert_eq!(b.phase, Phase::Pending);
    assert!(
        b.message.contains("512 MiB of 512 MiB in use"),
        "{}",
        b.message
    );
    until("the image is fetched", || {
        h.runtime.pulls_of("fakedb:1") >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_counts_what_runs_from_its_first_relist_before_it_admits_anything() {
    let h = Harness::new();
    h.store.set_quota("*", quota(Some(2), None));
    {
        let ctx = h.context();
        for (n, name) in ["a", "b"].into_iter().enumerate() {
            h.store.put_desired(arriving(name, n as i64));
            reconcile(&ctx, &id(name)).await.unwrap();
            h.published(&id(name));
        }
    }
    h.step_down().await;
    // A controller that never saw a or b admitted.
    h.store.put_desired(arriving("c", 2));
    let (stop, task) = start(h.controller());
    until("c waits for the quota", || {
        h.store
            .status_of(&id("c"))
            .is_some_and(|s| s.phase == Phase::Pending && s.message.contains("2 of 2 sandboxes"))
    })
    .await;
    assert!(h.containers(&id("c")).is_empty());
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A sandbox released and requested again (a new incarnation of its id)
/// while its old container waits out the grace window is a new sandbox:
/// that container is on its way out and held no quota since the release,
/// so a new leader, whose first relist finds it beside the new row,
/// admits the row like any other, not on its strength. (The simulation
/// found it: the `quota` invariant, seed 24.)
#[tokio::test(start_paused = true)]
async fn a_sandbox_requested_again_within_its_grace_window_waits_for_the_quota_like_any_new_row() {
    let h = Harness::new();
    h.store.set_quota("*", quota(Some(1), None));
    {
        let ctx = h.context();
        h.store.put_desired(arriving("a", 0));
        reconcile(&ctx, &id("a")).await.unwrap();
        h.published(&id("a"));
        // Released: its container waits out the grace window and no
        // longer counts against the owner, so b is admitted.
        h.store.delete_desired(&id("a"));
        reconcile(&ctx, &id("a")).await.unwrap();
        h.store.put_desired(arriving("b", 1));
        reconcile(&ctx, &id("b")).await.unwrap();
        h.published(&id("b"));
    }
    assert_eq!(h.containers(&id("a")).len(), 1, "a's old container stays");
    h.step_down().await;
    // Requested again (a new incarnation) while the owner holds b.
    h.store.put_desired(arriving("a", 2));
    let (stop, task) = start(h.controller());
    until("a is judged", || {
        h.store.status_of(&id("a")).is_some_and(|s| {
            s.incarnation.is_some() && matches!(s.phase, Phase::Pending | Phase::Ready)
        })
    })
    .await;
    let a = h.store.status_of(&id("a")).expect("a status");
    assert_eq!(a.phase, Phase::Pending, "{a:?}");
    assert!(
        a.message
            .starts_with("waiting for quota: owner 'test' has 1 of 1 sandboxes"),
        "{}",
        a.message
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A row restored from an older copy while its status still says
/// `terminating` (written when the row went) is wanted again: a new
/// leader's first relist counts it against its owner before anything is
/// admitted, not only once its own reconcile has run. (The simulation
/// found it: seed 4742.)
#[tokio::test(start_paused = true)]
async fn a_new_leader_counts_a_restored_row_whose_status_still_says_terminating() {
    let h = Harness::new();
    h.store.set_quota("*", quota(Some(1), None));
    {
        let ctx = h.context();
        h.store.put_desired(arriving("zed", 0));
        reconcile(&ctx, &id("zed")).await.unwrap();
        h.published(&id("zed"));
        let copy = h.store.desired_rows();
        h.store.delete_desired(&id("zed"));
        reconcile(&ctx, &id("zed")).await.unwrap();
        assert_eq!(h.store.phase_of(&id("zed")), Some(Phase::Terminating));
        h.store.restore_desired(copy);
    }
    h.step_down().await;
    h.store.put_desired(arriving("ann", 1));
    let (stop, task) = start(h.controller());
    until("ann is judged", || {
        h.store
            .phase_of(&id("ann"))
            .is_some_and(|p| matches!(p, Phase::Pending | Phase::Ready))
    })
    .await;
    let ann = h.store.status_of(&id("ann")).expect("a status");
    assert_eq!(ann.phase, Phase::Pending, "{ann:?}");
    assert!(h.containers(&id("ann")).is_empty(), "nothing created");
    stop.send(()).unwrap();
    task.await.unwrap();
}
