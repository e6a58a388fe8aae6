//! Deletion safety: an empty or restored state database reaps nothing at once.

use super::*;

#[tokio::test(start_paused = true)]
async fn an_orphan_container_found_at_start_is_kept_for_the_grace_window_from_the_start() {
    let h = Harness::new();
    // A container left by a controller whose state database is now empty
    // (no row, no status), created an hour before this controller starts.
    let previous = h.context();
    h.store.put_desired(row("a"));
    reconcile(&previous, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    h.store.delete_desired(&id("a"));
    let term = previous.env.fence.check().unwrap();
    h.store.delete_status(&id("a"), term).await.unwrap();
    h.clock.advance(chrono::Duration::hours(1));
    h.step_down().await;

    let (stop, task) = start(h.controller());
    until("the initial relist", || {
        h.metric("sandboxd_relists_total") >= 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    h.clock.advance(chrono::Duration::seconds(179));
    // Past the first requeue (180 s of virtual time) and a relist.
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert_eq!(
        h.containers(&id("a"))[0].0,
        container,
        "kept for the grace window from the start"
    );
    assert!(
        h.store.status_of(&id("a")).is_none(),
        "an orphan gets no status"
    );

    h.clock.advance(chrono::Duration::seconds(1));
    until("the orphan is reaped", || h.containers(&id("a")).is_empty()).await;
    assert_eq!(h.metric("sandboxd_reaps_total{reason=\"orphan\"}"), 1.0);
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn an_engine_that_keeps_dying_on_its_own_backs_off_to_the_cap_and_is_never_given_up() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (_, first) = h.published(&id("a"));
    let policy = h.config.crash_loop;
    let mut waits = Vec::new();
    for _ in 0..9 {
        let (container, _) = h.published(&id("a"));
        h.runtime.kill(&container, false);
        match reconcile(&ctx, &id("a")).await.unwrap() {
            Next::Idle => waits.push(0),
            Next::After(wait) => {
                let status = h.store.status_of(&id("a")).unwrap();
                assert_eq!(status.phase, Phase::Healing);
                assert!(
                    status.message.contains("crash loop")
                        && status.message.contains("next heal is at"),
                    "{}",
                    status.message
                );
                waits.push(wait.as_secs());
                h.clock.advance(chrono::Duration::from_std(wait).unwrap());
                reconcile(&ctx, &id("a")).await.unwrap();
            }
        }
    }
    // The first heal at once, then doubling from the base up to the cap,
    // and on at the cap.
    assert_eq!(waits, [0, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(policy.cap.as_secs(), 60);
    let (_, service) = h.published(&id("a"));
    assert_eq!(service.heals, 9);
    assert_eq!(
        service.password, first.password,
        "the same credentials throughout"
    );
}

#[tokio::test(start_paused = true)]
async fn a_heal_that_fails_backs_off_though_its_own_removal_of_the_new_container_reports_orders() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    // The watcher records sandboxd's own removal of a heal's failed
    // container (a `kill` and a `destroy`) before the reconcile looks.
    h.runtime.report_orders_to(ctx.env.orders.clone());
    let (container, _) = h.published(&id("a"));
    h.runtime.kill(&container, false);
    // The heal's new container never answers (a stale bridge holds its
    // route, say).
    h.runtime.faults.set(RuntimeOp::Exec, Fault::Hang);
    for _ in 0..2 {
        let next = reconcile(&ctx, &id("a")).await.unwrap();
        let status = h.store.status_of(&id("a")).unwrap();
        assert!(
            status.message.contains("did not become ready")
                && !status.message.contains("ended from outside"),
            "{}",
            status.message
        );
        let Next::After(wait) = next else {
            panic!("a failed heal is held by the back-off, not retried at once: {next:?}");
        };
        assert!(wait >= Duration::from_secs(1), "{wait:?}");
        h.clock.advance(chrono::Duration::from_std(wait).unwrap());
    }
}

#[tokio::test]
async fn a_container_killed_from_outside_is_healed_at_once_every_time_and_not_counted() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (_, first) = h.published(&id("a"));
    for _ in 0..20 {
        let (container, _) = h.published(&id("a"));
        h.runtime.kill_from_outside(&container);
        // The event watcher records the order before the heal looks.
        ctx.env
            .orders
            .record(&container, crate::domain::death::Order::Kill);
        assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
        assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Ready));
    }
    let (_, service) = h.published(&id("a"));
    assert_eq!(service.heals, 20);
    assert_eq!(service.password, first.password);
    assert!(
        ctx.heals.crash_loops.heals(&id("a"), ENGINE, 0).is_empty(),
        "orders from outside never count towards the crash loop"
    );
    // The engine then dies on its own: its first death is healed at once.
    let (container, _) = h.published(&id("a"));
    h.runtime.kill(&container, false);
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
}
