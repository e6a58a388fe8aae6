//! Pre-initialised templates on the real Docker engine: a Postgres sandbox
//! starts from a copy of a template's data directory, with fresh
//! credentials the template never held; a feature set and a changed image
//! each get their own template, the older one is removed once unused; a
//! heal starts from the template with the same credentials; a persistent
//! sandbox never uses one; templates outlive their state database (a
//! controller on a fresh one reuses them), and a template whose name
//! another deployment's volume holds is refused, counted and described.

use crate::common;

use bollard::query_parameters::KillContainerOptions;
use common::{
    eventually, host_pg_url, request, sample, sandbox_id, templates_built, StatePostgres, TestEnv,
};
use sandboxd::adapters::PgStore;
use sandboxd::client::Client;
use sandboxd::config::{ControllerConfig, Images};
use sandboxd::controller::template::{TEMPLATE, TEMPLATE_BINARIES};
use sandboxd::domain::{SandboxId, SandboxStatus};
use sqlx::{Connection, PgConnection};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

fn with_templates(env: &TestEnv) -> ControllerConfig {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut config = env.config();
    config.templates = true;
    config
}

/// The template volumes of this test's deployment.
fn template_volumes(env: &TestEnv) -> Vec<String> {
    labelled_volumes(env, TEMPLATE)
}

/// The template binaries volumes of this test's deployment.
fn binaries_volumes(env: &TestEnv) -> Vec<String> {
    labelled_volumes(env, TEMPLATE_BINARIES)
}

/// The volumes of this test's deployment that carry `label`.
fn labelled_volumes(env: &TestEnv, label: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "volume",
            "ls",
            "-q",
            "--filter",
            &format!("label=io.sandboxd.deployment={}", env.deployment),
            "--filter",
            &format!("label={label}"),
        ])
        .output()
        .expect("docker volume ls");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// The read-only template volume mounted into the sandbox's Postgres
/// container, if any.
async fn mounted_template(env: &TestEnv, id: &SandboxId) -> Option<String> {
    mounted(env, id, "/var/lib/postgresql/template").await
}

/// The read-only volume with the image's binaries mounted over `/usr` in
/// the sandbox's Postgres container, if any.
async fn mounted_binaries(env: &TestEnv, id: &SandboxId) -> Option<String> {
    mounted(env, id, "/usr").await
}

/// The read-only volume mounted on `destination` in the sandbox's
/// container, if any.
async fn mounted(env: &TestEnv, id: &SandboxId, destination: &str) -> Option<String> {
    let containers = env.containers(Some(id)).await;
    let container = containers.first().expect("the sandbox's container");
    let info = env
        .docker
        .inspect_container(container.id.as_str(), None)
        .await
        .unwrap();
    info.mounts?
        .into_iter()
        .find(|m| m.destination.as_deref() == Some(destination))
        .inspect(|m| assert_eq!(m.rw, Some(false), "{destination} is mounted read-only"))
        .and_then(|m| m.name)
}

async fn logs_in(url: &str) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(url)).await,
        Ok(Ok(_))
    )
}

fn pg_url(s: &SandboxStatus) -> String {
    host_pg_url(&s.services["postgres"])
}

/// Runs `script` with bash in a throwaway container that mounts `volume`
/// read-only on /t (no network), feeding it `stdin`; its exit code and
/// output.
fn on_volume(volume: &str, script: &str, stdin: &str) -> (Option<i32>, String) {
    let mut child = Command::new("docker")
        .args([
            "run",
            "--rm",
            "-i",
            "--network",
            "none",
            "--user",
            "999:999",
            "-v",
            &format!("{volume}:/t:ro"),
            "--entrypoint",
            "bash",
            "sandboxd/postgres:17",
            "-c",
            script,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker run");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// Whether any file in the volume holds `secret` (read on standard
/// input by grep, so it is never an argument).
fn volume_holds(volume: &str, secret: &str) -> bool {
    let script = "test -f /t/cluster/PG_VERSION || exit 3; grep -rlF -f /dev/stdin /t; test $? = 1";
    let (code, _) = on_volume(volume, script, &format!("{secret}\n"));
    assert_ne!(code, Some(3), "{volume} holds a cluster");
    code != Some(0)
}

/// Whether the template's cluster has any role with a password (a SCRAM
/// verifier in pg_authid, relation 1260).
fn template_has_a_password(volume: &str) -> bool {
    let script =
        "test -f /t/cluster/global/1260 || exit 3; grep -c SCRAM-SHA-256 /t/cluster/global/1260";
    let (code, out) = on_volume(volume, script, "");
    assert_ne!(code, Some(3), "pg_authid is where it should be");
    out != "0"
}

#[tokio::test]
async fn a_postgres_sandbox_starts_from_a_template_with_fresh_credentials_the_template_never_held()
{
    let env = TestEnv::new().await;
    let controller = env.start(with_templates(&env));
    // The plain image's template is prepared at start.
    templates_built(&controller, 1.0).await;
    let client = Client::from_pool(env.pool.clone());

    let a = sandbox_id("tpl-a");
    let b = sandbox_id("tpl-b");
    let first = client
        .provision(&a, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let second = client
        .provision(&b, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let volume = mounted_template(&env, &a)
        .await
        .expect("the sandbox's container mounts the template");
    assert_eq!(mounted_template(&env, &b).await.as_deref(), Some(&*volume));
    assert_eq!(template_volumes(&env), vec![volume.clone()]);
    // The server runs from the image's binaries in a volume both share.
    let binaries = mounted_binaries(&env, &a)
        .await
        .expect("the sandbox's container mounts the image's binaries");
    assert!(binaries.contains("-binaries-postgres-plain-"), "{binaries}");
    assert_eq!(
        mounted_binaries(&env, &b).await.as_deref(),
        Some(&*binaries)
    );
    assert_eq!(binaries_volumes(&env), vec![binaries.clone()]);
    assert_eq!(
        sample(
            &controller.metrics.render(),
            "sandboxd_container_starts_total{engine=\"postgres\",from=\"template\"}"
        ),
        Some(2.0)
    );

    // Fresh credentials per sandbox, each working on its own container only.
    let (pa, pb) = (&first.services["postgres"], &second.services["postgres"]);
    assert_ne!(pa.password, pb.password);
    assert!(logs_in(&pg_url(&first)).await);
    assert!(logs_in(&pg_url(&second)).await);
    let crossed = format!(
        "postgres://{}:{}@127.0.0.1:{}/{}",
        pa.user,
        pb.password.expose(),
        pa.host_port,
        pa.database
    );
    assert!(!logs_in(&crossed).await, "b's password does not open a");
    let mut conn = PgConnection::connect(&pg_url(&first)).await.unwrap();
    let (superuser, db): (bool, String) = sqlx::query_as(
        "SELECT rolsuper, current_database()::text FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(!superuser, "the agent's role is no superuser");
    assert_eq!(db, "sandbox");

    // The template holds no credential: no role has a password, and
    // neither sandbox's password is in any of its files.
    assert!(!template_has_a_password(&volume));
    assert!(!volume_holds(&volume, pa.password.expose()));
    assert!(!volume_holds(&volume, pb.password.expose()));

    // A persistent sandbox keeps its data on its volume: no template.
    let kept = sandbox_id("tpl-kept");
    let mut persistent = request(&["postgres"], &[]);
    persistent.persistent = true;
    client.provision(&kept, &persistent, READY).await.unwrap();
    assert_eq!(mounted_template(&env, &kept).await, None);
    assert_eq!(mounted_binaries(&env, &kept).await, None);
    controller.stop().await;
}

#[tokio::test]
async fn a_heal_starts_from_the_template_with_the_same_credentials() {
    let env = TestEnv::new().await;
    let controller = env.start(with_templates(&env));
    templates_built(&controller, 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("tpl-heal");
    let before = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let victim = env.containers(Some(&id)).await.remove(0);
    env.docker
        .kill_container(victim.id.as_str(), None::<KillContainerOptions>)
        .await
        .unwrap();
    let healed = eventually("the heal", READY, || async {
        let s = client.status(&id).await.ok()??;
        let pg = &s.services["postgres"];
        (pg.heals == 1 && s.phase == sandboxd::domain::Phase::Ready).then_some(s)
    })
    .await;
    assert_eq!(
        healed.services["postgres"].password,
        before.services["postgres"].password
    );
    assert!(logs_in(&pg_url(&healed)).await);
    assert!(mounted_template(&env, &id).await.is_some());
    controller.stop().await;
}

/// Removes the image tag when dropped.
struct Tag(String);

impl Drop for Tag {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}

/// Tags a new image (a label on top of the plain Postgres image) as `tag`.
fn tag_variant(tag: &str, variant: &str) {
    let mut child = Command::new("docker")
        .args(["build", "-q", "-t", tag, "-"])
        .env("DOCKER_BUILDKIT", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("docker build");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            format!("FROM sandboxd/postgres:17\nLABEL io.sandboxd.test-variant={variant}\n")
                .as_bytes(),
        )
        .unwrap();
    assert!(child.wait().unwrap().success(), "docker build {tag}");
}

#[tokio::test]
async fn a_feature_set_gets_its_own_template_and_a_changed_image_replaces_the_old_one() {
    let env = TestEnv::new().await;
    let tag = format!("sandboxd-test/tpl-{}:latest", env.deployment);
    let _removed_at_the_end = Tag(tag.clone());
    tag_variant(&tag, "one");
    let mut config = with_templates(&env);
    config.images = Images::new(
        &[format!("postgres={tag}")],
        &["postgres=sandboxd/postgres-ext:17".to_owned()],
    )
    .unwrap();
    let controller = env.start(config.clone());
    templates_built(&controller, 1.0).await;
    let client = Client::from_pool(env.pool.clone());

    // A feature set: its first sandbox may start cold while its template
    // is built; the next one starts from it.
    let cold = sandbox_id("tpl-f1");
    let features = request(&["postgres"], &[("postgres", "citext")]);
    client.provision(&cold, &features, READY).await.unwrap();
    templates_built(&controller, 2.0).await;
    let warm = sandbox_id("tpl-f2");
    let status = client.provision(&warm, &features, READY).await.unwrap();
    let featured = mounted_template(&env, &warm)
        .await
        .expect("from a template");
    assert!(featured.contains("-citext-"), "{featured}");
    let mut conn = PgConnection::connect(&pg_url(&status)).await.unwrap();
    let ext: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'citext'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(ext, 1, "the template's feature is there");

    // The plain image changes: the next sandbox gets a new template, and
    // the old one goes once no container mounts it.
    let plain = sandbox_id("tpl-p1");
    client
        .provision(&plain, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let old = mounted_template(&env, &plain)
        .await
        .expect("from a template");
    let old_binaries = mounted_binaries(&env, &plain)
        .await
        .expect("with the image's binaries");
    client.release(&plain).await.unwrap();
    eventually("the first plain sandbox to go", READY, || async {
        env.containers(Some(&plain)).await.is_empty().then_some(())
    })
    .await;
    tag_variant(&tag, "two");
    let next = sandbox_id("tpl-p2");
    client
        .provision(&next, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    templates_built(&controller, 3.0).await;
    let newer = sandbox_id("tpl-p3");
    client
        .provision(&newer, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let new = mounted_template(&env, &newer)
        .await
        .expect("from a template");
    assert_ne!(new, old, "a changed image has its own template");
    let new_binaries = mounted_binaries(&env, &newer)
        .await
        .expect("with the image's binaries");
    assert_ne!(new_binaries, old_binaries, "and its own binaries");
    eventually("the old template to be removed", READY, || async {
        (!template_volumes(&env).contains(&old) && !binaries_volumes(&env).contains(&old_binaries))
            .then_some(())
    })
    .await;
    assert!(template_volumes(&env).contains(&featured));
    controller.stop().await;
}

/// The state database identity of `pool`'s database.
async fn state_id(pool: &sqlx::PgPool) -> String {
    sqlx::query_scalar("SELECT state_id::text FROM sandbox_identity")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The labels of the volume `name`.
async fn volume_labels(env: &TestEnv, name: &str) -> std::collections::HashMap<String, String> {
    env.docker.inspect_volume(name).await.unwrap().labels
}

#[tokio::test]
async fn templates_built_under_one_state_database_serve_a_controller_on_a_fresh_one() {
    let env = TestEnv::new().await;
    let first = env.start(with_templates(&env));
    templates_built(&first, 1.0).await;
    let client = Client::from_pool(env.pool.clone());
    let features = request(&["postgres"], &[("postgres", "pg_trgm")]);
    // Its feature set's template is built under the first database; its
    // container stays (foreign to the next database), mounting it.
    let before = sandbox_id("tpl-db1");
    client.provision(&before, &features, READY).await.unwrap();
    templates_built(&first, 2.0).await;
    let built = template_volumes(&env);
    let binaries = binaries_volumes(&env);
    assert_eq!(built.len(), 2, "{built:?}");
    let trgm = built
        .iter()
        .find(|v| v.contains("-pg_trgm-"))
        .expect("the feature set's template")
        .clone();
    let old = state_id(&env.pool).await;
    assert_eq!(
        volume_labels(&env, &trgm).await.get("io.sandboxd.state-id"),
        Some(&old)
    );
    first.stop().await;

    // The same deployment on a fresh state database: another identity.
    let fresh = StatePostgres::start().await;
    let store = PgStore::connect(&fresh.url, 4, sandboxd::engine::REGISTRY)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    assert_ne!(state_id(store.pool()).await, old, "a new identity");
    let second = env.start_with_store(with_templates(&env), store.clone());
    templates_built(&second, 1.0).await;
    let client = Client::from_pool(store.pool().clone());
    // This controller looks at a template when a sandbox first asks for
    // it; its job finds it built and ends at once.
    client
        .provision(&sandbox_id("tpl-db2"), &features, READY)
        .await
        .unwrap();
    templates_built(&second, 2.0).await;
    let served = sandbox_id("tpl-db2");
    let status = client.provision(&served, &features, READY).await.unwrap();
    assert_eq!(
        mounted_template(&env, &served).await.as_deref(),
        Some(&*trgm),
        "served from the template the first database's controller built"
    );
    let text = second.metrics.render();
    assert!(
        sample(
            &text,
            "sandboxd_container_starts_total{engine=\"postgres\",from=\"template\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
    let mut conn = PgConnection::connect(&pg_url(&status)).await.unwrap();
    let ext: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(ext, 1, "the template's feature is there");

    // Reused, not rebuilt: the same volumes, still labelled by the first
    // database's identity; no build failed, nothing refused.
    assert_eq!(template_volumes(&env), built);
    assert_eq!(binaries_volumes(&env), binaries);
    assert_eq!(
        volume_labels(&env, &trgm).await.get("io.sandboxd.state-id"),
        Some(&old)
    );
    assert_eq!(
        sample(
            &text,
            "sandboxd_template_builds_total{engine=\"postgres\",result=\"failed\"}"
        )
        .unwrap_or(0.0),
        0.0,
        "{text}"
    );
    assert_eq!(
        common::total(&text, "sandboxd_templates_refused"),
        0.0,
        "{text}"
    );
    second.stop().await;
}

/// Removes the volume when dropped.
struct OtherVolume(String);

impl Drop for OtherVolume {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["volume", "rm", "-f", &self.0])
            .output();
    }
}

#[tokio::test]
async fn a_template_name_held_by_another_deployments_volume_is_refused_counted_and_described() {
    let env = TestEnv::new().await;
    let first = env.start(with_templates(&env));
    templates_built(&first, 1.0).await;
    let plain = template_volumes(&env).remove(0);
    first.stop().await;
    // Another deployment's volume takes the plain template's name.
    common::docker_ok(&["volume", "rm", &plain]);
    let other = format!("{}-other", env.deployment);
    common::docker_ok(&[
        "volume",
        "create",
        "--label",
        "io.sandboxd.managed-by=sandboxd",
        "--label",
        &format!("io.sandboxd.deployment={other}"),
        &plain,
    ]);
    let _removed_at_the_end = OtherVolume(plain.clone());

    let controller = env.start(with_templates(&env));
    let refused = "sandboxd_templates_refused{reason=\"another_deployment\"}";
    eventually("the template to be refused and counted", READY, || async {
        (sample(&controller.metrics.render(), refused) == Some(1.0)).then_some(())
    })
    .await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("tpl-refused");
    let status = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    assert!(logs_in(&pg_url(&status)).await, "it works, cold");
    assert_eq!(mounted_template(&env, &id).await, None);
    assert_eq!(
        sample(
            &controller.metrics.render(),
            "sandboxd_container_starts_total{engine=\"postgres\",from=\"cold\"}"
        ),
        Some(1.0)
    );
    assert_eq!(sample(&controller.metrics.render(), refused), Some(1.0));
    // Never touched: still the other deployment's.
    assert_eq!(
        volume_labels(&env, &plain)
            .await
            .get("io.sandboxd.deployment"),
        Some(&other)
    );

    // `sandboxd describe` says why it started cold.
    let line = eventually("describe to show the refusal", READY, || async {
        let out = Command::new(common::BIN)
            .args(["describe", id.as_str()])
            .env("DATABASE_URL", &env.url)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.contains("its template is refused [another_deployment]"))
            .map(str::to_owned)
    })
    .await;
    assert!(line.contains("created cold"), "{line}");
    assert!(line.contains("another deployment"), "{line}");
    controller.stop().await;
}
