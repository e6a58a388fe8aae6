//! The warm pool: when a provision tries it, and what it counts.

use super::*;

fn pool_claims(h: &Harness, result: &str, kind: &str) -> f64 {
    let line = format!(
        "sandboxd_pool_claims_total{{engine=\"{}\",kind=\"{kind}\",result=\"{result}\"}}",
        ENGINE.as_str()
    );
    metric(h, &line)
}

#[tokio::test]
async fn a_sandbox_whose_pool_has_nothing_ready_is_provisioned_cold_and_counts_a_miss() {
    let mut h = Harness::new();
    with_pool(&mut h);
    let ctx = h.context();
    h.store.put_desired(row("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let (container, _) = h.published(&id("a"));
    assert!(h.runtime.containers().contains_key(&container));
    assert_eq!(pool_claims(&h, "miss", "create"), 1.0);
    assert_eq!(pool_claims(&h, "hit", "create"), 0.0);
    // The heal of its dead container tries the pool too.
    h.runtime.kill(&container, false);
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
    assert_eq!(pool_claims(&h, "miss", "heal"), 1.0);
}

#[tokio::test]
async fn a_persistent_sandbox_never_tries_the_pool() {
    let mut h = Harness::new();
    with_pool(&mut h);
    let ctx = h.context();
    h.store.put_desired(DesiredSandbox {
        persistent: true,
        ..row("p")
    });
    reconcile(&ctx, &id("p")).await.unwrap();
    h.published(&id("p"));
    assert_eq!(pool_claims(&h, "miss", "create"), 0.0);
    assert_eq!(pool_claims(&h, "hit", "create"), 0.0);
}

#[tokio::test]
async fn a_sandbox_without_a_configured_pool_never_tries_one() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("n"));
    reconcile(&ctx, &id("n")).await.unwrap();
    h.published(&id("n"));
    assert_eq!(pool_claims(&h, "miss", "create"), 0.0);
}
