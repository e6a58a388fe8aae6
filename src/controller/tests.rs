//! `reconcile` and the controller against the in-memory fakes: Docker and
//! Postgres failing, hanging and panicking on demand. Each ends in a retry
//! or a `failed` status with a reason, never in a panic escaping, and the
//! queue keeps serving other keys.

use super::reconcile::{reconcile, Next, ReconcileError};
use super::*;
use crate::domain::clock::ManualClock;
use crate::domain::id::{Deployment, EngineName};
use crate::domain::sandbox::{DesiredSandbox, Phase};
use crate::testing::{FakeEngine, FakeRuntime, FakeStore, Fault, RuntimeOp, StoreOp, FAKE_ENGINES};
use chrono::TimeZone;
use std::collections::{BTreeMap, BTreeSet};

const ENGINE: EngineName = FakeEngine::NAME;

/// When the fake runtime says its containers were created.
fn created() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap()
}

fn id(s: &str) -> SandboxId {
    SandboxId::parse(s).unwrap()
}

fn row(name: &str) -> DesiredSandbox {
    DesiredSandbox {
        id: id(name),
        owner: "test".into(),
        services: vec![ENGINE],
        unknown_services: Vec::new(),
        attach: Vec::new(),
        invalid: None,
        features: BTreeMap::new(),
        expires_at: None,
        generation: 0,
        incarnation: None,
        updated_at: created(),
        created_at: created(),
        last_used_at: created(),
        idle_timeout: None,
        persistent: false,
        idle_action: Default::default(),
        owner_container: None,
    }
}

/// The lease holder of [`Harness::context`].
const CONTEXT_HOLDER: &str = "reconcile-test";

struct Harness {
    runtime: Arc<FakeRuntime>,
    store: Arc<FakeStore>,
    clock: Arc<ManualClock>,
    metrics: Arc<Metrics>,
    config: ControllerConfig,
}

impl Harness {
    fn new() -> Self {
        let mut config = ControllerConfig::new(Deployment::parse("test").unwrap());
        config.grace = Duration::from_secs(180);
        config.concurrency = 2;
        Self {
            runtime: Arc::new(FakeRuntime::default()),
            store: Arc::new(FakeStore::default()),
            clock: Arc::new(ManualClock::new(created() + chrono::Duration::seconds(10))),
            metrics: Arc::new(Metrics::new()),
            config,
        }
    }

    fn controller(&self) -> Controller {
        Controller::with_engines(
            self.runtime.clone(),
            self.store.clone(),
            FAKE_ENGINES,
            self.config.clone(),
            self.clock.clone(),
            self.metrics.clone(),
        )
    }

    /// A context that leads (for calling `reconcile` directly): it holds
    /// the store's lease for a day unless [`Harness::step_down`] ends it.
    fn context(&self) -> Arc<Context> {
        let ctx = self.controller().ctx;
        let day = Duration::from_secs(86_400);
        let term = self.store.steal_lease(CONTEXT_HOLDER, day);
        ctx.fence.grant(term, tokio::time::Instant::now() + day);
        ctx
    }

    /// What a relist does for the reaping breaker: one look at the fleet
    /// (a hundred sandboxes, none missing), at the injected clock's now.
    fn look(&self, ctx: &Context) {
        ctx.breaker.look(
            &ctx.config.breaker,
            &Default::default(),
            100,
            &Default::default(),
            self.clock.now(),
        );
    }

    /// Ends the lease [`Harness::context`] took, so that a controller can lead.
    async fn step_down(&self) {
        let (holder, term) = self.store.lease_of().expect("a lease");
        assert_eq!(holder, CONTEXT_HOLDER);
        self.store.release_lease(&holder, term).await.unwrap();
    }

    /// The containers of `sandbox` as (id, instance label).
    /// Names of the deployment's networks, sorted.
    async fn networks(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .runtime
            .networks(&self.config.deployment)
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        names.sort();
        names
    }

    fn containers(&self, sandbox: &SandboxId) -> Vec<(ContainerId, String)> {
        self.runtime
            .containers_of(sandbox)
            .into_iter()
            .map(|(id, c)| (id, c.labels.instance))
            .collect()
    }

    /// The one container of `sandbox` and the status entry published for
    /// it, asserting they belong together.
    fn published(&self, sandbox: &SandboxId) -> (ContainerId, crate::domain::ServiceStatus) {
        let containers = self.containers(sandbox);
        assert_eq!(containers.len(), 1, "one container: {containers:?}");
        let status = self.store.status_of(sandbox).expect("a status row");
        assert_eq!(status.phase, Phase::Ready, "{}", status.message);
        let service = status.services[ENGINE.as_str()].clone();
        assert_eq!(service.instance, containers[0].1);
        (containers[0].0.clone(), *service)
    }

    fn metric(&self, line_start: &str) -> f64 {
        let text = self.metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {line_start} in\n{text}"))
    }
}

use crate::domain::id::ContainerId;

// ---------------------------------------------------------------------------
// reconcile
// ---------------------------------------------------------------------------

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
    let deadline = crate::engine::Engine::readiness_deadline(&FakeEngine);
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
    assert_eq!(ctx.gone.len(), 0, "a sandbox fully gone is forgotten");
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
    assert_eq!(ctx.gone.len(), 0, "a row that exists is not gone");

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
    let image = h.config.images.image_for(&FakeEngine, true);
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
        ctx.crash_loops.forget(&id("a"));
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
        ctx.crash_loops.forget(&id("a"));
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

// ---------------------------------------------------------------------------
// The controller: queue, watches and relists around reconcile
// ---------------------------------------------------------------------------

/// Runs the controller until `stop` is dropped or sent.
fn start(
    controller: Controller,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        controller
            .run(async {
                let _ = rx.await;
            })
            .await
            .expect("controller runs");
    });
    (tx, task)
}

/// Waits (in virtual time) until `f` holds, up to a minute.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within a minute: {what}");
}

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

// ---------------------------------------------------------------------------
// Owner containers, persistent volumes, images that lack a feature
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_sandbox_whose_owner_container_vanished_is_released_once_the_grace_runs_out() {
    let h = Harness::new();
    let ctx = h.context();
    h.runtime.set_agent(
        "agent-1",
        Some(crate::domain::container::RunState {
            running: true,
            ..Default::default()
        }),
    );
    let mut r = row("a");
    r.owner_container = Some("agent-1".into());
    h.store.put_desired(r);
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    h.published(&id("a"));

    h.runtime.set_agent("agent-1", None);
    // Grace from the row's last change.
    let updated = created();
    let Next::After(wait) = reconcile(&ctx, &id("a")).await.unwrap() else {
        panic!("a missing owner is looked at again once its grace runs out");
    };
    assert_eq!(
        ctx.clock.now() + chrono::Duration::from_std(wait).unwrap(),
        updated + chrono::Duration::from_std(h.config.grace).unwrap()
    );
    h.clock.advance(chrono::Duration::from_std(wait).unwrap());
    reconcile(&ctx, &id("a")).await.unwrap();
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Terminating);
    assert!(status.message.contains("agent-1"), "{}", status.message);
    assert!(h.containers(&id("a")).is_empty());
}

#[tokio::test]
async fn a_persistent_sandbox_keeps_its_volume_until_its_row_is_deleted() {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    let volume = h.runtime.containers()[&container]
        .spec
        .volume
        .clone()
        .expect("a data volume");
    assert_eq!(h.runtime.volume_names(), std::slice::from_ref(&volume.name));
    let spec = &h.runtime.containers()[&container].spec;
    assert!(
        spec.tmpfs.iter().all(|t| t.path != volume.path),
        "the data directory is the volume, not a tmpfs"
    );

    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.runtime.volume_names(),
        std::slice::from_ref(&volume.name),
        "kept while its container waits out the grace window"
    );
    h.clock.advance(chrono::Duration::seconds(600));
    h.look(&ctx);
    reconcile(&ctx, &id("a")).await.unwrap();
    assert!(h.containers(&id("a")).is_empty());
    assert!(
        h.runtime.volume_names().is_empty(),
        "the volume went with the row"
    );
}

#[tokio::test]
async fn a_persistent_sandboxs_volume_without_containers_is_kept_for_the_grace_window_from_when_its_row_was_seen_gone(
) {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    // Its container is gone (say, removed by hand), then its row.
    h.runtime
        .remove(&container, Duration::from_secs(1))
        .await
        .unwrap();
    h.store.delete_desired(&id("a"));
    h.clock.advance(chrono::Duration::hours(1));

    assert_eq!(
        reconcile(&ctx, &id("a")).await.unwrap(),
        Next::After(Duration::from_secs(180))
    );
    assert_eq!(h.runtime.volume_names().len(), 1, "the data is kept");
    h.clock.advance(chrono::Duration::seconds(180));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert!(h.runtime.volume_names().is_empty());
    assert_eq!(ctx.gone.len(), 0);
}

#[tokio::test]
async fn a_rotation_to_an_image_that_lacks_the_feature_fails_without_touching_the_container() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (before, _) = h.published(&id("a"));
    let image = h.config.images.image_for(&FakeEngine, true);
    h.runtime.label_image(
        &image,
        std::collections::HashMap::from([(
            super::image::FEATURES_LABEL.to_owned(),
            "other".to_owned(),
        )]),
    );
    let mut r = row("a");
    r.features = BTreeMap::from([(ENGINE, ["alpha".to_owned()].into())]);
    h.store.put_desired(r);
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(err.to_string().contains(&image), "{err}");
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert_eq!(
        h.containers(&id("a"))[0].0,
        before,
        "the container was kept"
    );
    assert!(
        !status.services.is_empty(),
        "its credentials stay published"
    );
}

// ---------------------------------------------------------------------------
// Rotation builds before it destroys
// ---------------------------------------------------------------------------

/// Row `name` asking for the fake engine's feature `alpha`.
fn with_alpha(name: &str) -> DesiredSandbox {
    let mut r = row(name);
    r.features = BTreeMap::from([(ENGINE, ["alpha".to_owned()].into())]);
    r
}

/// The fake container `id`.
fn fake(h: &Harness, id: &ContainerId) -> crate::testing::FakeContainer {
    h.runtime.containers()[id].clone()
}

#[tokio::test]
async fn a_rotation_switches_to_the_new_container_under_the_engines_name_and_alias() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let canonical = fake(&h, &old).name;

    h.store.put_desired(with_alpha("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let (new, after) = h.published(&id("a"));
    assert_ne!(new, old, "a new container");
    assert_ne!(after.password, before.password, "fresh credentials");
    assert_eq!(after.available_extensions, ["alpha"]);
    let c = fake(&h, &new);
    assert_eq!(c.name, canonical, "it took the engine's container name");
    assert_eq!(c.spec.aliases, [ENGINE.as_str()], "and its network alias");
    assert_eq!(
        after.host_port, c.host_port,
        "the host port it was bound to when it took the alias is published"
    );
    assert_eq!(after.host, before.host, "the same endpoint");
    assert_eq!(h.metric("sandboxd_rotations_total{engine=\"fakedb\"}"), 1.0);
    // Settled: nothing left to switch.
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(h.published(&id("a")).1, after);
}

#[tokio::test]
async fn in_the_shared_network_layout_a_rotation_hands_over_the_container_name_clients_use() {
    let mut h = Harness::new();
    h.config.network = crate::config::NetworkLayout::Shared {
        name: "shared".into(),
    };
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    assert_eq!(before.host, fake(&h, &old).name, "clients use the name");

    h.store.put_desired(with_alpha("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert_ne!(new, old);
    assert_eq!(after.host, before.host);
    let c = fake(&h, &new);
    assert_eq!(c.name, before.host, "the new container took the name");
    assert!(c.spec.aliases.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_container_that_never_becomes_ready_leaves_the_old_one_serving() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));

    // The new container's probe never passes.
    h.runtime.faults.set(RuntimeOp::Exec, Fault::FailAlways);
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    let ReconcileError::Provision(message) = &err else {
        panic!("expected a provisioning failure, got {err}");
    };
    assert!(message.starts_with("fakedb: "), "{message}");
    assert!(message.contains("did not become ready"), "{message}");
    assert!(
        message.contains("the running container keeps serving the published credentials"),
        "{message}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert_eq!(&status.message, message);
    assert_eq!(
        *status.services[ENGINE.as_str()],
        before,
        "the old credentials stay published"
    );
    assert_eq!(
        h.containers(&id("a")),
        [(old.clone(), before.instance.clone())],
        "the new container was removed, the old one kept"
    );
    assert_eq!(
        fake(&h, &old).state,
        crate::domain::container::ContainerState::Running
    );

    // Retried: the same failure never touches the old container.
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(err.to_string().contains("did not become ready"), "{err}");
    assert_eq!(h.containers(&id("a")), [(old, before.instance.clone())]);

    h.runtime.faults.clear(RuntimeOp::Exec);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (_, after) = h.published(&id("a"));
    assert_ne!(after.instance, before.instance, "rotated once it could");
}

#[tokio::test]
async fn a_new_container_that_fails_to_start_leaves_the_old_one_serving() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));

    h.runtime.faults.set(RuntimeOp::Create, Fault::FailAlways);
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(
        err.to_string().contains("the rotation was abandoned"),
        "{err}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert_eq!(*status.services[ENGINE.as_str()], before);
    assert_eq!(h.containers(&id("a")), [(old, before.instance)]);
}

#[tokio::test]
async fn a_rotation_stopped_before_its_new_container_was_published_keeps_the_old_one() {
    let h = Harness::new();
    h.store.put_desired(row("a"));
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));

    // The write naming the new container fails (the first write, the
    // provisioning status, goes through): as if the controller stopped
    // just before publishing it.
    h.store
        .faults
        .set(StoreOp::WriteStatus, Fault::FailOnceAfter(1));
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&h.context(), &id("a")).await.unwrap_err();
    assert!(err.to_string().contains("could not be published"), "{err}");
    let containers = h.containers(&id("a"));
    assert_eq!(
        containers.len(),
        2,
        "the new one is left to the next look: {containers:?}"
    );
    assert_eq!(
        *h.store.status_of(&id("a")).unwrap().services[ENGINE.as_str()],
        before,
        "the status still names the old container: it is the live one"
    );

    // A restarted controller keeps the published (old) container, removes
    // the unpublished one and rotates again.
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert!(containers.iter().all(|(c, _)| c != &new));
    assert_ne!(after.instance, before.instance);
    assert_ne!(new, old);
}

#[tokio::test]
async fn a_rotation_stopped_after_its_new_container_was_published_finishes_the_switch() {
    let h = Harness::new();
    h.store.put_desired(row("a"));
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let canonical = fake(&h, &old).name;

    // Removing the old container fails once: as if the controller stopped
    // right after publishing the new one.
    h.runtime.faults.set(RuntimeOp::Remove, Fault::Fail(1));
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&h.context(), &id("a")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("the next attempt finishes the switch"),
        "{err}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    let published = status.services[ENGINE.as_str()].clone();
    assert_ne!(
        published.instance, before.instance,
        "the new container is published"
    );
    let containers = h.containers(&id("a"));
    assert_eq!(containers.len(), 2, "{containers:?}");
    let (new, _) = containers
        .iter()
        .find(|(_, instance)| instance == &published.instance)
        .expect("the published container exists")
        .clone();
    assert_ne!(
        fake(&h, &new).name,
        canonical,
        "still under its temporary name"
    );

    // A restarted controller removes the old container and finishes.
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (kept, after) = h.published(&id("a"));
    assert_eq!(kept, new);
    assert_eq!(
        after.password, published.password,
        "the published credentials stay"
    );
    let c = fake(&h, &new);
    assert_eq!(c.name, canonical);
    assert_eq!(c.spec.aliases, [ENGINE.as_str()]);
    assert_eq!(after.host_port, c.host_port);
}

#[tokio::test]
async fn a_persistent_sandbox_rotates_on_its_volume_after_removing_the_old_container() {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r.clone());
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let volume = fake(&h, &old).spec.volume.expect("a data volume");

    let mut r2 = with_alpha("a");
    r2.persistent = true;
    h.store.put_desired(r2);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert_ne!(new, old);
    assert_ne!(after.password, before.password);
    assert_eq!(fake(&h, &new).spec.volume, Some(volume), "the same data");
    assert_eq!(after.host_port, before.host_port, "it kept the host port");
}

#[tokio::test]
async fn a_persistent_sandboxs_failed_rotation_restores_the_old_credentials_on_its_volume() {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let volume = fake(&h, &old).spec.volume.expect("a data volume");

    // The new container fails once it exists (after the old one went).
    h.runtime
        .faults
        .set(RuntimeOp::PublishedPort, Fault::Fail(1));
    let mut r2 = with_alpha("a");
    r2.persistent = true;
    h.store.put_desired(r2);
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(
        err.to_string().contains("the rotation was rolled back"),
        "{err}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert!(
        status
            .message
            .ends_with("restored (a persistent sandbox's on its volume, with its data)"),
        "{}",
        status.message
    );
    let containers = h.containers(&id("a"));
    let [(restored, instance)] = containers.as_slice() else {
        panic!("one container: {containers:?}");
    };
    let published = &status.services[ENGINE.as_str()];
    assert_eq!(
        &published.instance, instance,
        "the restored container is published"
    );
    assert_eq!(
        published.password, before.password,
        "with the old credentials"
    );
    assert_eq!(
        published.host_port, before.host_port,
        "on the old host port"
    );
    let c = fake(&h, restored);
    assert_eq!(c.spec.volume, Some(volume), "on the same data");
    assert!(c.labels.features.is_empty(), "with the old features");

    // A later attempt rotates from the restored container.
    reconcile(&ctx, &id("a")).await.unwrap();
    let (_, after) = h.published(&id("a"));
    assert_ne!(after.password, before.password);
    assert_eq!(after.available_extensions, ["alpha"]);
}

#[tokio::test]
async fn a_runtime_that_cannot_rename_rotates_in_place_and_a_failed_rotation_restores_the_old_credentials(
) {
    let mut h = Harness::new();
    h.config.backend = crate::config::Backend::Swarm;
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let name = fake(&h, &old).name;

    // The new container fails once it exists (after the old one went).
    h.runtime
        .faults
        .set(RuntimeOp::PublishedPort, Fault::Fail(1));
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(
        err.to_string().contains("the rotation was rolled back"),
        "{err}"
    );
    let containers = h.containers(&id("a"));
    let [(restored, instance)] = containers.as_slice() else {
        panic!("one container: {containers:?}");
    };
    assert_ne!(restored, &old, "the old container went first");
    let status = h.store.status_of(&id("a")).unwrap();
    let published = &status.services[ENGINE.as_str()];
    assert_eq!(&published.instance, instance);
    assert_eq!(published.password, before.password, "the old credentials");
    assert_eq!(fake(&h, restored).name, name, "under its name");

    // The next attempt rotates in place, never renaming.
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert_ne!(after.password, before.password);
    assert_eq!(after.available_extensions, ["alpha"]);
    assert_eq!(fake(&h, &new).name, name);
    assert_eq!(h.containers(&id("a")).len(), 1);
}

// ---------------------------------------------------------------------------
// Deletion safety: an empty or restored state database reaps nothing at once
// ---------------------------------------------------------------------------

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
    let term = previous.fence.check().unwrap();
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
async fn an_engine_that_keeps_dying_is_healed_with_back_off_then_failed_as_a_crash_loop_until_its_row_changes(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let policy = h.config.crash_loop;
    let mut waits = Vec::new();
    for _ in 0..policy.limit {
        let (container, _) = h.published(&id("a"));
        h.runtime.kill(&container, false);
        match reconcile(&ctx, &id("a")).await.unwrap() {
            Next::Idle => waits.push(0),
            Next::After(wait) => {
                assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Healing));
                waits.push(wait.as_secs());
                h.clock.advance(chrono::Duration::from_std(wait).unwrap());
                reconcile(&ctx, &id("a")).await.unwrap();
            }
        }
    }
    // The first heal at once, then 2, 4, 8 and 16 s after the previous one.
    assert_eq!(waits, [0, 2, 4, 8, 16]);
    let (container, service) = h.published(&id("a"));
    assert_eq!(service.heals, policy.limit as u32);

    // One death too many within the window: not re-created, failed.
    h.runtime.kill(&container, false);
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert!(status.message.contains("crash loop"), "{}", status.message);
    h.clock.advance(chrono::Duration::seconds(60));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.store.phase_of(&id("a")),
        Some(Phase::Failed),
        "until the row changes"
    );

    // The row changes: healed at once.
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.published(&id("a"));
}

// ---------------------------------------------------------------------------
// One leader: the lease and its fence
// ---------------------------------------------------------------------------

/// Puts a row for each of `names` and waits (in virtual time) until every
/// one is ready.
async fn all_ready(h: &Harness, names: &[String]) {
    for n in names {
        h.store.put_desired(row(n));
    }
    until("all ready", || {
        names
            .iter()
            .all(|n| h.store.phase_of(&id(n)) == Some(Phase::Ready))
    })
    .await;
}

/// `n` sandbox names starting with `prefix`.
fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

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

// ---------------------------------------------------------------------------
// The reaping circuit breaker
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_truncated_desired_table_pauses_reaping_until_an_operator_resumes_it() {
    let mut h = Harness::new();
    h.config.grace = Duration::ZERO;
    let controller = h.controller();
    let probes = controller.probes();
    let (stop, task) = start(controller);
    let names = names("s", 6);
    all_ready(&h, &names).await;

    h.store.truncate_desired();
    tokio::time::sleep(Duration::from_secs(120)).await;
    for n in &names {
        assert_eq!(h.containers(&id(n)).len(), 1, "{n} is kept while paused");
    }
    assert!(h.store.reaping_paused(), "the pause is recorded");
    assert_eq!(h.metric("sandboxd_reaping_paused"), 1.0);
    assert_eq!(h.metric("sandboxd_sandboxes_row_missing"), 6.0);
    let why = probes.ready().await.unwrap_err();
    assert!(why.contains("reaping paused: 6 of 6 sandboxes"), "{why}");
    assert!(why.contains("sandboxd resume-reaping"), "{why}");

    h.store.resume_reaping();
    until("all six reaped after the resume", || {
        names.iter().all(|n| h.containers(&id(n)).is_empty())
    })
    .await;
    assert_eq!(h.metric("sandboxd_reaping_paused"), 0.0);
    assert!(probes.ready().await.is_ok());
    drop(stop);
    let _ = task.await;
}

#[tokio::test(start_paused = true)]
async fn deleting_one_row_among_many_reaps_it_without_pausing() {
    let mut h = Harness::new();
    h.config.grace = Duration::ZERO;
    let (stop, task) = start(h.controller());
    all_ready(&h, &["a".into(), "b".into(), "c".into()]).await;
    h.store.delete_desired(&id("a"));
    until("a reaped", || h.containers(&id("a")).is_empty()).await;
    assert_eq!(h.containers(&id("b")).len(), 1);
    assert!(!h.store.reaping_paused());
    drop(stop);
    let _ = task.await;
}

#[tokio::test(start_paused = true)]
async fn releasing_every_sandbox_row_by_row_reaps_them_all_without_pausing() {
    let mut h = Harness::new();
    h.config.grace = Duration::ZERO;
    let (stop, task) = start(h.controller());
    let names = names("r", 6);
    all_ready(&h, &names).await;
    // DELETE, one row at a time: each leaves a tombstone.
    for n in &names {
        h.store.delete_desired(&id(n));
    }
    until("all six reaped", || {
        names.iter().all(|n| h.containers(&id(n)).is_empty())
    })
    .await;
    assert!(!h.store.reaping_paused());
    assert_eq!(h.metric("sandboxd_reaping_paused"), 0.0);
    drop(stop);
    let _ = task.await;
}

// ---------------------------------------------------------------------------
// State database identity and incarnations
// ---------------------------------------------------------------------------

/// Another state database's identity.
const THEIRS: &str = "7b7b7b7b-0000-4000-8000-000000000002";

#[tokio::test(start_paused = true)]
async fn another_state_databases_container_is_never_reaped_or_healed_and_a_row_wanting_its_name_fails_saying_why(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    // It is another state database's now, and this one knows nothing of it.
    h.runtime
        .set_label(&container, crate::domain::labels::STATE_ID, THEIRS);
    h.store.delete_desired(&id("a"));
    let term = ctx.fence.check().unwrap();
    h.store.delete_status(&id("a"), term).await.unwrap();
    h.runtime.kill(&container, false);
    h.clock.advance(chrono::Duration::hours(1));

    // Dead and long past every grace window, counted from its creation
    // and from when its row was seen gone: neither reaped nor healed.
    reconcile(&ctx, &id("a")).await.unwrap();
    h.clock.advance(chrono::Duration::seconds(181));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let left = h.runtime.containers_of(&id("a"));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, container, "never reaped");
    assert_eq!(
        left[0].1.state,
        crate::domain::container::ContainerState::Exited,
        "never healed"
    );
    assert!(h.store.status_of(&id("a")).is_none());
    assert_eq!(
        h.networks().await.len(),
        1,
        "the network its container is on stays"
    );

    // This database asks for the same sandbox: the name is taken.
    h.store.put_desired(row("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Provision(_)), "{err}");
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    for fragment in [
        "held by container",
        THEIRS,
        crate::testing::FAKE_STATE_ID,
        "docker rm -f",
    ] {
        assert!(
            status.message.contains(fragment),
            "{fragment}: {}",
            status.message
        );
    }
    assert!(status.services.is_empty());
    let left = h.runtime.containers_of(&id("a"));
    assert_eq!(left.len(), 1, "nothing created beside it");
    assert_eq!(left[0].0, container, "not replaced");

    // Every relist counts it.
    h.step_down().await;
    let (stop, task) = start(h.controller());
    until("the foreign container is counted", || {
        h.metric("sandboxd_foreign_containers") == 1.0
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_re_inserted_row_never_inherits_the_earlier_incarnations_container_or_credentials() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, old_service) = h.published(&id("a"));
    let old_incarnation = h.store.incarnation_of(&id("a")).unwrap();

    // Released: its container waits out the grace window.
    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Terminating));
    assert_eq!(h.containers(&id("a"))[0].0, old);

    // Inserted again, well within the grace window.
    h.store.put_desired(row("a"));
    let incarnation = h.store.incarnation_of(&id("a")).unwrap();
    assert_ne!(incarnation, old_incarnation);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, service) = h.published(&id("a"));
    assert_ne!(new, old);
    assert!(
        !h.runtime.containers().contains_key(&old),
        "torn down at once"
    );
    assert_ne!(service.password.expose(), old_service.password.expose());
    assert_ne!(service.instance, old_service.instance);
    assert_eq!(
        h.runtime.containers()[&new].labels.incarnation.as_deref(),
        Some(incarnation.as_str())
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.incarnation, Some(incarnation));
    assert_eq!(status.observed_generation, 1);
    assert_eq!(h.metric("sandboxd_reaps_total{reason=\"superseded\"}"), 1.0);
}

#[tokio::test]
async fn a_re_inserted_persistent_row_never_mounts_the_earlier_incarnations_data() {
    let h = Harness::new();
    let ctx = h.context();
    let persistent = || {
        let mut r = row("a");
        r.persistent = true;
        r
    };
    h.store.put_desired(persistent());
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, _) = h.published(&id("a"));
    let volume = h.runtime.containers()[&old].spec.volume.clone().unwrap();
    let label = |labels: Option<std::collections::HashMap<String, String>>| {
        labels.and_then(|l| l.get(crate::domain::labels::INCARNATION).cloned())
    };
    let first = h.store.incarnation_of(&id("a")).unwrap();
    assert_eq!(
        label(h.runtime.volume_labels(&volume.name)).as_deref(),
        Some(first.as_str())
    );

    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.put_desired(persistent());
    let second = h.store.incarnation_of(&id("a")).unwrap();
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, _) = h.published(&id("a"));
    assert_eq!(
        h.runtime.containers()[&new]
            .spec
            .volume
            .as_ref()
            .map(|v| &v.name),
        Some(&volume.name)
    );
    assert_eq!(
        label(h.runtime.volume_labels(&volume.name)).as_deref(),
        Some(second.as_str()),
        "the earlier incarnation's volume was removed and a fresh one made"
    );
}

#[tokio::test(start_paused = true)]
async fn a_template_is_built_once_in_the_background_and_a_failed_build_is_retried_after_a_minute() {
    let h = Harness::new();
    let ctx = h.context();
    let postgres = crate::engine::lookup("postgres").unwrap();
    let key = template::TemplateKey {
        engine: postgres.name(),
        image: "sandboxd/postgres:17".into(),
        image_id: "sha256:0123456789abcdef".into(),
        features: BTreeSet::new(),
    };
    let settle = || tokio::time::sleep(Duration::from_millis(10));
    h.runtime.faults.set(RuntimeOp::TemplateJob, Fault::Fail(1));
    assert_eq!(
        ctx.templates.lookup(&ctx, postgres, &key),
        None,
        "a sandbox starts cold while its template is built"
    );
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 0, "the first job failed");
    assert_eq!(ctx.templates.lookup(&ctx, postgres, &key), None);
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 0, "not tried again at once");

    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(ctx.templates.lookup(&ctx, postgres, &key), None);
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 1, "tried again after a minute");
    let mounts = ctx
        .templates
        .lookup(&ctx, postgres, &key)
        .expect("the template is ready");
    let volume = mounts.data;
    assert_eq!(volume.name, "test-template-postgres-plain-0123456789ab");
    assert_eq!(volume.path, "/var/lib/postgresql/template");
    let binaries = mounts.binaries.expect("Postgres shares its binaries");
    assert_eq!(binaries.name, "test-binaries-postgres-plain-0123456789ab");
    assert_eq!(binaries.path, "/usr");
    assert!(
        h.runtime.volume_labels(&binaries.name).is_some(),
        "the job made the binaries volume"
    );
    assert_eq!(
        volume
            .labels
            .get("io.sandboxd.template")
            .map(String::as_str),
        Some("postgres")
    );
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 1, "built once");

    ctx.templates.forget(&volume.name);
    assert_eq!(ctx.templates.lookup(&ctx, postgres, &key), None);
    settle().await;
    assert_eq!(
        h.runtime.template_jobs(),
        2,
        "a forgotten template is checked again"
    );
}

// ---------------------------------------------------------------------------
// warm pool
// ---------------------------------------------------------------------------

fn with_pool(h: &mut Harness) {
    h.config.warm_pool = BTreeMap::from([(
        crate::domain::pool::PoolKey {
            engine: ENGINE,
            features: Default::default(),
        },
        1,
    )]);
}

fn pool_claims(h: &Harness, result: &str, kind: &str) -> f64 {
    let line = format!(
        "sandboxd_pool_claims_total{{engine=\"{}\",kind=\"{kind}\",result=\"{result}\"}}",
        ENGINE.as_str()
    );
    h.metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&line)?.trim().parse().ok())
        .unwrap_or(0.0)
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

// ---------------------------------------------------------------------------
// cost per relist and per converged row
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Admission: quotas and the host's memory budget
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Pause on idle, resume on use
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// checkpoints and resets
// ---------------------------------------------------------------------------

/// The reasons and details of `sandbox`'s recorded events.
fn checkpoint_events(h: &Harness, sandbox: &SandboxId) -> Vec<(String, Option<String>, String)> {
    h.store
        .events_of(sandbox)
        .into_iter()
        .map(|(e, _)| (e.reason.as_str().to_owned(), e.detail, e.message))
        .filter(|(r, d, _)| {
            r == "checkpointed"
                || r == "reset"
                || d.as_deref()
                    .is_some_and(|d| d == "checkpoint" || d == "reset")
        })
        .collect()
}

#[tokio::test]
async fn a_checkpoint_asked_of_a_ready_sandbox_is_taken_in_its_container_and_recorded_with_an_event(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    h.store.request_checkpoint(&id("a"), "before");
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "before").as_deref(),
        Some("ready")
    );
    let ran: Vec<String> = h
        .runtime
        .execs()
        .into_iter()
        .filter(|(c, _)| *c == container)
        .map(|(_, cmd)| cmd.join(" "))
        .collect();
    assert!(
        ran.iter().any(|c| c.starts_with("echo checkpoint before")),
        "{ran:?}"
    );
    let events = checkpoint_events(&h, &id("a"));
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "checkpointed");
    assert_eq!(events[0].1.as_deref(), Some("before"));
    assert!(events[0].2.contains("0.0 MiB"), "{}", events[0].2);

    // A reset to it, then one that fails: each recorded, in order.
    let back = h.store.request_reset(&id("a"), "before");
    let unknown = h.store.request_reset(&id("a"), "never-taken");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.store.reset_outcome(back), Some(Ok(())));
    let refused = h.store.reset_outcome(unknown).unwrap().unwrap_err();
    assert!(
        refused.contains("no ready checkpoint never-taken"),
        "{refused}"
    );
    let events = checkpoint_events(&h, &id("a"));
    let reasons: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(reasons, ["checkpointed", "reset", "failed"]);
    // The sandbox itself is untouched: the same container serves it.
    assert_eq!(h.published(&id("a")).0, container);
    assert_eq!(
        h.metric("sandboxd_checkpoint_seconds_count{op=\"checkpoint\",result=\"ok\"}"),
        1.0
    );
    assert_eq!(
        h.metric("sandboxd_checkpoint_seconds_count{op=\"reset\",result=\"error\"}"),
        1.0
    );
}

#[tokio::test]
async fn a_reset_whose_command_fails_is_marked_failed_with_the_engines_words_and_not_retried() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.request_checkpoint(&id("a"), "broken");
    reconcile(&ctx, &id("a")).await.unwrap();
    let request = h.store.request_reset(&id("a"), "broken");
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let why = h.store.reset_outcome(request).unwrap().unwrap_err();
    assert!(
        why.contains("fakedb: the reset failed: exit code 1: reset broken"),
        "{why}"
    );
    let execs = h.runtime.execs().len();
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.runtime.execs().len(), execs, "nothing is run again");
}

#[tokio::test]
async fn a_checkpoint_asked_before_the_sandbox_is_ready_waits_for_a_later_look() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    h.store.request_checkpoint(&id("a"), "early");
    // This reconcile provisions: the checkpoint waits, and asks for a look.
    assert_eq!(
        reconcile(&ctx, &id("a")).await.unwrap(),
        Next::After(Duration::from_secs(1))
    );
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "early").as_deref(),
        Some("requested")
    );
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "early").as_deref(),
        Some("ready")
    );
}

#[tokio::test]
async fn an_invalid_checkpoint_name_fails_without_running_anything() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let before = h.runtime.execs().len();
    h.store.request_checkpoint(&id("a"), "x; rm -rf /");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "x; rm -rf /").as_deref(),
        Some("failed")
    );
    assert_eq!(h.runtime.execs().len(), before);
}

#[tokio::test]
async fn checkpoints_and_resets_that_would_pass_the_memory_cap_are_refused_before_anything_is_copied(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.request_checkpoint(&id("a"), "fits");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "fits").as_deref(),
        Some("ready")
    );
    // The fake engine's checkpoint is 4096 bytes; the container is full.
    h.runtime.set_memory(1000 * 1024, 1024 * 1024);
    let before = h.runtime.execs().len();
    h.store.request_checkpoint(&id("a"), "full");
    let reset = h.store.request_reset(&id("a"), "fits");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.store.checkpoint_state(&id("a"), "full").as_deref(),
        Some("failed")
    );
    let why = h.store.reset_outcome(reset).unwrap().unwrap_err();
    assert!(why.contains("holds a copy of the checkpoint"), "{why}");
    assert!(why.contains("would not fit"), "{why}");
    let copied: Vec<String> = h.runtime.execs()[before..]
        .iter()
        .map(|(_, cmd)| cmd.join(" "))
        .filter(|c| c.starts_with("echo checkpoint") || c.starts_with("echo reset"))
        .collect();
    assert!(copied.is_empty(), "nothing copied or reset: {copied:?}");
    // The baseline needs no room: it empties the data.
    let baseline = h.store.request_reset(&id("a"), "baseline");
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.store.reset_outcome(baseline), Some(Ok(())));
}
