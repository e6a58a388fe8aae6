//! A heal right after `docker rm -f`: the old container still holds its
//! name while Docker removes it. The create waits for the removal and goes
//! on; the reconcile does not fail.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_heal_meeting_its_name_held_by_a_container_being_removed_waits_and_keeps_the_credentials()
{
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (first, before) = h.published(&id("a"));
    let creates = h.runtime.faults.calls(RuntimeOp::Create);

    // Docker answered `rm -f`; the removal takes five more looks.
    h.runtime.remove_slowly(&first, 5);
    reconcile(&ctx, &id("a"))
        .await
        .expect("the heal waits for the removal instead of failing");

    let (second, after) = h.published(&id("a"));
    assert_ne!(second, first, "the old container is gone, a new one serves");
    assert_eq!(
        after.password, before.password,
        "healed with the same credentials"
    );
    assert_eq!(
        h.runtime.faults.calls(RuntimeOp::Create) - creates,
        2,
        "refused once while the name was held, then created"
    );
    let failed: Vec<_> = h
        .store
        .events_of(&id("a"))
        .into_iter()
        .filter(|(e, _)| e.reason.as_str() == "reconcile_failed")
        .collect();
    assert!(failed.is_empty(), "no reconcile failure: {failed:?}");
}

#[tokio::test(start_paused = true)]
async fn a_removal_that_never_ends_fails_the_heal_naming_the_holder_and_the_deadline_and_it_is_retried(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (first, _) = h.published(&id("a"));

    h.runtime.remove_slowly(&first, u32::MAX);
    let started = tokio::time::Instant::now();
    // The failed heal is retried under the crash-loop back-off, its
    // status `healing` saying why, not a failed reconcile.
    let next = reconcile(&ctx, &id("a")).await.unwrap();
    assert!(matches!(next, Next::After(_)), "{next:?}");
    let waited = started.elapsed();
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Healing);
    let err = status.message;
    assert!(
        err.contains(first.as_str()) && err.contains("10s"),
        "the status names the holder and the deadline: {err}"
    );
    assert!(
        waited >= super::super::name_release::RELEASE_WITHIN && waited < Duration::from_secs(15),
        "bounded by the deadline: waited {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_running_controller_heals_docker_rm_f_repeatedly_without_a_reconcile_error() {
    let h = Harness::new();
    let (stop, task) = start(h.controller());
    h.store.put_desired(row("a"));
    until("a is ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;
    let (_, before) = h.published(&id("a"));
    for round in 0..4 {
        // No clock moves: a removal from outside is healed at once every
        // time, never held back by the crash-loop back-off.
        let (old, _) = h.published(&id("a"));
        h.runtime.remove_slowly(&old, 3);
        until("the heal is published", || {
            let c = h.containers(&id("a"));
            c.len() == 1
                && c[0].0 != old
                && h.store.status_of(&id("a")).is_some_and(|s| {
                    s.phase == Phase::Ready && s.services[ENGINE.as_str()].instance == c[0].1
                })
        })
        .await;
        let (_, after) = h.published(&id("a"));
        assert_eq!(after.password, before.password, "round {round}");
    }
    assert_eq!(
        h.metric("controller_runtime_reconcile_errors_total{controller=\"sandbox\"}"),
        0.0
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}
