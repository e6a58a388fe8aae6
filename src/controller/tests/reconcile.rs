//! `reconcile` called directly against the fakes.

use super::*;

#[tokio::test]
async fn a_new_row_becomes_ready_with_one_published_container() {
    let h = Harness::new();
    let ctx = h.context();
    let generation = h.store.put_desired(row("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let (_, service) = h.published(&id("a"));
    assert_eq!(service.host, "fakedb");
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.observed_generation, generation);
    // A second look changes nothing.
    let writes = h.store.status_writes();
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(h.published(&id("a")).1, service);
    assert_eq!(
        h.store.status_writes(),
        writes + 1,
        "one rewrite, same content"
    );
}

#[tokio::test]
async fn a_failing_docker_list_is_a_retry_that_writes_no_status() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    h.runtime.faults.set(RuntimeOp::List, Fault::FailAlways);
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Runtime(_)), "{err}");
    assert!(err.to_string().contains("docker list failed"), "{err}");
    assert!(h.store.status_of(&id("a")).is_none());
    assert!(h.containers(&id("a")).is_empty());

    h.runtime.faults.clear(RuntimeOp::List);
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
}

#[tokio::test(start_paused = true)]
async fn a_create_that_hangs_past_its_deadline_fails_the_sandbox_with_the_reason() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    h.runtime.faults.set(RuntimeOp::Create, Fault::Hang);
    let started = tokio::time::Instant::now();
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert_eq!(
        started.elapsed(),
        h.config.docker_timeout,
        "bounded by the deadline"
    );
    let ReconcileError::Provision(message) = &err else {
        panic!("expected a provisioning failure, got {err}");
    };
    assert!(message.contains("fakedb: docker create"), "{message}");
    assert!(message.contains("did not answer within 30s"), "{message}");
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert_eq!(&status.message, message);
    assert!(h.containers(&id("a")).is_empty(), "nothing leaked");

    h.runtime.faults.clear(RuntimeOp::Create);
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
}

#[tokio::test(start_paused = true)]
async fn a_readiness_probe_that_hangs_gives_up_at_the_engines_deadline_and_leaves_nothing_behind() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    // The fake engine probes through exec, which now never answers (a
    // paused container, a wedged daemon).
    h.runtime.faults.set(RuntimeOp::Exec, Fault::Hang);
    let started = tokio::time::Instant::now();
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    let deadline = crate::engine::Engine::readiness_deadline(&FakeEngine::PLAIN);
    assert_eq!(
        started.elapsed(),
        deadline,
        "bounded by the engine's readiness deadline, not the exec's {:?}",
        h.config.docker_timeout
    );
    assert!(
        err.to_string()
            .contains("did not become ready within 5s (fakedb is not answering yet: the probe did not answer within 5s)"),
        "{err}"
    );
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Failed));
    assert!(
        h.containers(&id("a")).is_empty(),
        "the new container is removed"
    );

    h.runtime.faults.clear(RuntimeOp::Exec);
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
}

#[tokio::test(start_paused = true)]
async fn a_state_database_that_hangs_costs_a_retry_not_a_worker() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    h.store.faults.set(StoreOp::FetchDesired, Fault::Hang);
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("state database read desired row did not answer within 10s"),
        "{err}"
    );
    h.store.faults.clear(StoreOp::FetchDesired);
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
}

#[tokio::test]
async fn a_status_write_that_fails_mid_reconcile_is_retried_and_leaves_one_published_container() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    // The "provisioning" write passes; the final one fails after the
    // container was created.
    h.store
        .faults
        .set(StoreOp::WriteStatus, Fault::FailOnceAfter(1));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Store(_)), "{err}");
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Provisioning);
    assert!(status.services.is_empty(), "nothing published");
    let orphaned = h.containers(&id("a"));
    assert_eq!(orphaned.len(), 1);

    // The retry does not trust the unpublished container: it replaces it.
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    assert_ne!(container, orphaned[0].0);
}

#[tokio::test]
async fn a_row_naming_an_unknown_engine_fails_with_a_reason_and_provisions_the_rest() {
    let h = Harness::new();
    let ctx = h.context();
    let mut d = row("a");
    d.unknown_services = vec!["nonesuch".into()];
    h.store.put_desired(d);
    for _ in 0..2 {
        let err = reconcile(&ctx, &id("a")).await.unwrap_err();
        assert!(matches!(err, ReconcileError::Provision(_)), "{err}");
    }
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert!(
        status.message.starts_with("nonesuch: unknown engine"),
        "{}",
        status.message
    );
    assert!(status.services.contains_key(ENGINE.as_str()));
    assert_eq!(
        h.containers(&id("a")).len(),
        1,
        "the known engine runs once"
    );
}

#[tokio::test]
async fn a_dead_container_is_healed_with_the_same_credentials_and_its_cause_counted() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (first, before) = h.published(&id("a"));
    h.runtime.kill(&first, true);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (second, after) = h.published(&id("a"));
    assert_ne!(first, second);
    assert_eq!(after.password, before.password);
    assert_eq!(after.host_port, before.host_port);
    assert_eq!(
        h.metric("sandboxd_heals_total{cause=\"oom\",engine=\"fakedb\"}"),
        1.0
    );
}

#[tokio::test]
async fn a_deleted_row_is_reaped_only_once_the_injected_clock_passes_the_grace_window() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.delete_desired(&id("a"));

    // Created at `created()`, seen gone 10 s later: the grace window counts
    // from then.
    let next = reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(next, Next::After(Duration::from_secs(180)));
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Terminating));
    assert_eq!(h.containers(&id("a")).len(), 1);

    h.clock.advance(chrono::Duration::seconds(180));

    h.look(&ctx);
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert!(h.containers(&id("a")).is_empty());
    assert!(h.store.status_of(&id("a")).is_none());
    assert_eq!(ctx.reaps.gone.len(), 0, "a sandbox fully gone is forgotten");
}

#[tokio::test]
async fn a_row_deleted_long_after_its_containers_were_created_is_kept_for_the_grace_window_from_when_it_was_seen_gone(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    h.clock.advance(chrono::Duration::hours(1));
    h.look(&ctx);
    h.store.delete_desired(&id("a"));

    let next = reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(next, Next::After(Duration::from_secs(180)));
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Terminating));
    h.clock.advance(chrono::Duration::seconds(179));
    h.look(&ctx);
    assert_eq!(
        reconcile(&ctx, &id("a")).await.unwrap(),
        Next::After(Duration::from_secs(1)),
        "the grace counts from the first time the row was seen gone"
    );
    assert_eq!(h.containers(&id("a"))[0].0, container, "still there");

    h.clock.advance(chrono::Duration::seconds(1));

    h.look(&ctx);
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert!(h.containers(&id("a")).is_empty());
    assert!(h.store.status_of(&id("a")).is_none());
}

#[tokio::test]
async fn a_row_that_comes_back_within_the_grace_window_starts_a_new_clock_when_deleted_again() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.clock.advance(chrono::Duration::seconds(100));
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(ctx.reaps.gone.len(), 0, "a row that exists is not gone");

    h.clock.advance(chrono::Duration::seconds(100));
    h.store.delete_desired(&id("a"));
    assert_eq!(
        reconcile(&ctx, &id("a")).await.unwrap(),
        Next::After(Duration::from_secs(180))
    );
    assert_eq!(h.containers(&id("a")).len(), 1);
}

#[tokio::test]
async fn containers_are_hardened_and_get_their_secrets_only_on_standard_input() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, service) = h.published(&id("a"));
    let spec = h.runtime.containers()[&container].spec.clone();
    assert_eq!(spec.name, "sandboxd.test.a.fakedb");
    assert_eq!(spec.image, "fakedb:1");
    assert_eq!(spec.user, "999:999");
    let mounts: Vec<&str> = spec.tmpfs.iter().map(|t| t.path.as_str()).collect();
    assert_eq!(mounts, ["/data", "/tmp", "/run/fakedb"]);
    assert_eq!(spec.limits, h.config.limits);
    assert!(spec.limits.oom_score_adj > 0);
    assert_eq!(spec.network, "sandboxd.test.a");
    assert_eq!(spec.aliases, ["fakedb"]);
    let password = service.password.expose();
    let stdin = spec.stdin.as_ref().expect("secrets go to stdin");
    assert_eq!(stdin.expose(), format!("SANDBOXD_PASSWORD={password}\n"));
    for text in spec.labels.values().chain(&spec.env).chain(&spec.cmd) {
        assert!(!text.contains(password), "{text}");
    }
    // Clients on the sandbox's network reach the engine by its name.
    assert_eq!(service.host, "fakedb");
}

#[tokio::test]
async fn each_sandbox_gets_its_own_network_which_goes_with_the_sandbox() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    h.store.put_desired(row("b"));
    reconcile(&ctx, &id("a")).await.unwrap();
    reconcile(&ctx, &id("b")).await.unwrap();
    assert_eq!(h.networks().await, ["sandboxd.test.a", "sandboxd.test.b"]);
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.network.as_deref(), Some("sandboxd.test.a"));

    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.networks().await.len(), 2, "kept while a container waits");
    h.clock.advance(chrono::Duration::seconds(3600));
    h.look(&ctx);
    reconcile(&ctx, &id("a")).await.unwrap();
    assert!(h.containers(&id("a")).is_empty());
    assert_eq!(h.networks().await, ["sandboxd.test.b"]);
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_network_removed_out_of_band_is_created_again_with_its_engines_and_agents_back_on_it(
) {
    let mut h = Harness::new();
    // Only the removal's event can wake the sandbox within the test.
    h.config.relist_interval = Duration::from_secs(3600);
    let (stop, task) = start(h.controller());
    let mut d = row("a");
    d.attach = vec!["agent-1".into()];
    h.store.put_desired(d);
    until("a is ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;
    let (container, before) = h.published(&id("a"));

    // `docker network disconnect` of everything, then `docker network rm`.
    h.runtime
        .remove_network("sandboxd.test.a", &h.config.deployment)
        .await
        .unwrap();
    assert!(!h.runtime.has_network("sandboxd.test.a"));
    until(
        "the network is back with the engine and the agent on it",
        || {
            let members = futures::executor::block_on(h.runtime.network_members("sandboxd.test.a"));
            members.ok().flatten().is_some_and(|mut m| {
                m.sort();
                m == ["agent-1", "sandboxd.test.a.fakedb"]
            })
        },
    )
    .await;
    until("the new host port is published", || {
        h.store.status_of(&id("a")).is_some_and(|s| {
            s.services[ENGINE.as_str()].host_port == h.runtime.containers()[&container].host_port
        })
    })
    .await;
    let (same, after) = h.published(&id("a"));
    assert_eq!(same, container, "the engine was not replaced");
    assert_eq!(after.password, before.password);
    assert_eq!(after.instance, before.instance);
    assert_ne!(
        after.host_port, before.host_port,
        "joining the network again bound the port anew"
    );
    assert_eq!(h.metric("sandboxd_networks_recreated_total"), 1.0);
    assert_eq!(h.metric("sandboxd_network_reconnects_total"), 1.0);
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_create_that_finds_its_network_gone_creates_the_network_again_and_retries_once() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    // Removed between the reconcile's check and the create.
    h.runtime.lose_network_at_next_create();
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
    assert!(h.runtime.has_network("sandboxd.test.a"));
    assert_eq!(h.metric("sandboxd_networks_recreated_total"), 1.0);
}

#[tokio::test]
async fn containers_named_in_attach_are_connected_and_dropped_ones_disconnected() {
    let h = Harness::new();
    let ctx = h.context();
    let mut d = row("a");
    d.attach = vec!["agent-1".into(), "agent-2".into()];
    h.store.put_desired(d.clone());
    reconcile(&ctx, &id("a")).await.unwrap();
    let members = |h: &Harness| {
        let mut m = futures::executor::block_on(h.runtime.network_members("sandboxd.test.a"))
            .unwrap()
            .unwrap();
        m.sort();
        m
    };
    assert_eq!(
        members(&h),
        ["agent-1", "agent-2", "sandboxd.test.a.fakedb"]
    );

    d.attach = vec!["agent-2".into()];
    d.generation += 1;
    h.store.put_desired(d.clone());
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(members(&h), ["agent-2", "sandboxd.test.a.fakedb"]);

    d.attach = vec!["missing-agent".into()];
    d.generation += 1;
    h.store.put_desired(d);
    assert!(reconcile(&ctx, &id("a")).await.is_err());
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert!(
        status.message.contains("missing-agent"),
        "{}",
        status.message
    );
    // The engine itself stays published.
    assert!(status.services.contains_key("fakedb"));
}

#[tokio::test]
async fn a_container_opted_in_for_another_owner_is_not_connected_and_reads_as_a_missing_one() {
    use crate::domain::attach::{AttachError, OPT_IN};
    let h = Harness::new();
    let ctx = h.context();
    let mut theirs = h.runtime.attach_candidate("theirs").await.unwrap().unwrap();
    theirs.labels.insert(OPT_IN.into(), "someone-else".into());
    h.runtime.set_attach_candidate("theirs", Some(theirs));
    let mut d = row("a");
    d.attach = vec!["theirs".into(), "missing-agent".into()];
    h.store.put_desired(d);
    assert!(reconcile(&ctx, &id("a")).await.is_err());
    let members = h
        .runtime
        .network_members("sandboxd.test.a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(members, ["sandboxd.test.a.fakedb"]);
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    for name in ["theirs", "missing-agent"] {
        let refused = AttachError::NotAttachable {
            name: name.into(),
            owner: FakeRuntime::AGENT_OWNER.into(),
        };
        assert!(
            status.message.contains(&refused.to_string()),
            "{}",
            status.message
        );
    }
    assert!(
        !status.message.contains("someone-else"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn an_unreadable_row_fails_with_its_reason_and_keeps_the_containers() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let before = h.containers(&id("a"));
    let mut d = row("a");
    d.services.clear();
    d.invalid = Some("services is not a one-dimensional array".into());
    d.generation = 2;
    h.store.put_desired(d);
    h.clock.advance(chrono::Duration::seconds(3600));
    assert!(reconcile(&ctx, &id("a")).await.is_err());
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert!(
        status.message.contains("one-dimensional"),
        "{}",
        status.message
    );
    assert_eq!(h.containers(&id("a")), before);
    assert!(
        status.services.contains_key("fakedb"),
        "credentials stay published"
    );
}

#[tokio::test(start_paused = true)]
async fn an_absent_image_is_fetched_in_the_background_and_a_fetch_that_fails_fails_the_sandbox_naming_the_image(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.runtime.remove_image("fakedb:1");
    h.store.put_desired(row("a"));
    // The reconcile does not wait for the pull: it says so and returns.
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Provisioning);
    assert_eq!(status.observed_generation, 0, "not observed yet");
    assert!(
        status
            .message
            .contains("fakedb: waiting for image fakedb:1: it is being pulled"),
        "{}",
        status.message
    );
    // The pull fails; the sandbox, enqueued again, is told why.
    until("the pull failed", || {
        h.metric("sandboxd_image_pulls_total{result=\"error\"}") == 1.0
    })
    .await;
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert!(
        status
            .message
            .contains("image fakedb:1 is not present and could not be pulled"),
        "{}",
        status.message
    );
    assert!(err.to_string().contains("fakedb:1"), "{err}");

    // Its retry fetches the image again, and then it is used.
    h.runtime.publish_image("fakedb:1", Duration::from_secs(1));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Provisioning));
    until("the pull succeeded", || {
        h.metric("sandboxd_image_pulls_total{result=\"success\"}") == 1.0
    })
    .await;
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
    assert_eq!(h.runtime.pulls_of("fakedb:1"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_pull_that_hangs_holds_no_worker_while_a_sandbox_on_another_image_becomes_ready() {
    let mut h = Harness::new();
    h.config.concurrency = 1;
    h.config.pull_timeout = Duration::from_secs(40);
    let image = h.config.images.image_for(&FakeEngine::PLAIN, true);
    h.runtime.remove_image(&image);
    h.runtime.faults.set(RuntimeOp::Pull, Fault::Hang);
    let (stop, task) = start(h.controller());
    let mut a = row("a");
    a.features = BTreeMap::from([(ENGINE, ["alpha".to_owned()].into())]);
    h.store.put_desired(a);
    until("a waits for its image", || {
        h.store.status_of(&id("a")).is_some_and(|s| {
            s.phase == Phase::Provisioning
                && s.message
                    .contains(&format!("waiting for image {image}: it is being pulled"))
        })
    })
    .await;

    // The only worker is free: a sandbox on a present image is served.
    h.store.put_desired(row("b"));
    until("b is ready", || {
        h.store.phase_of(&id("b")) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Provisioning));
    assert_eq!(h.metric("sandboxd_image_fetches"), 1.0);

    // The pull gives up at --pull-timeout: reported in a's status, retried
    // with backoff; once the registry answers, a is served.
    until("a's pull timed out", || {
        h.store.status_of(&id("a")).is_some_and(|s| {
            s.phase == Phase::Failed && s.message.contains("pull timed out after 40s")
        })
    })
    .await;
    h.runtime.faults.clear(RuntimeOp::Pull);
    h.runtime.publish_image(&image, Duration::from_secs(1));
    until("a is ready", || {
        h.store.phase_of(&id("a")) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(
        h.runtime.pulls_of(&image),
        2,
        "the hung one and the retry's"
    );
    assert_eq!(h.metric("sandboxd_image_fetches"), 0.0);
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn ten_sandboxes_waiting_for_one_absent_image_cause_one_pull_and_all_become_ready() {
    let h = Harness::new();
    h.runtime.remove_image("fakedb:1");
    h.runtime.publish_image("fakedb:1", Duration::from_secs(10));
    let (stop, task) = start(h.controller());
    let ids: Vec<SandboxId> = (0..10).map(|i| id(&format!("s{i}"))).collect();
    for i in &ids {
        h.store.put_desired(row(i.as_str()));
    }
    until("all ten wait for the image", || {
        ids.iter().all(|i| {
            h.store
                .status_of(i)
                .is_some_and(|s| s.message.contains("waiting for image fakedb:1"))
        })
    })
    .await;
    until("all ten are ready", || {
        ids.iter()
            .all(|i| h.store.phase_of(i) == Some(Phase::Ready))
    })
    .await;
    assert_eq!(h.runtime.pulls_of("fakedb:1"), 1);
    assert_eq!(
        h.metric("sandboxd_image_pulls_total{result=\"success\"}"),
        1.0
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_failed_teardown_is_retried_and_keeps_the_status() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.clock.advance(chrono::Duration::seconds(600));
    h.look(&ctx);
    h.runtime.faults.set(RuntimeOp::Remove, Fault::Fail(1));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Teardown(_)), "{err}");
    assert!(h.store.status_of(&id("a")).is_some());
    reconcile(&ctx, &id("a")).await.unwrap();
    assert!(h.containers(&id("a")).is_empty());
    assert!(h.store.status_of(&id("a")).is_none());
}

/// The reasons, details and messages of `sandbox`'s recorded events.
fn events(h: &Harness, sandbox: &SandboxId) -> Vec<(String, Option<String>, String, u32)> {
    h.store
        .events_of(sandbox)
        .into_iter()
        .map(|(e, n)| (e.reason.as_str().to_owned(), e.detail, e.message, n))
        .collect()
}

#[tokio::test]
async fn a_provision_a_heal_and_a_reap_are_recorded_as_events_with_their_cause_and_no_password() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (first, before) = h.published(&id("a"));
    h.runtime.kill(&first, true);
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.clock.advance(chrono::Duration::seconds(600));
    h.look(&ctx);
    reconcile(&ctx, &id("a")).await.unwrap();

    let got = events(&h, &id("a"));
    let reasons: Vec<(&str, Option<&str>)> = got
        .iter()
        .map(|(r, d, _, _)| (r.as_str(), d.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("provisioned", Some("cold")),
            ("healed", Some("oom")),
            ("reaped", Some("deleted"))
        ],
        "{got:#?}"
    );
    assert!(
        got[1].2.contains("killed for lack of memory"),
        "{}",
        got[1].2
    );
    for (_, _, message, _) in &got {
        assert!(!message.contains(before.password.expose()), "{message}");
    }
    assert_eq!(h.metric("sandboxd_events_total{reason=\"healed\"}"), 1.0);
}

#[tokio::test]
async fn a_failure_that_repeats_is_one_event_counted_and_a_sandbox_keeps_only_its_newest_events() {
    let mut h = Harness::new();
    h.config.events_per_sandbox = 5;
    let ctx = h.context();
    h.store.put_desired(row("a"));
    h.runtime.faults.set(RuntimeOp::Create, Fault::Fail(3));
    for _ in 0..3 {
        reconcile(&ctx, &id("a")).await.unwrap_err();
    }
    let got = events(&h, &id("a"));
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!((got[0].0.as_str(), got[0].3), ("failed", 3));
    reconcile(&ctx, &id("a")).await.unwrap();
    for _ in 0..10 {
        let (container, _) = h.published(&id("a"));
        h.runtime.kill(&container, false);
        ctx.heals.crash_loops.forget(&id("a"));
        reconcile(&ctx, &id("a")).await.unwrap();
    }
    let got = events(&h, &id("a"));
    assert_eq!(got.len(), 5, "the newest five: {got:#?}");
    assert!(got
        .iter()
        .all(|(r, d, _, _)| r == "healed" && d.as_deref() == Some("exited")));
    assert!(got[4].2.contains("(heal 10)"), "{}", got[4].2);
}

/// A webhook receiver that takes each attempt and never answers.
#[derive(Default)]
struct HangingWebhook {
    got: std::sync::Mutex<Vec<(Vec<u8>, String)>>,
}

#[async_trait::async_trait]
impl crate::ports::webhook::WebhookTransport for HangingWebhook {
    async fn post(
        &self,
        body: &[u8],
        signature: &str,
    ) -> Result<(), crate::ports::webhook::WebhookError> {
        self.got
            .lock()
            .unwrap()
            .push((body.to_vec(), signature.to_owned()));
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_webhook_that_hangs_gets_the_recorded_events_signed_and_never_slows_a_reconcile() {
    let h = Harness::new();
    let mut ctx = h.context();
    let hook = Arc::new(HangingWebhook::default());
    let attempt = Duration::from_secs(3600);
    let config = crate::config::WebhookConfig {
        timeout: attempt,
        retries: 0,
        queue: 1,
        ..crate::config::WebhookConfig::new(
            crate::config::WebhookUrl::parse("http://127.0.0.1:9/hook").unwrap(),
            crate::domain::Secret::new("a-unit-test-webhook-secret"),
        )
    };
    let (notifier, delivery) = super::webhook::channel(&config, hook.clone(), h.metrics.clone());
    Arc::get_mut(&mut ctx)
        .expect("the context is not shared yet")
        .outbox
        .webhook = notifier;
    let sending = tokio::spawn(delivery.run());

    let started = tokio::time::Instant::now();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    // The task takes the provisioned event and hangs on it; two heals
    // follow: the first one's event waits in the queue, the second's is
    // dropped.
    while hook.got.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    for _ in 0..2 {
        let (container, _) = h.published(&id("a"));
        h.runtime.kill(&container, false);
        ctx.heals.crash_loops.forget(&id("a"));
        reconcile(&ctx, &id("a")).await.unwrap();
    }
    assert!(
        started.elapsed() < attempt,
        "the reconciles waited for the webhook: {:?}",
        started.elapsed()
    );
    assert_eq!(h.published(&id("a")).1.heals, 2);
    assert_eq!(h.metric("sandboxd_webhook_dropped_total"), 1.0);
    assert_eq!(h.metric("sandboxd_webhook_queue_depth"), 1.0);
    let got = hook.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "one attempt so far");
    let (body, signature) = &got[0];
    assert!(
        crate::domain::notice::verify(b"a-unit-test-webhook-secret", signature, body).is_some()
    );
    let sent: crate::domain::notice::EventNotice = serde_json::from_slice(body).unwrap();
    assert_eq!(
        (
            sent.sandbox_id.as_str(),
            sent.reason.as_str(),
            sent.owner.as_str()
        ),
        ("a", "provisioned", "test")
    );
    sending.abort();
}
