//! One leader: the lease and its fence.

use super::*;

/// Provisions of the fake engine so far, by every controller of the harness.
fn provisions(h: &Harness) -> f64 {
    h.metric("sandboxd_provisions_total{engine=\"fakedb\",reason=\"create\",result=\"success\"}")
}

#[tokio::test(start_paused = true)]
async fn two_controllers_on_one_state_database_provision_each_sandbox_once() {
    let h = Harness::new();
    let (stop_a, task_a) = start(h.controller());
    let (stop_b, task_b) = start(h.controller());
    let fleet = names("s", 3);
    all_ready(&h, &fleet).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(provisions(&h), 3.0, "each sandbox provisioned exactly once");
    assert_eq!(h.metric("sandboxd_leader_acquisitions_total"), 1.0);
    for name in &fleet {
        h.published(&id(name));
    }
    drop((stop_a, stop_b));
    let _ = tokio::join!(task_a, task_b);
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_lease_was_taken_changes_nothing_and_stands_by() {
    let h = Harness::new();
    let (stop, task) = start(h.controller());
    h.store.put_desired(row("a"));
    until("a ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;

    // Another process takes the lease (as if this one had been paused past it).
    h.store.steal_lease("elsewhere", Duration::from_secs(3600));
    h.store.put_desired(row("b"));
    let (killed, _) = h.published(&id("a"));
    h.runtime.kill(&killed, false);
    tokio::time::sleep(Duration::from_secs(30)).await;

    assert!(h.containers(&id("b")).is_empty(), "no container for b");
    assert!(h.store.status_of(&id("b")).is_none(), "no status for b");
    let a: Vec<ContainerId> = h.containers(&id("a")).into_iter().map(|c| c.0).collect();
    assert_eq!(
        a,
        vec![killed],
        "a deposed leader does not heal a's killed container"
    );
    assert_eq!(
        h.store.phase_of(&id("a")),
        Some(Phase::Ready),
        "nor write its status"
    );
    assert_eq!(h.metric("sandboxd_leader"), 0.0);
    assert_eq!(h.metric("sandboxd_leader_losses_total"), 1.0);

    // Once the other holder's lease lapses, this process leads again and
    // catches up.
    let (holder, term) = h.store.lease_of().unwrap();
    assert_eq!(holder, "elsewhere");
    h.store.release_lease(&holder, term).await.unwrap();
    until("b ready under the next term", || {
        h.store.phase_of(&id("b")) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(h.metric("sandboxd_leader"), 1.0);
    assert_eq!(h.metric("sandboxd_leader_term"), 3.0);
    drop(stop);
    let _ = task.await;
}
