//! The start executor (`controller::start`): the order it tries sources
//! in, and what a failed start leaves behind.

use super::*;

/// `sandboxd_container_starts_total` of the fake engine started `from`.
fn starts_from(h: &Harness, from: &str) -> f64 {
    let line = format!(
        "sandboxd_container_starts_total{{engine=\"{}\",from=\"{from}\"}}",
        ENGINE.as_str()
    );
    metric(h, &line)
}

/// Runs the pool's refill loop until its pool holds a ready container:
/// that container's id.
async fn fill_pool(h: &Harness, ctx: &Arc<Context>) -> ContainerId {
    let queue = WorkQueue::new(QueueConfig::default(), h.metrics.clone());
    let fill = tokio::spawn(crate::controller::pool::fill::refill_loop(
        ctx.clone(),
        queue,
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ctx.sources.pool.view(&ctx.env).iter().all(|p| p.ready == 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pool never filled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fill.abort();
    let pooled = h
        .runtime
        .pool_containers(&h.config.deployment)
        .await
        .unwrap();
    assert_eq!(pooled.len(), 1, "one pool container: {pooled:?}");
    pooled[0].id.clone()
}

#[tokio::test]
async fn a_pool_claim_that_fails_gives_way_to_a_cold_start_and_its_container_is_removed() {
    let mut h = Harness::new();
    with_pool(&mut h);
    let ctx = h.context();
    let pooled = fill_pool(&h, &ctx).await;

    // The claim sets the sandbox's credentials in the pool container by
    // exec: that one call fails, the next start (cold) does not.
    h.runtime.faults.set(RuntimeOp::Exec, Fault::Fail(1));
    h.store.put_desired(row("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);

    let (container, _) = h.published(&id("a"));
    assert_ne!(
        container, pooled,
        "the sandbox did not get the failed claim's container"
    );
    assert!(
        !h.runtime.containers().contains_key(&pooled),
        "the container a failed claim changed is removed"
    );
    assert_eq!(starts_from(&h, "cold"), 1.0, "counted where it came from");
}

#[tokio::test]
async fn a_failed_claims_container_left_behind_never_carries_the_published_token() {
    let mut h = Harness::new();
    with_pool(&mut h);
    let ctx = h.context();
    let pooled = fill_pool(&h, &ctx).await;

    // The claim fails (its credentials are not set), and so does removing
    // its container: the container stays, its claim recorded.
    h.runtime.faults.set(RuntimeOp::Exec, Fault::Fail(1));
    h.runtime.faults.set(RuntimeOp::Remove, Fault::Fail(1));
    h.store.put_desired(row("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert!(
        h.runtime.containers().contains_key(&pooled),
        "its removal failed"
    );
    let status = h.store.status_of(&id("a")).expect("a status row");
    let published = &status.services[ENGINE.as_str()].instance;
    let claimed = &h.store.claims()[&pooled].instance;
    // Sharing the token, the leftover would pass for the published
    // container: a heal could keep it, and publish credentials it never
    // got (simulation seed 9428).
    assert_ne!(
        published, claimed,
        "the cold start after the failed claim has a token of its own"
    );

    let (container, _) = h.published(&id("a"));
    assert_ne!(container, pooled, "the status is the cold container's");
}

#[tokio::test]
async fn a_ready_pool_container_is_tried_before_a_cold_start() {
    let mut h = Harness::new();
    with_pool(&mut h);
    let ctx = h.context();
    let pooled = fill_pool(&h, &ctx).await;

    h.store.put_desired(row("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);

    let status = h.store.status_of(&id("a")).expect("a status row");
    assert_eq!(status.phase, Phase::Ready, "{}", status.message);
    assert!(
        h.runtime.containers().contains_key(&pooled),
        "the pool container serves the sandbox"
    );
    assert_eq!(starts_from(&h, "cold"), 0.0, "nothing was created for it");
}

#[tokio::test]
async fn the_last_start_that_fails_fails_the_provision_and_leaves_no_container() {
    let h = Harness::new();
    let ctx = h.context();
    // The plain row's only start is cold: its engine never answers.
    h.runtime.faults.set(RuntimeOp::Exec, Fault::FailAlways);
    h.store.put_desired(row("a"));
    assert!(reconcile(&ctx, &id("a")).await.is_err());
    h.runtime.faults.clear(RuntimeOp::Exec);

    let status = h.store.status_of(&id("a")).expect("a status row");
    assert_ne!(status.phase, Phase::Ready);
    assert!(
        h.containers(&id("a")).is_empty(),
        "the container that did not come up is removed: {:?}",
        h.containers(&id("a"))
    );
    assert_eq!(starts_from(&h, "cold"), 0.0, "nothing started");
}

/// A seed's data file removed behind this process's back (another
/// leader's collection while this one stood by, an operator's `docker
/// volume rm`) is written again: the start refused for the missing volume
/// forgets it, and the next start writes it. (The simulation found it:
/// seed 4173.)
#[tokio::test]
async fn a_seed_data_file_removed_behind_the_controllers_back_is_written_again() {
    let h = Harness::new();
    let ctx = h.context();
    let content = b"FAKEDATA t=1";
    let hash = h.store.put_seed(ENGINE.as_str(), content);
    h.store.put_desired(DesiredSandbox {
        seeds: BTreeMap::from([(ENGINE, hash)]),
        ..row("a")
    });
    reconcile(&ctx, &id("a")).await.unwrap();
    let (first, _) = h.published(&id("a"));
    let seed_of = |c: &ContainerId| h.runtime.container(c).and_then(|c| c.seed);
    assert_eq!(seed_of(&first).as_deref(), Some("FAKEDATA t=1"));
    // The container goes, then its seed's volume.
    h.runtime.remove(&first, Duration::ZERO).await.unwrap();
    let volume = (h.runtime.volume_names().into_iter())
        .find(|v| v.contains("-seed-"))
        .expect("the data file's volume");
    (h.runtime.remove_volume(&volume, &h.config.deployment, None))
        .await
        .unwrap();
    for _ in 0..5 {
        if h.store.phase_of(&id("a")) == Some(Phase::Ready) && !h.containers(&id("a")).is_empty() {
            break;
        }
        let _ = reconcile(&ctx, &id("a")).await;
        // Past the heal's back-off.
        h.clock.advance(chrono::Duration::seconds(60));
    }
    let (healed, _) = h.published(&id("a"));
    assert_ne!(healed, first);
    assert_eq!(seed_of(&healed).as_deref(), Some("FAKEDATA t=1"));
}

/// A seed that fails to load into an engine that came up says nothing of
/// where the container started from: the start neither forgets the
/// engine's template (running its job again) nor starts a second, cold
/// container that fails the same way, so a failing seed's retries back
/// off at the pace they promise. (The simulation found it: seed 1 of the
/// template worlds, a failing seed's pool starting two containers a try.)
#[tokio::test]
async fn a_seed_that_fails_to_load_does_not_blame_the_template() {
    let h = Harness::templated();
    let ctx = h.context();
    // A plain sandbox starts cold while the template's job runs.
    h.store.put_desired(row("plain"));
    reconcile(&ctx, &id("plain")).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.runtime.template_jobs() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the template was never built"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let hash = h.store.put_seed(ENGINE.as_str(), b"fail: select 1/0");
    h.store.put_desired(DesiredSandbox {
        seeds: BTreeMap::from([(ENGINE, hash)]),
        ..row("seeded")
    });
    let seed_loads = || {
        (h.runtime.execs().into_iter())
            .filter(|(_, cmd)| cmd.first().map(String::as_str) == Some("seed"))
            .count()
    };
    assert!(reconcile(&ctx, &id("seeded")).await.is_err());
    assert_eq!(
        seed_loads(),
        1,
        "one container a try, started from the template"
    );
    assert_eq!(
        h.runtime.template_jobs(),
        1,
        "the template's job is not run again"
    );
}
