//! Shared fixtures for integration tests: a state database of its own per
//! test (see `state`), a unique deployment label per test, and a controller
//! running in the background.
#![allow(dead_code)]

mod state;

// benches/provision.rs takes this module too, and uses less of it.
#[allow(unused_imports)]
pub use state::{StatePostgres, StateStorage, STATE_LABEL};

use sandboxd::adapters::{DockerRuntime, PgStore};
use sandboxd::config::{ControllerConfig, Images};
use sandboxd::controller::Readiness;
use sandboxd::domain::clock::SystemClock;
use sandboxd::domain::container::ObservedContainer;
use sandboxd::domain::lease::LeasePolicy;
use sandboxd::domain::{Deployment, SandboxId};
use sandboxd::metrics::Metrics;
use sandboxd::ports::runtime::{Containers, Networks};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// Ten random lowercase letters and digits, for names of a test's own.
pub fn random_suffix() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    Alphanumeric
        .sample_string(&mut rand::rng(), 10)
        .to_lowercase()
}

impl TestEnv {
    /// Freezes the state Postgres (`docker pause`) for `d`: every
    /// connection stalls, nothing answers, then it goes on.
    pub async fn pause_state_database(&self, d: Duration) {
        let docker = |verb: &str| {
            std::process::Command::new("docker")
                .args([verb, self.state.own_server()])
                .output()
                .expect("run docker")
        };
        // runc gives up freezing a cgroup v1 whose processes keep forking
        // ("unable to freeze"), as a server does while its clients
        // reconnect on a loaded machine; it thaws it again, so try anew.
        let mut attempts = 0;
        let out = loop {
            let out = docker("pause");
            attempts += 1;
            let refused = String::from_utf8_lossy(&out.stderr).contains("unable to freeze");
            if out.status.success() || !refused || attempts == 10 {
                break out;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            out.status.success(),
            "docker pause the state database failed ({attempts} attempts): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(d).await;
        let out = docker("unpause");
        assert!(
            out.status.success(),
            "docker unpause the state database failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the state Postgres (`docker stop`: its address refuses every
    /// connection until [`TestEnv::start_state_database`]; start it with
    /// [`StateStorage::Restartable`] to keep its data and address).
    pub fn stop_state_database(&self) {
        self.state_server("stop");
    }

    /// Starts the state Postgres [`TestEnv::stop_state_database`] stopped.
    pub fn start_state_database(&self) {
        self.state_server("start");
    }

    fn state_server(&self, verb: &str) {
        let out = std::process::Command::new("docker")
            .args([verb, self.state.own_server()])
            .output()
            .expect("run docker");
        assert!(
            out.status.success(),
            "docker {verb} the state database failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Restarts the state Postgres (`docker restart`; start it with
    /// [`StateStorage::Restartable`] to keep its data and address).
    pub fn restart_state_database(&self) {
        let out = std::process::Command::new("docker")
            .args(["restart", "-t", "5", self.state.own_server()])
            .output()
            .expect("run docker");
        assert!(
            out.status.success(),
            "docker restart the state database failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One test's world: its own state database and deployment label.
pub struct TestEnv {
    /// Connections as the controller's role (`sandboxd`, not a superuser).
    pub pool: PgPool,
    /// The controller's URL.
    pub url: String,
    /// Connections as a superuser of the state database.
    pub admin_pool: PgPool,
    /// The superuser's URL.
    pub admin_url: String,
    pub deployment: Deployment,
    /// The Docker adapter the controller uses.
    pub runtime: Arc<DockerRuntime>,
    /// Raw Docker, for tests that act behind sandboxd's back.
    pub docker: bollard::Docker,
    state: StatePostgres,
}

impl TestEnv {
    /// A fresh, migrated state database (on the test process's shared
    /// server) and a unique deployment.
    pub async fn new() -> Self {
        Self::on(StatePostgres::migrated().await, false).await
    }

    /// Like [`TestEnv::new`], on a state Postgres server of its own with
    /// its data where `storage` says: for a test that stops, pauses or
    /// restarts it, or acts on every session of a role.
    pub async fn new_with(storage: StateStorage) -> Self {
        Self::on(StatePostgres::start_with(storage).await, true).await
    }

    /// [`TestEnv::new_with`], its server started with `settings` (`-c
    /// name=value` each: e.g. a small NOTIFY queue).
    pub async fn new_with_settings(storage: StateStorage, settings: &[(&str, &str)]) -> Self {
        Self::on(
            StatePostgres::start_with_settings(storage, settings).await,
            true,
        )
        .await
    }

    /// The world on `state`, which is migrated first if `migrate`.
    async fn on(state: StatePostgres, migrate: bool) -> Self {
        let store = PgStore::connect(&state.url, 8, sandboxd::engine::REGISTRY)
            .await
            .expect("connect the test state database");
        if migrate {
            store
                .migrate()
                .await
                .expect("migrate the test state database");
        }
        let admin_pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&state.admin_url)
            .await
            .expect("connect to the test state database as its superuser");
        let runtime = DockerRuntime::connect().await.expect("docker");
        let docker = bollard::Docker::connect_with_local_defaults()
            .expect("docker")
            .negotiate_version()
            .await
            .expect("docker version");
        Self {
            pool: store.pool().clone(),
            url: state.url.clone(),
            admin_pool,
            admin_url: state.admin_url.clone(),
            deployment: Deployment::parse(&format!("t{}", random_suffix())).unwrap(),
            runtime: Arc::new(runtime),
            docker,
            state,
        }
    }

    /// The URL of the state database for another role (`user`, `password`).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let (_, host) = self
            .url
            .split_once('@')
            .expect("the state URL has user information");
        format!("postgres://{user}:{password}@{host}")
    }

    /// Creates the login role `name` as the superuser (roles are
    /// cluster-wide; the controller's role cannot create them) and returns
    /// a pool connected as it and its URL. Tests on the shared server that
    /// name the same role share it (it has the same password everywhere);
    /// each grants it privileges in its own database only.
    pub async fn create_login_role(&self, name: &str) -> (PgPool, String) {
        static PASSWORD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let password = PASSWORD.get_or_init(|| random_suffix() + &random_suffix());
        let created = sqlx::query(&format!(
            "CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'"
        ))
        .execute(&self.admin_pool)
        .await;
        if let Err(e) = created {
            // 42710: it exists; 23505: another test created it just now.
            let code = e.as_database_error().and_then(|d| d.code());
            if !matches!(code.as_deref(), Some("42710" | "23505")) {
                panic!("create role {name}: {e}");
            }
        }
        let url = self.url_as(name, password);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect as {name}: {e}"));
        (pool, url)
    }

    /// An orchestrator of this test's database that reaches only its own
    /// rows (`sandbox_grant_orchestrator(role, true)`), called `prefix_`
    /// and the deployment: its name and a pool connected as it.
    pub async fn own_rows_orchestrator(&self, prefix: &str) -> (String, PgPool) {
        let role = format!("{prefix}_{}", self.deployment.as_str());
        let (pool, _) = self.create_login_role(&role).await;
        sqlx::query("SELECT sandbox_grant_orchestrator($1, true)")
            .bind(&role)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("grant {role}: {e}"));
        (role, pool)
    }

    /// Controller configuration for tests: local images, grace 0.
    pub fn config(&self) -> ControllerConfig {
        let mut c = ControllerConfig::new(self.deployment.clone());
        c.images = Images::new(&[test_images()], &[test_features_images()]).expect("test images");
        c.grace = Duration::ZERO;
        c.relist_interval = Duration::from_secs(5);
        c.stop_timeout = Duration::from_secs(1);
        c.pull_timeout = Duration::from_secs(5);
        c.limits.memory_bytes = 256 * 1024 * 1024;
        c.limits.tmpfs_bytes = 256 * 1024 * 1024;
        c.lease = LeasePolicy::new(TEST_LEASE).expect("test lease");
        // A template job per test deployment would cost every test an
        // initdb; tests/integration/templates.rs turns them on.
        c.templates = false;
        // Capped persistent volumes' files of this test's own, detached
        // and removed when it ends.
        c.disks.dir = self.disks_dir();
        c
    }

    /// Where this test's capped persistent volumes keep their files.
    pub fn disks_dir(&self) -> String {
        format!("/tmp/sandboxd-disks-{}", self.deployment)
    }

    /// Starts a controller with `config` in the background.
    pub fn start(&self, config: ControllerConfig) -> RunningController {
        self.start_with_store(
            config,
            PgStore::with_engines(self.pool.clone(), sandboxd::engine::REGISTRY),
        )
    }

    /// Starts a controller whose state database connections the server
    /// bounds by `config.store_timeout`, as `sandboxd run` does.
    pub async fn start_bounded(&self, config: ControllerConfig) -> RunningController {
        let store = PgStore::connect_with_engines(
            &self.url,
            8,
            config.store_timeout,
            sandboxd::engine::REGISTRY,
        )
        .await
        .expect("connect a bounded store");
        self.start_with_store(config, store)
    }

    /// Starts a controller on `store` in the background.
    pub fn start_with_store(&self, config: ControllerConfig, store: PgStore) -> RunningController {
        self.start_on(self.runtime.clone(), config, store)
    }

    /// Starts a controller with `config` on the Swarm backend of the Swarm
    /// this engine manages, sandboxd on the host reaching each task at the
    /// port it publishes on its node (`--swarm-publish host`), on this
    /// environment's state database; returns it and its runtime.
    pub async fn start_on_swarm(
        &self,
        mut config: ControllerConfig,
    ) -> (RunningController, Arc<sandboxd::adapters::SwarmRuntime>) {
        use sandboxd::config::{Backend, SwarmPublish};
        config.backend = Backend::Swarm;
        config.swarm_publish = SwarmPublish::Host;
        let config = config
            .for_swarm()
            .expect("a configuration the Swarm backend takes");
        let node = DockerRuntime::connect().await.expect("docker");
        let runtime = Arc::new(
            sandboxd::adapters::SwarmRuntime::connect(
                node,
                true,
                false,
                sandboxd::config::DEFAULT_SWARM_HELPER_IMAGE.to_owned(),
            )
            .await
            .expect("the engine is a Swarm manager with a closed gateway bridge"),
        );
        let controller = self.start_on(
            runtime.clone(),
            config,
            PgStore::with_engines(self.pool.clone(), sandboxd::engine::REGISTRY),
        );
        (controller, runtime)
    }

    /// Starts a controller on `runtime` and `store` in the background.
    pub fn start_on(
        &self,
        runtime: Arc<dyn sandboxd::ports::Runtime>,
        config: ControllerConfig,
        store: PgStore,
    ) -> RunningController {
        let metrics = Arc::new(Metrics::new());
        let controller = sandboxd::cli::controller(
            runtime,
            Arc::new(store),
            config,
            Arc::new(SystemClock),
            metrics.clone(),
        );
        let readiness = controller.readiness();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            controller
                .run(async {
                    let _ = rx.await;
                })
                .await
                .expect("controller runs");
        });
        RunningController {
            stop: Some(tx),
            handle,
            readiness,
            metrics,
        }
    }

    /// This deployment's containers, optionally for one sandbox.
    pub async fn containers(&self, id: Option<&SandboxId>) -> Vec<ObservedContainer> {
        self.runtime
            .list(&self.deployment, id)
            .await
            .expect("list containers")
    }

    /// The names of the containers on `network` (none if it does not exist).
    pub async fn network_members(&self, network: &str) -> Vec<String> {
        self.runtime
            .network_members(network)
            .await
            .expect("inspect network")
            .unwrap_or_default()
    }
}

/// Removes every container carrying `label` (`key=value`) with the docker
/// CLI: synchronous, so it works in `Drop`, even while a test panics.
pub fn remove_containers_labelled(label: &str) {
    remove_labelled(&["ps", "-aq"], &["rm", "-f", "-v"], label);
}

/// Removes every network carrying `label` (`key=value`), once the
/// containers on it are gone.
pub fn remove_networks_labelled(label: &str) {
    remove_labelled(&["network", "ls", "-q"], &["network", "rm"], label);
}

/// Removes every volume carrying `label` (`key=value`), once the
/// containers using it are gone.
pub fn remove_volumes_labelled(label: &str) {
    remove_labelled(&["volume", "ls", "-q"], &["volume", "rm", "-f"], label);
}

/// Removes every Swarm service carrying `label` (`key=value`); its tasks'
/// containers go after it, asynchronously.
pub fn remove_services_labelled(label: &str) {
    remove_labelled(&["service", "ls", "-q"], &["service", "rm"], label);
}

/// Removes every Swarm secret carrying `label` (`key=value`), once the
/// services using it are gone.
pub fn remove_secrets_labelled(label: &str) {
    remove_labelled(&["secret", "ls", "-q"], &["secret", "rm"], label);
}

/// Removes the Swarm services carrying `label` (`key=value`), waits (up to
/// 30 s) until their tasks' containers are gone, then removes what they
/// leave: containers and networks carrying `label`, secrets and volumes
/// carrying `parts`.
pub fn remove_swarm_objects(label: &str, parts: &str) {
    remove_services_labelled(label);
    let filter = format!("label={label}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline
        && !docker(&["ps", "-aq", "--filter", &filter])
            .stdout
            .is_empty()
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    remove_containers_labelled(label);
    remove_secrets_labelled(parts);
    remove_volumes_labelled(parts);
    remove_networks_labelled(label);
}

/// `docker ARGS` with the CLI, whatever its outcome.
pub fn docker(args: &[&str]) -> std::process::Output {
    std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("run docker")
}

/// The regular files of a tar stream (what a container printed with
/// `tar -cf -`), by their names without a leading `./`.
pub fn untar(stream: &[u8]) -> std::collections::HashMap<String, Vec<u8>> {
    let mut archive = tar::Archive::new(stream);
    let mut files = std::collections::HashMap::new();
    for entry in archive.entries().expect("a tar stream") {
        let mut entry = entry.unwrap();
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path().unwrap().display().to_string();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
        files.insert(name.trim_start_matches("./").to_owned(), bytes);
    }
    files
}

/// `docker ARGS`, which must succeed; its standard output, trimmed.
pub fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Creates Swarm's gateway bridge (removing one an earlier Swarm left) so
/// that it neither masquerades nor lets its containers talk, as the Swarm
/// backend requires with `--swarm-publish host`; before `docker swarm init`.
/// How many holders use the single-node Swarm, and whether one of them
/// created it.
static SWARM: std::sync::Mutex<(usize, bool)> = std::sync::Mutex::new((0, false));

/// A single-node Swarm while any holder lives: created (with a gateway
/// bridge that neither masquerades nor lets its containers talk) unless
/// the engine already is in one, and left by the last holder out.
pub struct SingleNodeSwarm;

impl SingleNodeSwarm {
    pub fn join() -> Self {
        let mut users = SWARM.lock().unwrap_or_else(|e| e.into_inner());
        if users.0 == 0 {
            let state = docker_ok(&["info", "--format", "{{.Swarm.LocalNodeState}}"]);
            users.1 = state != "active";
            if users.1 {
                create_closed_gateway_bridge();
                docker_ok(&["swarm", "init", "--advertise-addr", "127.0.0.1"]);
            }
        }
        users.0 += 1;
        SingleNodeSwarm
    }
}

impl Drop for SingleNodeSwarm {
    fn drop(&mut self) {
        let mut users = SWARM.lock().unwrap_or_else(|e| e.into_inner());
        users.0 -= 1;
        if users.0 == 0 && users.1 {
            docker(&["swarm", "leave", "--force"]);
            docker(&["network", "rm", "docker_gwbridge"]);
        }
    }
}

pub fn create_closed_gateway_bridge() {
    docker(&["network", "rm", "docker_gwbridge"]);
    docker_ok(&[
        "network",
        "create",
        "--driver",
        "bridge",
        "--opt",
        "com.docker.network.bridge.name=docker_gwbridge",
        "--opt",
        "com.docker.network.bridge.enable_ip_masquerade=false",
        "--opt",
        "com.docker.network.bridge.enable_icc=false",
        "docker_gwbridge",
    ]);
}

/// `docker LIST --filter label=LABEL`, then `docker REMOVE` of what it listed.
fn remove_labelled(list: &[&str], remove: &[&str], label: &str) {
    let ids = std::process::Command::new("docker")
        .args(list)
        .args(["--filter", &format!("label={label}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if !ids.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(remove)
            .args(&ids)
            .output();
    }
}

impl Drop for TestEnv {
    /// Removes every container of this test's deployment, even when the
    /// test panicked; the state database goes with its field.
    fn drop(&mut self) {
        remove_containers_labelled(&format!("io.sandboxd.deployment={}", self.deployment));
        remove_networks_labelled(&format!("io.sandboxd.deployment={}", self.deployment));
        remove_volumes_labelled(&format!("io.sandboxd.deployment={}", self.deployment));
        release_disks(&self.disks_dir());
    }
}

/// Detaches the loop devices of the capped volumes' files in `dir` (their
/// Docker volumes are gone, so nothing mounts them) and removes `dir`.
pub fn release_disks(dir: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for file in entries.flatten() {
        let attached = std::process::Command::new("losetup")
            .arg("-j")
            .arg(file.path())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        for device in attached.lines().filter_map(|l| l.split(':').next()) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", device])
                .output();
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The container sandboxd would create for `engine` (without features,
/// from the test images) under the name `name`, and its fresh credentials:
/// for tests that run an engine image as sandboxd sets it up, by hand.
pub fn engine_container_spec(
    engine: &str,
    name: &str,
) -> (
    sandboxd::ports::runtime::ContainerSpec,
    sandboxd::engine::Credentials,
) {
    let engine = sandboxd::engine::lookup(engine).expect("a known engine");
    let mut config = ControllerConfig::new(Deployment::parse("enginespec").unwrap());
    config.images = Images::new(&[test_images()], &[]).expect("test images");
    let credentials = engine.credentials(sandboxd::domain::Secret::generate());
    let placement = sandboxd::controller::network::Placement {
        container: name.to_owned(),
        network: "unused".into(),
        host: engine.name().as_str().to_owned(),
        aliases: Vec::new(),
    };
    let spec = sandboxd::controller::provision::container_spec(
        &config,
        engine,
        &placement,
        &config.images.image_for(engine, false),
        &credentials,
        &std::collections::BTreeSet::new(),
        std::collections::HashMap::new(),
        None,
    );
    (spec, credentials)
}

/// Image overrides for engines without features (local Debian-built images).
pub fn test_images() -> String {
    std::env::var("SANDBOXD_TEST_IMAGES")
        .unwrap_or_else(|_| "postgres=sandboxd/postgres:17,redis=sandboxd/redis:8".into())
}

/// Image overrides for engines with features.
pub fn test_features_images() -> String {
    std::env::var("SANDBOXD_TEST_FEATURES_IMAGES")
        .unwrap_or_else(|_| "postgres=sandboxd/postgres-ext:17,redis=sandboxd/redis:8".into())
}

/// Valkey's image (`deploy/images/build.sh` builds it from
/// `deploy/images/valkey/`), which [`test_images`] leaves out.
pub const VALKEY_IMAGE: &str = "valkey=sandboxd/valkey:8";

/// [`test_images`] and [`test_features_images`], with Valkey's plain image.
pub fn test_images_with_valkey() -> sandboxd::config::Images {
    sandboxd::config::Images::new(
        &[test_images(), VALKEY_IMAGE.into()],
        &[test_features_images()],
    )
    .expect("the test images parse")
}

/// Waits (up to two minutes) until `controller` has built `n` Postgres
/// templates.
pub async fn templates_built(controller: &RunningController, n: f64) {
    eventually(
        "template jobs to succeed",
        Duration::from_secs(120),
        || async {
            let built = sample(
                &controller.metrics.render(),
                "sandboxd_template_builds_total{engine=\"postgres\",result=\"ok\"}",
            );
            (built.unwrap_or(0.0) >= n).then_some(())
        },
    )
    .await;
}

/// A controller running in the background of a test.
pub struct RunningController {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<()>,
    pub readiness: Readiness,
    /// The controller's metrics (`render()` gives the `/metrics` text).
    pub metrics: Arc<Metrics>,
}

impl RunningController {
    /// Stops it gracefully and waits.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.handle).await.expect("controller task");
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Polls `f` every 100 ms until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Takes the leader lease for an hour as the holder `test` (tests that
/// write `sandbox_status` rows themselves must lead, like sandboxd) and
/// returns its term.
pub async fn hold_lease(pool: &PgPool) -> i64 {
    sqlx::query_scalar::<_, Option<i64>>("SELECT sandbox_lease_acquire('test', 3600000)")
        .fetch_one(pool)
        .await
        .expect("acquire the lease")
        .expect("the lease is free")
}

/// As the leader of `term` (see [`hold_lease`]): a desired row `id` (asking
/// for postgres) and a ready status of its incarnation whose `services`
/// (JSON) are kept as written, credentials included: the database strips
/// them from a status of no row, or of another incarnation.
pub async fn seed_status(pool: &PgPool, id: &str, services: &str, term: i64) {
    sqlx::query("INSERT INTO sandbox_desired (id, services) VALUES ($1, '{postgres}')")
        .bind(id)
        .execute(pool)
        .await
        .expect("insert the desired row");
    sqlx::query(
        "INSERT INTO sandbox_status (id, phase, services, incarnation, leader_term)
         VALUES ($1, 'ready', $2::jsonb, (SELECT incarnation FROM sandbox_desired WHERE id = $1), $3)",
    )
    .bind(id)
    .bind(services)
    .bind(term)
    .execute(pool)
    .await
    .expect("insert the status");
}

/// As the leader of `term` (see [`hold_lease`]): a ready status, with no
/// services, of the current incarnation of the desired row `id`.
pub async fn ready_status(pool: &PgPool, id: &str, term: i64) {
    sqlx::query(
        "INSERT INTO sandbox_status (id, phase, incarnation, leader_term)
         VALUES ($1, 'ready', (SELECT incarnation FROM sandbox_desired WHERE id = $1), $2)",
    )
    .bind(id)
    .bind(term)
    .execute(pool)
    .await
    .expect("insert the status");
}

/// The leader lease of tests' controllers: short, so that a test that
/// kills one need not wait long for the next to lead.
pub const TEST_LEASE: Duration = Duration::from_secs(4);

/// The value of the unlabelled series `name` in a `/metrics` text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of the labelled series `name{…}` in a `/metrics` text.
pub fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A unique sandbox id for a test.
pub fn sandbox_id(prefix: &str) -> SandboxId {
    SandboxId::parse(&format!("{prefix}-{}", random_suffix())).unwrap()
}

/// The `sandboxd` binary built for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");

/// Builds `sandboxd/controller:local` from [`BIN`] as `scripts/run.sh`
/// does (`build_controller_image` in scripts/lib.sh; nothing to do when it
/// holds this binary already): under Swarm, the image of the helper that
/// runs commands in engines on other nodes. Returns its name.
pub fn controller_image() -> &'static str {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            ". scripts/lib.sh && build_controller_image \"$1\"",
            "build",
            BIN,
        ])
        .current_dir(root)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "build_controller_image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sandboxd::config::DEFAULT_SWARM_HELPER_IMAGE
}

/// `sandboxd ARGS` as a user runs it after `scripts/run.sh`, which must
/// succeed: no database flag or variable, the state directory `home` the
/// script wrote.
pub fn cli_at(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env_remove("DATABASE_URL")
        .env("SANDBOXD_HOME", home)
        .output()
        .expect("run sandboxd");
    assert!(
        out.status.success(),
        "sandboxd {args:?} failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A `sandboxd run` process, killed when dropped.
pub struct Process(pub std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// Sends `signal` (e.g. "TERM", "KILL") to the process.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }
}

/// A loopback port that is free now and that Docker will not take later.
///
/// Docker publishes container ports from the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768–60999 by default), and so does
/// `bind(0)`: a port found that way and freed again (a controller killed
/// and restarted on the same metrics port) could be handed to a sandbox of
/// a test running alongside. So ports come from below that range, each
/// test process starting at a random point of it and counting up, and the
/// kernel confirms each is free.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        rand::random_range(0..SPAN),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {LOW} and {}", LOW + SPAN);
}

impl TestEnv {
    /// Starts `sandboxd run` as a separate process for this test's database
    /// and deployment, with `extra` environment on top of the test defaults.
    pub fn spawn_binary(&self, metrics_port: u16, extra: &[(&str, &str)]) -> Process {
        self.spawn_binary_under(&[], metrics_port, extra)
    }

    /// [`TestEnv::spawn_binary`] through `wrapper` (a command that runs
    /// the command line after it: `setpriv …`); none when empty.
    pub fn spawn_binary_under(
        &self,
        wrapper: &[&str],
        metrics_port: u16,
        extra: &[(&str, &str)],
    ) -> Process {
        let mut cmd = match wrapper.split_first() {
            None => std::process::Command::new(BIN),
            Some((program, args)) => {
                let mut cmd = std::process::Command::new(program);
                cmd.args(args).arg(BIN);
                cmd
            }
        };
        cmd.arg("run")
            .env("DATABASE_URL", &self.url)
            .env("SANDBOXD_DEPLOYMENT", self.deployment.as_str())
            .env("SANDBOXD_IMAGES", test_images())
            .env("SANDBOXD_FEATURES_IMAGES", test_features_images())
            .env("SANDBOXD_GRACE", "0s")
            .env("SANDBOXD_TEMPLATES", "off")
            .env(
                "SANDBOXD_LEASE_DURATION",
                format!("{}ms", TEST_LEASE.as_millis()),
            )
            .env("SANDBOXD_METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        Process(cmd.spawn().expect("start sandboxd run"))
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1:`port`; `None` if nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n")?.1.to_owned();
    Some((code, body))
}

/// Percent-encodes a query-string value.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The owner of every request [`request`] makes; [`Agent::start`]'s
/// containers opt in for its sandboxes.
pub const OWNER: &str = "integration-test";

/// A request for `services` with `(engine, feature)` pairs, owner
/// [`OWNER`].
pub fn request(services: &[&str], features: &[(&str, &str)]) -> sandboxd::client::SandboxRequest {
    let mut f: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (engine, feature) in features {
        f.entry((*engine).into())
            .or_default()
            .insert((*feature).into());
    }
    sandboxd::client::SandboxRequest {
        owner: OWNER.into(),
        services: services.iter().map(|s| s.to_string()).collect(),
        features: f,
        attach: Vec::new(),
        expires_at: None,
        ..Default::default()
    }
}

/// The URL a client on the Docker host uses for a published Postgres.
pub fn host_pg_url(pg: &sandboxd::domain::ServiceStatus) -> String {
    format!(
        "postgres://{}:{}@127.0.0.1:{}/{}",
        pg.user,
        pg.password.expose(),
        pg.host_port,
        pg.database
    )
}

/// The agent's login to a Redis or Valkey engine, from the host (its
/// published port on 127.0.0.1).
pub async fn host_redis(s: &sandboxd::domain::ServiceStatus) -> redis::aio::MultiplexedConnection {
    let url = format!(
        "redis://:{}@127.0.0.1:{}/0",
        s.password.expose(),
        s.host_port
    );
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("the agent logs in with the published password")
}

/// Runs `script` with bash inside `container`; its exit code and output.
pub async fn exec_in(
    env: &TestEnv,
    container: &str,
    script: &str,
    vars: Vec<String>,
) -> (i64, String) {
    let cmd = vec!["bash".to_owned(), "-c".to_owned(), script.to_owned()];
    exec_argv(env, container, cmd, vars).await
}

/// Runs `cmd` (an argv, as sandboxd's engines give for `docker exec`)
/// inside `container` with the extra environment `vars`; its exit code and
/// output.
pub async fn exec_argv(
    env: &TestEnv,
    container: &str,
    cmd: Vec<String>,
    vars: Vec<String>,
) -> (i64, String) {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    use futures::StreamExt;
    let exec = env
        .docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(cmd),
                env: Some(vars),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut out = String::new();
    // An exec whose output never ends fails the test instead of hanging it.
    let read = async {
        if let StartExecResults::Attached { mut output, .. } =
            env.docker.start_exec(&exec.id, None).await.unwrap()
        {
            while let Some(Ok(chunk)) = output.next().await {
                out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), read)
        .await
        .unwrap_or_else(|_| panic!("docker exec in {container}: no end of output in 120 s"));
    let code = env
        .docker
        .inspect_exec(&exec.id)
        .await
        .unwrap()
        .exit_code
        .unwrap_or(-1);
    (code, out)
}

/// An agent's container, idling: by default the redis image (redis-cli,
/// bash, getent), opted in for [`OWNER`]'s sandboxes. Removed when dropped.
pub struct Agent(pub String);

impl Agent {
    /// An agent from the redis image.
    pub fn start(name: &str) -> Self {
        Self::start_from(name, "sandboxd/redis:8")
    }

    /// An agent from `image` (which must have `sleep`).
    pub fn start_from(name: &str, image: &str) -> Self {
        let opt_in = format!("{}={OWNER}", sandboxd::domain::attach::OPT_IN);
        Self::run(name, image, &["--label", &opt_in])
    }

    /// A container from `image` started with the `docker run` options
    /// `options` and no opt-in but what they give it.
    pub fn run(name: &str, image: &str, options: &[&str]) -> Self {
        Self::docker(&["run", "-d"], name, image, options)
    }

    /// [`Agent::run`], created but not started (what this host's engine
    /// may not start, e.g. `--privileged`).
    pub fn created(name: &str, image: &str, options: &[&str]) -> Self {
        Self::docker(&["create"], name, image, options)
    }

    fn docker(command: &[&str], name: &str, image: &str, options: &[&str]) -> Self {
        let out = std::process::Command::new("docker")
            .args(command)
            .args(["--name", name])
            .args(["--label", "sandboxd-test.agent=1"])
            .args(options)
            .args(["--entrypoint", "sleep", image, "infinity"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(name.to_owned())
    }

    /// The container's full id.
    pub fn id(&self) -> String {
        let out = std::process::Command::new("docker")
            .args(["inspect", "--format", "{{.Id}}", &self.0])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker inspect {}", self.0);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

/// A container's memory as the cgroup counts it, from one Docker stats
/// sample (`docker stats --no-stream`).
#[derive(Debug, Clone, Copy)]
pub struct MemoryUsage {
    /// What `docker stats` shows as MEM USAGE: the cgroup's usage minus
    /// its inactive page cache (tmpfs pages stay counted: they are shmem).
    pub bytes: u64,
    /// Of which tmpfs (the cgroup's `shmem`, 0 when not reported).
    pub shmem_bytes: u64,
}

impl MemoryUsage {
    /// `bytes` in MiB.
    pub fn mib(&self) -> f64 {
        self.bytes as f64 / (1024.0 * 1024.0)
    }
}

/// Reads `container`'s memory from a one-shot Docker stats sample (within
/// 10 s); `None` if Docker does not report it.
pub async fn container_memory(docker: &bollard::Docker, container: &str) -> Option<MemoryUsage> {
    use futures::StreamExt;
    let options = bollard::query_parameters::StatsOptions {
        stream: false,
        one_shot: true,
    };
    let mut stream = docker.stats(container, Some(options));
    let sample = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .ok()??
        .ok()?;
    let memory = sample.memory_stats?;
    let usage = memory.usage?;
    let stats = memory.stats.unwrap_or_default();
    if std::env::var_os("SANDBOXD_MEMORY_STATS").is_some() {
        eprintln!("memory.stat of {container}: usage {usage} {stats:?}");
    }
    // cgroup v2 reports inactive_file, v1 total_inactive_file.
    let inactive = stats
        .get("inactive_file")
        .or_else(|| stats.get("total_inactive_file"))
        .copied()
        .unwrap_or(0);
    Some(MemoryUsage {
        bytes: usage.saturating_sub(inactive),
        shmem_bytes: stats
            .get("shmem")
            .or_else(|| stats.get("total_shmem"))
            .copied()
            .unwrap_or(0),
    })
}

/// Kills the `engine` container of sandbox `id` (`docker kill`) and waits
/// up to `within` until its status is ready again on another container:
/// the status before the kill and after the heal.
pub async fn kill_and_wait_healed(
    env: &TestEnv,
    client: &sandboxd::client::Client,
    id: &SandboxId,
    engine: &str,
    within: Duration,
) -> (
    sandboxd::domain::SandboxStatus,
    sandboxd::domain::SandboxStatus,
) {
    let before = client
        .status(id)
        .await
        .unwrap()
        .expect("a status before the kill");
    let victim = sandboxd::domain::network::container_name(
        &env.deployment,
        id,
        sandboxd::engine::lookup(engine).unwrap().name(),
    );
    env.docker
        .kill_container(
            &victim,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    let after = eventually("healed", within, || async {
        let s = client.status(id).await.unwrap()?;
        (s.phase == sandboxd::domain::Phase::Ready
            && s.services[engine].instance != before.services[engine].instance)
            .then_some(s)
    })
    .await;
    (before, after)
}

/// The SQLSTATE and message of `sql` (binding `args` in order) run by
/// `pool`: it must be refused.
pub async fn refusal(pool: &sqlx::PgPool, sql: &str, args: &[&str]) -> (String, String) {
    let mut query = sqlx::query(sql);
    for arg in args {
        query = query.bind(*arg);
    }
    let err = query
        .execute(pool)
        .await
        .expect_err(&format!("{sql} must be refused"));
    let db = err
        .as_database_error()
        .unwrap_or_else(|| panic!("{sql}: {err}"));
    (
        db.code().unwrap_or_default().into_owned(),
        db.message().to_owned(),
    )
}
