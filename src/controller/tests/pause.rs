//! Pause on idle, resume on use.

use super::*;

/// A row that pauses once unused for a minute.
fn pausing(name: &str) -> DesiredSandbox {
    DesiredSandbox {
        idle_timeout: Some(Duration::from_secs(60)),
        idle_action: crate::domain::sandbox::IdleAction::Pause,
        ..row(name)
    }
}

fn paused_containers(h: &Harness, sandbox: &SandboxId) -> Vec<bool> {
    h.runtime
        .containers_of(sandbox)
        .into_iter()
        .map(|(_, c)| c.paused)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_idle_row_that_asks_to_pause_is_paused_and_a_touch_resumes_the_same_container() {
    let h = Harness::new();
    let ctx = h.context();
    let p = id("p");
    let mut d = pausing("p");
    d.last_used_at = h.clock.now();
    h.store.put_desired(d);
    // Not idle yet: ready, looked at again when it would go idle.
    let next = reconcile(&ctx, &p).await.unwrap();
    assert_eq!(next, Next::After(Duration::from_secs(60)));
    let (container, service) = h.published(&p);

    h.clock.advance(chrono::Duration::seconds(61));
    assert_eq!(reconcile(&ctx, &p).await.unwrap(), Next::Idle);
    let status = h.store.status_of(&p).unwrap();
    assert_eq!(status.phase, Phase::Paused, "{}", status.message);
    assert_eq!(status.message, crate::domain::status::PAUSED);
    assert_eq!(
        *status.services[ENGINE.as_str()],
        service,
        "same credentials"
    );
    assert_eq!(paused_containers(&h, &p), [true]);
    assert_eq!(
        h.metric("sandboxd_idle_actions_total{action=\"paused\"}"),
        1.0
    );
    // A second look changes nothing and pauses nothing again.
    assert_eq!(reconcile(&ctx, &p).await.unwrap(), Next::Idle);
    assert_eq!(
        h.metric("sandboxd_idle_actions_total{action=\"paused\"}"),
        1.0
    );

    // A touch: the same container, thawed, ready with the same credentials.
    h.store.mark_used(&p, h.clock.now()).await.unwrap();
    reconcile(&ctx, &p).await.unwrap();
    assert_eq!(h.published(&p), (container, service));
    assert_eq!(paused_containers(&h, &p), [false]);
    assert_eq!(
        h.metric("sandboxd_idle_actions_total{action=\"resumed\"}"),
        1.0
    );
    let reasons: Vec<&str> = h
        .store
        .events_of(&p)
        .iter()
        .map(|(e, _)| e.reason.as_str())
        .collect();
    assert!(
        reasons.ends_with(&["paused", "resumed"]),
        "events: {reasons:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_with_a_connected_client_is_not_paused_past_its_timeout_and_its_idleness_starts_again(
) {
    let h = Harness::new();
    let ctx = h.context();
    let p = id("p");
    let mut d = pausing("p");
    d.last_used_at = h.clock.now();
    h.store.put_desired(d);
    reconcile(&ctx, &p).await.unwrap();
    let (container, _) = h.published(&p);
    h.runtime.set_clients(&container, 1);

    h.clock.advance(chrono::Duration::seconds(61));
    let next = reconcile(&ctx, &p).await.unwrap();
    h.published(&p);
    assert_eq!(paused_containers(&h, &p), [false]);
    assert_eq!(
        h.store
            .fetch_desired(&p)
            .await
            .unwrap()
            .unwrap()
            .last_used_at,
        h.clock.now(),
        "the connection was recorded as a use"
    );
    assert_eq!(next, Next::After(Duration::from_secs(60)));
    assert_eq!(
        h.metric("sandboxd_idle_actions_total{action=\"in_use\"}"),
        1.0
    );

    // The client goes away: paused once idle again.
    h.runtime.set_clients(&container, 0);
    h.clock.advance(chrono::Duration::seconds(61));
    reconcile(&ctx, &p).await.unwrap();
    assert_eq!(h.store.status_of(&p).unwrap().phase, Phase::Paused);
    assert_eq!(paused_containers(&h, &p), [true]);
}

#[tokio::test(start_paused = true)]
async fn a_row_released_when_idle_is_kept_while_a_client_is_connected() {
    let h = Harness::new();
    let ctx = h.context();
    let p = id("p");
    let mut d = row("p");
    d.idle_timeout = Some(Duration::from_secs(60));
    d.last_used_at = h.clock.now();
    h.store.put_desired(d);
    reconcile(&ctx, &p).await.unwrap();
    let (container, _) = h.published(&p);
    h.runtime.set_clients(&container, 2);
    // Past the idle timeout and the grace window.
    h.clock.advance(chrono::Duration::seconds(600));
    reconcile(&ctx, &p).await.unwrap();
    assert_eq!(h.published(&p).0, container, "not released");

    h.runtime.set_clients(&container, 0);
    h.clock.advance(chrono::Duration::seconds(61));
    reconcile(&ctx, &p).await.unwrap();
    assert!(h.containers(&p).is_empty(), "released once unused");
    assert_eq!(h.store.status_of(&p).unwrap().phase, Phase::Terminating);
}

#[tokio::test(start_paused = true)]
async fn a_paused_sandbox_is_not_healed_and_is_torn_down_when_its_row_is_deleted() {
    let h = Harness::new();
    let ctx = h.context();
    let p = id("p");
    let mut d = pausing("p");
    d.last_used_at = h.clock.now() - chrono::Duration::seconds(61);
    h.store.put_desired(d);
    reconcile(&ctx, &p).await.unwrap();
    reconcile(&ctx, &p).await.unwrap();
    assert_eq!(h.store.status_of(&p).unwrap().phase, Phase::Paused);
    let before = h.containers(&p);
    // Looked at again (a relist, a Docker event): alive, not re-created.
    reconcile(&ctx, &p).await.unwrap();
    assert_eq!(h.containers(&p), before);
    assert_eq!(paused_containers(&h, &p), [true]);

    h.store.delete_desired(&p);
    h.clock.advance(chrono::Duration::seconds(181));
    reconcile(&ctx, &p).await.unwrap();
    h.look(&ctx);
    h.clock.advance(chrono::Duration::seconds(181));
    reconcile(&ctx, &p).await.unwrap();
    assert!(h.containers(&p).is_empty(), "torn down");
    assert!(h.store.status_of(&p).is_none());
}
