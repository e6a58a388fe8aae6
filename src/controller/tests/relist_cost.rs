//! Cost per relist and per converged row.

use super::*;

/// One relist that enqueues as hints and counts no drift.
async fn relist_once(
    ctx: &Arc<Context>,
    queue: &WorkQueue<SandboxId>,
    known: &KnownContainers,
    scope: relist::Scope,
) {
    relist::relist(ctx, queue, known, false, relist::Enqueue::Hint, scope)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_relist_of_a_thousand_converged_sandboxes_lists_docker_once_and_reconciles_none_and_a_full_resync_makes_four_calls_each(
) {
    let h = Harness::new();
    let ctx = h.context();
    let ids: Vec<SandboxId> = (0..1000).map(|i| id(&format!("s{i:04}"))).collect();
    for sandbox in &ids {
        h.store.put_desired(row(sandbox.as_str()));
        reconcile(&ctx, sandbox).await.unwrap();
    }
    assert_eq!(h.metric("sandboxd_sandboxes{phase=\"ready\"}"), 1000.0);

    let calls = h.runtime.faults.all_calls();
    let full_lists = h.runtime.full_lists();
    let queue = WorkQueue::new(QueueConfig::default(), h.metrics.clone());
    let known = KnownContainers::default();
    relist_once(&ctx, &queue, &known, relist::Scope::Unconverged).await;
    assert_eq!(h.runtime.full_lists(), full_lists + 1, "one full list");
    let after = h.runtime.faults.all_calls();
    let made = |op: RuntimeOp| after.get(&op).unwrap_or(&0) - calls.get(&op).unwrap_or(&0);
    assert_eq!(made(RuntimeOp::List), 1, "one list, no per-sandbox list");
    assert_eq!(made(RuntimeOp::Inspect), 0);
    // The deployment's networks (volumes are listed without a fault hook).
    assert_eq!(made(RuntimeOp::Network), 1);
    assert_eq!(queue.len(), 0, "every sandbox is converged: none enqueued");
    assert_eq!(h.metric("sandboxd_relist_converged_sandboxes"), 1000.0);

    // A full resync enqueues every one.
    relist_once(&ctx, &queue, &known, relist::Scope::Every).await;
    assert_eq!(queue.len(), 1000, "every sandbox enqueued");
    assert_eq!(h.metric("sandboxd_relist_converged_sandboxes"), 0.0);
    let after = h.runtime.faults.all_calls();

    // Reconciling the converged rows: per row one list filtered to the
    // sandbox and three calls for its network (ensure it, read its members
    // for the engines, read them again for the attached agents); nothing
    // is created, inspected or removed.
    let writes = h.store.status_writes();
    for sandbox in &ids {
        assert_eq!(reconcile(&ctx, sandbox).await.unwrap(), Next::Idle);
    }
    let done = h.runtime.faults.all_calls();
    let made = |op: RuntimeOp| done.get(&op).unwrap_or(&0) - after.get(&op).unwrap_or(&0);
    assert_eq!(made(RuntimeOp::List), 1000);
    assert_eq!(made(RuntimeOp::Network), 3000);
    let total: u64 = done.values().sum::<u64>() - after.values().sum::<u64>();
    assert_eq!(total, 4000, "no other Docker call: {done:?}");
    assert_eq!(
        h.runtime.full_lists(),
        full_lists + 2,
        "no full list but the two relists'"
    );
    assert_eq!(h.runtime.containers().len(), 1000);
    assert_eq!(
        h.runtime.faults.calls(RuntimeOp::Create),
        1000,
        "the first provisions only"
    );
    // The fake store counts same-content rewrites (the real one skips them).
    assert_eq!(h.store.status_writes(), writes + 1000);
}

#[tokio::test]
async fn a_relist_reconciles_the_sandboxes_its_lists_show_changed_and_leaves_the_converged_alone() {
    let h = Harness::new();
    let ctx = h.context();
    for name in ["dead", "off-net", "fine", "grown", "expiring"] {
        let mut d = row(name);
        if name == "expiring" {
            d.expires_at = Some(created() + chrono::Duration::hours(1));
        }
        h.store.put_desired(d);
        reconcile(&ctx, &id(name)).await.unwrap();
    }
    // Changes no event reported: a container died, a network went, and a
    // row changed without a NOTIFY.
    let (dead, _) = h.runtime.containers_of(&id("dead")).remove(0);
    h.runtime.kill(&dead, false);
    h.runtime
        .remove_network("sandboxd.test.off-net", &h.config.deployment)
        .await
        .unwrap();
    let mut grown = row("grown");
    grown.generation += 1;
    h.store.put_desired(grown);

    let queue = WorkQueue::new(QueueConfig::default(), h.metrics.clone());
    relist_once(
        &ctx,
        &queue,
        &KnownContainers::default(),
        relist::Scope::Unconverged,
    )
    .await;
    assert_eq!(queue.due(), 3, "dead, off-net and grown are due");
    assert_eq!(
        queue.len(),
        4,
        "and the expiring one is looked at when it expires"
    );
    assert_eq!(h.metric("sandboxd_relist_converged_sandboxes"), 2.0);
}
