//! The controller: queue, watches and relists around reconcile.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_reconnected_event_stream_cuts_every_backoff_short() {
    let h = Harness::new();
    h.runtime.faults.set(RuntimeOp::Create, Fault::FailAlways);
    h.store.put_desired(row("a"));
    let (stop, task) = start(h.controller());
    // Failures at 0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5 and 63.5 s: the next
    // retry would come 128 s after that.
    tokio::time::sleep(Duration::from_secs(70)).await;
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Failed));
    h.runtime.faults.clear(RuntimeOp::Create);

    // Docker comes back: its event stream reconnects.
    h.runtime.cut_events();
    let cut = tokio::time::Instant::now();
    until("a is ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;
    assert!(
        cut.elapsed() < Duration::from_secs(10),
        "ready {:?} after the reconnect, not after its backoff",
        cut.elapsed()
    );
    drop(stop);
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn initial_lists_that_fail_are_retried_and_the_controller_is_not_ready_meanwhile() {
    let h = Harness::new();
    h.store.faults.set(StoreOp::ListIds, Fault::FailAlways);
    h.store.put_desired(row("a"));
    let controller = h.controller();
    let readiness = controller.readiness();
    let (stop, task) = start(controller);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        !task.is_finished(),
        "a failing initial list must not end the controller"
    );
    assert!(!readiness.is_ready());
    assert!(
        h.containers(&id("a")).is_empty(),
        "nothing done before the lists load"
    );

    h.store.faults.clear(StoreOp::ListIds);
    until("ready once the lists load", || readiness.is_ready()).await;
    until("a is ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;
    drop(stop);
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_keys_panicking_reconcile_is_retried_while_the_queue_serves_other_keys() {
    let h = Harness::new();
    h.runtime.panic_when_listing(&id("bad"));
    let (stop, task) = start(h.controller());
    h.store.put_desired(row("bad"));
    h.store.put_desired(row("good"));
    until("good is ready", || {
        h.store.phase_of(&id("good")) == Some(Phase::Ready)
    })
    .await;
    until("bad panicked and was retried", || {
        h.metric("controller_runtime_reconcile_panics_total{controller=\"sandbox\"}") >= 2.0
    })
    .await;
    assert!(h.store.status_of(&id("bad")).is_none());
    // Later rows are still served.
    h.store.put_desired(row("later"));
    until("later is ready", || {
        h.store.phase_of(&id("later")) == Some(Phase::Ready)
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_create_stuck_for_one_sandbox_costs_it_a_failed_status_while_others_become_ready() {
    let h = Harness::new();
    h.runtime.hang_when_creating(&id("stuck"));
    let (stop, task) = start(h.controller());
    h.store.put_desired(row("stuck"));
    h.store.put_desired(row("fine"));
    until("fine is ready", || {
        h.store.phase_of(&id("fine")) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(
        h.store.phase_of(&id("stuck")),
        Some(Phase::Provisioning),
        "still inside its deadline"
    );
    until("stuck failed with the reason", || {
        h.store.status_of(&id("stuck")).is_some_and(|s| {
            s.phase == Phase::Failed && s.message.contains("did not answer within 30s")
        })
    })
    .await;
    // Its worker was freed: a later row is served while it keeps retrying.
    h.store.put_desired(row("later"));
    until("later is ready", || {
        h.store.phase_of(&id("later")) == Some(Phase::Ready)
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_stuck_past_its_deadline_is_abandoned_counted_and_retried_while_its_slot_serves_others(
) {
    let mut h = Harness::new();
    h.config.concurrency = 1;
    // One Docker call may take long (a slow daemon), but no reconcile may
    // take longer than its own deadline.
    h.config.docker_timeout = Duration::from_secs(600);
    h.config.reconcile_timeout = Duration::from_secs(20);
    h.runtime.hang_when_creating(&id("stuck"));
    let (stop, task) = start(h.controller());
    h.store.put_desired(row("stuck"));
    until("stuck is provisioning", || {
        h.store.phase_of(&id("stuck")) == Some(Phase::Provisioning)
    })
    .await;
    let started = tokio::time::Instant::now();
    h.store.put_desired(row("fine"));
    until("fine is ready", || {
        h.store.phase_of(&id("fine")) == Some(Phase::Ready)
    })
    .await;
    assert!(
        started.elapsed() <= h.config.reconcile_timeout,
        "the only worker was freed at the reconcile deadline, not the Docker one ({:?})",
        started.elapsed()
    );
    assert_eq!(h.metric("sandboxd_reconcile_timeouts_total"), 1.0);
    assert!(h.metric("workqueue_retries_total{name=\"sandbox\"}") >= 1.0);
    assert!(h.containers(&id("stuck")).is_empty());
    // Retried with backoff, abandoned again each time, and the queue keeps
    // serving the others between its tries.
    until("stuck was retried", || {
        h.metric("sandboxd_reconcile_timeouts_total") >= 2.0
    })
    .await;
    h.store.put_desired(row("later"));
    until("later is ready", || {
        h.store.phase_of(&id("later")) == Some(Phase::Ready)
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_docker_list_that_fails_for_a_while_is_retried_with_backoff_until_ready() {
    let h = Harness::new();
    let (stop, task) = start(h.controller());
    until("initial relist", || {
        h.metric("sandboxd_relists_total") >= 1.0
    })
    .await;
    h.runtime.faults.set(RuntimeOp::List, Fault::Fail(3));
    h.store.put_desired(row("a"));
    until("a is ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;
    assert!(h.metric("workqueue_retries_total{name=\"sandbox\"}") >= 3.0);
    assert!(h.metric("controller_runtime_reconcile_errors_total{controller=\"sandbox\"}") >= 3.0);
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_container_killed_behind_the_controllers_back_is_healed_from_the_event_stream() {
    let h = Harness::new();
    let (stop, task) = start(h.controller());
    h.store.put_desired(row("a"));
    until("a is ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;
    let (first, before) = h.published(&id("a"));
    h.runtime.kill(&first, false);
    until("a is healed", || {
        let c = h.containers(&id("a"));
        c.len() == 1 && c[0].0 != first
    })
    .await;
    until("the heal is published", || {
        h.store
            .status_of(&id("a"))
            .is_some_and(|s| s.services[ENGINE.as_str()].instance == h.containers(&id("a"))[0].1)
    })
    .await;
    let (_, after) = h.published(&id("a"));
    assert_eq!(after.password, before.password);
    stop.send(()).unwrap();
    task.await.unwrap();
}
