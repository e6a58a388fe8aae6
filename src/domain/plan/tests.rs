//! The decision table of `plan`, one row per situation, plus focused tests
//! for the subtle cases and a convergence check that replays every row.

use super::*;
use crate::domain::id::{Deployment, SandboxId};
use crate::domain::identity::Incarnation;
use crate::domain::labels::ContainerLabels;
use crate::domain::network::candidate_name;
use crate::domain::sandbox::Phase;
use crate::domain::secret::Secret;
use chrono::TimeZone;

/// The actions `plan` decides (the table compares these), for a row that
/// (if missing) was seen gone long ago: [`SEEN_GONE`] seconds before
/// `now()`, so only the containers' age counts.
fn plan(
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    status: Option<&SandboxStatus>,
    now: DateTime<Utc>,
    grace: Duration,
) -> Vec<Action> {
    plan_seen_gone(desired, observed, status, now, grace, Some(ago(SEEN_GONE)))
}

/// Like [`plan`], for a row first seen missing at `gone_since`.
fn plan_seen_gone(
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    status: Option<&SandboxStatus>,
    now: DateTime<Utc>,
    grace: Duration,
    gone_since: Option<DateTime<Utc>>,
) -> Vec<Action> {
    super::plan(
        desired,
        observed,
        status,
        None,
        gone_since,
        now,
        &Policy::with_grace(grace),
    )
    .actions
}

/// The earliest wait among `actions`.
fn next_wake(actions: &[Action]) -> Option<DateTime<Utc>> {
    Plan {
        wanted: Wanted::Yes,
        actions: actions.to_vec(),
        recheck_at: None,
        data_kept_until: None,
        pause: false,
    }
    .next_wake()
}

fn engine(name: &'static str) -> EngineName {
    EngineName::of_engine(name)
}

// ---------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------

const GRACE: Duration = Duration::from_secs(180);
/// Older than the grace window.
const OLD: i64 = 600;
/// Younger than the grace window (60 s left).
const YOUNG: i64 = 120;
/// How long before `now()` the table's missing rows were first seen gone:
/// longer than the grace window, and than [`OLD`].
const SEEN_GONE: i64 = 3600;
/// Host port every observed container is bound to (unless overridden).
const CONTAINER_PORT: u16 = 49_001;

/// The incarnation of the table's rows, and of the containers and statuses
/// made for them.
const ROW: &str = "0a0b0c0d-0000-4000-8000-000000000002";
/// An earlier incarnation of the same id (deleted and inserted again).
const EARLIER: &str = "0a0b0c0d-0000-4000-8000-000000000001";
/// The state database the table's containers belong to.
const STATE: &str = "5a5a5a5a-0000-4000-8000-000000000001";

fn incarnation(text: &str) -> Incarnation {
    Incarnation::parse(text).unwrap()
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A live row wanting `services`, with `features` per engine.
fn desired(services: &[&'static str], features: &[(&'static str, &[&str])]) -> DesiredSandbox {
    DesiredSandbox {
        id: SandboxId::parse("sb-1").unwrap(),
        owner: "ci".into(),
        services: services.iter().map(|s| engine(s)).collect(),
        unknown_services: Vec::new(),
        attach: Vec::new(),
        invalid: None,
        features: features.iter().map(|(e, f)| (engine(e), set(f))).collect(),
        expires_at: None,
        generation: 1,
        incarnation: Some(incarnation(ROW)),
        updated_at: now() - chrono::Duration::seconds(5),
        created_at: now() - chrono::Duration::seconds(5),
        last_used_at: now() - chrono::Duration::seconds(5),
        idle_timeout: None,
        persistent: false,
        idle_action: Default::default(),
        owner_container: None,
        isolation: None,
        seeds: Default::default(),
        fork_of: None,
    }
}

fn expiring(mut d: DesiredSandbox, at: DateTime<Utc>) -> DesiredSandbox {
    d.expires_at = Some(at);
    d
}

fn persistent(mut d: DesiredSandbox) -> DesiredSandbox {
    d.persistent = true;
    d
}

/// The name sandboxd gives the container of `engine`
/// ([`crate::domain::network::container_name`]).
fn engine_container_name(engine: &str) -> String {
    format!("sandboxd.test.sb-1.{engine}")
}

/// A container of `engine` created `age` seconds before `now()`, under
/// the engine's container name.
fn container(
    id: &str,
    engine: &str,
    state: ContainerState,
    features: &[&str],
    instance: &str,
    age: i64,
) -> ObservedContainer {
    ObservedContainer {
        id: ContainerId::new(id),
        name: engine_container_name(engine),
        labels: ContainerLabels {
            deployment: Deployment::parse("test").unwrap(),
            sandbox: SandboxId::parse("sb-1").unwrap(),
            owner: "ci".into(),
            engine: engine.into(),
            generation: 1,
            features: set(features),
            instance: instance.into(),
            state_id: Some(STATE.into()),
            incarnation: Some(ROW.into()),
            isolation: Default::default(),
            seed: None,
        },
        state,
        created: now() - chrono::Duration::seconds(age),
        host_port: Some(CONTAINER_PORT),
        networks: Vec::new(),
        paused: false,
    }
}

fn running(id: &str, engine: &str, features: &[&str], instance: &str) -> ObservedContainer {
    container(id, engine, ContainerState::Running, features, instance, OLD)
}

fn exited(id: &str, engine: &str, features: &[&str], instance: &str) -> ObservedContainer {
    container(id, engine, ContainerState::Exited, features, instance, OLD)
}

/// A rotation's new container, still under its temporary name.
fn candidate(mut c: ObservedContainer) -> ObservedContainer {
    c.name = candidate_name(&c.name, &c.labels.instance);
    c
}

/// The port a published status carries for `engine` (distinct from
/// [`CONTAINER_PORT`] so the summaries show which one was kept).
fn published_port(engine: &str) -> u16 {
    match engine {
        "postgres" => 55_432,
        "redis" => 56_379,
        _ => 57_017,
    }
}

/// What sandboxd published for `engine`: credential set `instance` with
/// `features` present.
fn published(engine: &str, instance: &str, features: &[&str]) -> ServiceStatus {
    let host = format!("sandboxd-test-sb-1-{engine}");
    ServiceStatus {
        url: format!("{engine}://u:pw-{instance}@{host}/db"),
        host,
        port: 1,
        host_port: published_port(engine),
        user: "u".into(),
        password: Secret::new(format!("pw-{instance}")),
        database: "db".into(),
        env: BTreeMap::new(),
        available_extensions: features.iter().map(|s| (*s).to_owned()).collect(),
        instance: instance.into(),
        ready_at: None,
        heals: 0,
        image: String::new(),
        node: None,
        seed: None,
    }
}

/// A status row publishing `(engine, instance, available_extensions)`.
fn status(entries: &[(&str, &str, &[&str])]) -> SandboxStatus {
    SandboxStatus {
        id: SandboxId::parse("sb-1").unwrap(),
        phase: Phase::Ready,
        observed_generation: 1,
        message: String::new(),
        services: entries
            .iter()
            .map(|(engine, instance, f)| {
                let service = published(engine, instance, f);
                ((*engine).to_owned(), Box::new(service))
            })
            .collect(),
        updated_at: Some(now()),
        network: None,
        incarnation: Some(incarnation(ROW)),
    }
}

// ---------------------------------------------------------------------------
// Rendering actions as one-line summaries
// ---------------------------------------------------------------------------

fn list(items: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let items: Vec<String> = items.into_iter().map(|s| s.as_ref().to_owned()).collect();
    format!("[{}]", items.join(","))
}

/// `keep postgres instance=p1`,
/// `provision postgres heal features=[pg_trgm] reuse=p1 port=55432 replace=[c1]`,
/// `teardown c1 duplicate`, `wait c2 +60s` (relative to `now()`).
fn summary(action: &Action) -> String {
    match action {
        Action::Keep { engine, status } => format!("keep {engine} instance={}", status.instance),
        Action::Provision(Provision {
            engine,
            features,
            reuse,
            host_port,
            replace,
            retire,
            reason,
            seed: _,
        }) => format!(
            "provision {engine} {} features={} reuse={} port={} replace={}{}",
            reason.as_str(),
            list(features),
            reuse.as_ref().map_or("no", |s| s.instance.as_str()),
            host_port.map_or("-".to_owned(), |p| p.to_string()),
            list(replace.iter().map(ContainerId::as_str)),
            retire
                .as_ref()
                .map_or(String::new(), |c| format!(" then retire={c}")),
        ),
        Action::Promote {
            engine,
            container,
            status,
        } => format!("promote {engine} {container} instance={}", status.instance),
        Action::Teardown(Teardown {
            container, reason, ..
        }) => format!("teardown {container} {}", reason.as_str()),
        Action::Wait { container, until } => {
            format!("wait {container} +{}s", (*until - now()).num_seconds())
        }
    }
}

fn summaries(actions: &[Action]) -> Vec<String> {
    actions.iter().map(summary).collect()
}

fn plan_at(
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    status: Option<&SandboxStatus>,
) -> Vec<String> {
    summaries(&plan(desired, observed, status, now(), GRACE))
}

// ---------------------------------------------------------------------------
// The decision table
// ---------------------------------------------------------------------------

type Row = (
    &'static str,
    Option<DesiredSandbox>,
    Vec<ObservedContainer>,
    Option<SandboxStatus>,
    &'static [&'static str],
);

fn table() -> Vec<Row> {
    use ContainerState::{Created, Exited, Removing, Running};
    let pg = "postgres";
    let rd = "redis";
    vec![
        // --- create --------------------------------------------------------
        (
            "a new row gets every engine with fresh credentials",
            Some(desired(&[pg, rd], &[])),
            vec![],
            None,
            &[
                "provision postgres create features=[] reuse=no port=- replace=[]",
                "provision redis create features=[] reuse=no port=- replace=[]",
            ],
        ),
        (
            "a new row with features creates the engine with exactly those",
            Some(desired(&[pg], &[(pg, &["pg_trgm", "citext"])])),
            vec![],
            None,
            &["provision postgres create features=[citext,pg_trgm] reuse=no port=- replace=[]"],
        ),
        (
            "a status for another engine does not make a new engine a heal",
            Some(desired(&[pg, rd], &[])),
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &[
                "keep postgres instance=p1",
                "provision redis create features=[] reuse=no port=- replace=[]",
            ],
        ),
        (
            "a dead container never published is replaced by a fresh create",
            Some(desired(&[pg], &[])),
            vec![exited("c1", pg, &[], "x1")],
            None,
            &["provision postgres create features=[] reuse=no port=- replace=[c1]"],
        ),
        // --- keep ----------------------------------------------------------
        (
            "a running published container with every wanted feature is kept",
            Some(desired(&[pg], &[(pg, &["pg_trgm"])])),
            vec![running("c1", pg, &["pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["keep postgres instance=p1"],
        ),
        (
            "a feature subset of what runs is a no op",
            Some(desired(&[pg], &[(pg, &["pg_trgm"])])),
            vec![running("c1", pg, &["citext", "pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["citext", "pg_trgm"])])),
            &["keep postgres instance=p1"],
        ),
        (
            "dropping every feature keeps the running container",
            Some(desired(&[pg], &[])),
            vec![running("c1", pg, &["citext"], "p1")],
            Some(status(&[(pg, "p1", &["citext"])])),
            &["keep postgres instance=p1"],
        ),
        (
            "keep judges features by the container labels not the status",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![running("c1", pg, &["citext"], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["keep postgres instance=p1"],
        ),
        (
            "a new service adds only that engine",
            Some(desired(&[pg, rd], &[(rd, &["search"])])),
            vec![running("c1", pg, &["pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &[
                "keep postgres instance=p1",
                "provision redis create features=[search] reuse=no port=- replace=[]",
            ],
        ),
        // --- rotate --------------------------------------------------------
        (
            "a feature superset builds the union next to the running container which goes once it is ready",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![running("c1", pg, &["pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres rotate features=[citext,pg_trgm] reuse=no port=- replace=[] then retire=c1"],
        ),
        (
            "a rotation removes the engine's other containers first and the published one last",
            Some(desired(&[pg], &[(pg, &["citext", "pg_trgm"])])),
            vec![
                exited("c0", pg, &["pg_trgm"], "old"),
                running("c1", pg, &["pg_trgm"], "p1"),
                running("c2", pg, &["citext", "pg_trgm"], "x2"),
            ],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres rotate features=[citext,pg_trgm] reuse=no port=- replace=[c0,c2] then retire=c1"],
        ),
        (
            "a persistent sandbox rotates after removing the old container and keeps its host port",
            Some(persistent(desired(&[pg], &[(pg, &["citext"])]))),
            vec![running("c1", pg, &["pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres rotate features=[citext,pg_trgm] reuse=no port=49001 replace=[c1]"],
        ),
        (
            "a vanished container whose features grew is a rotation with fresh credentials",
            Some(desired(&[pg], &[(pg, &["citext", "pg_trgm"])])),
            vec![],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres rotate features=[citext,pg_trgm] reuse=no port=55432 replace=[]"],
        ),
        (
            "a dead container whose features grew is a rotation to the union, like a running one",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![exited("c1", pg, &["pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres rotate features=[citext,pg_trgm] reuse=no port=55432 replace=[c1]"],
        ),
        // --- a rotation interrupted (a crash, a failure) -------------------
        // The status's instance token says which container is live: the
        // old one until the new one is published, the new one from then on.
        (
            "a crash while the new container was built keeps the old one and builds again",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![
                running("c1", pg, &["pg_trgm"], "p1"),
                candidate(running("c2", pg, &["citext", "pg_trgm"], "x2")),
            ],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres rotate features=[citext,pg_trgm] reuse=no port=- replace=[c2] then retire=c1"],
        ),
        (
            "a failed rotation's leftover new container is removed before the next attempt",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![
                running("c1", pg, &["pg_trgm"], "p1"),
                candidate(exited("c2", pg, &["citext", "pg_trgm"], "x2")),
            ],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres rotate features=[citext,pg_trgm] reuse=no port=- replace=[c2] then retire=c1"],
        ),
        (
            "a crash after the new container was published switches to it and removes the old one",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![
                running("c1", pg, &["pg_trgm"], "p1"),
                candidate(running("c2", pg, &["citext", "pg_trgm"], "p2")),
            ],
            Some(status(&[(pg, "p2", &["citext", "pg_trgm"])])),
            &["promote postgres c2 instance=p2", "teardown c1 duplicate"],
        ),
        (
            "a crash after the old container was removed switches to the published new one",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![candidate(running("c2", pg, &["citext", "pg_trgm"], "p2"))],
            Some(status(&[(pg, "p2", &["citext", "pg_trgm"])])),
            &["promote postgres c2 instance=p2"],
        ),
        (
            "a crash after the switch renamed the new container keeps it",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![running("c2", pg, &["citext", "pg_trgm"], "p2")],
            Some(status(&[(pg, "p2", &["citext", "pg_trgm"])])),
            &["keep postgres instance=p2"],
        ),
        (
            "a published new container that died before the switch is healed under the engine's name",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![
                running("c1", pg, &["pg_trgm"], "p1"),
                candidate(exited("c2", pg, &["citext", "pg_trgm"], "p2")),
            ],
            Some(status(&[(pg, "p2", &["citext", "pg_trgm"])])),
            &["provision postgres heal features=[citext,pg_trgm] reuse=p2 port=55432 replace=[c1,c2]"],
        ),
        (
            "a row that dropped the new features mid rotation keeps the old container",
            Some(desired(&[pg], &[(pg, &["pg_trgm"])])),
            vec![
                running("c1", pg, &["pg_trgm"], "p1"),
                candidate(running("c2", pg, &["citext", "pg_trgm"], "x2")),
            ],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["keep postgres instance=p1", "teardown c2 duplicate"],
        ),
        (
            "of two published copies the one under the engine's name is kept",
            Some(desired(&[pg], &[])),
            vec![
                candidate(running("c1", pg, &[], "p1")),
                running("c2", pg, &[], "p1"),
            ],
            Some(status(&[(pg, "p1", &[])])),
            &["keep postgres instance=p1", "teardown c1 duplicate"],
        ),
        // --- heal ----------------------------------------------------------
        (
            "a dead published container is healed with the same credentials and port",
            Some(desired(&[pg], &[(pg, &["pg_trgm"])])),
            vec![exited("c1", pg, &["pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres heal features=[pg_trgm] reuse=p1 port=55432 replace=[c1]"],
        ),
        (
            "a container removed out of band is healed with the same credentials",
            Some(desired(&[pg, rd], &[(pg, &["pg_trgm"])])),
            vec![running("c2", rd, &[], "r1")],
            Some(status(&[(pg, "p1", &["pg_trgm"]), (rd, "r1", &[])])),
            &[
                "provision postgres heal features=[pg_trgm] reuse=p1 port=55432 replace=[]",
                "keep redis instance=r1",
            ],
        ),
        (
            "a created but never started published container is healed like a dead one",
            Some(desired(&[pg], &[])),
            vec![container("c1", pg, Created, &[], "p1", OLD)],
            Some(status(&[(pg, "p1", &[])])),
            &["provision postgres heal features=[] reuse=p1 port=55432 replace=[c1]"],
        ),
        (
            "a heal keeps the dead container's extra features",
            Some(desired(&[pg], &[(pg, &["pg_trgm"])])),
            vec![exited("c1", pg, &["citext", "pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["citext", "pg_trgm"])])),
            &["provision postgres heal features=[citext,pg_trgm] reuse=p1 port=55432 replace=[c1]"],
        ),
        (
            "a heal after a vanish restores every feature the status promised",
            Some(desired(&[pg], &[(pg, &["pg_trgm"])])),
            vec![],
            Some(status(&[(pg, "p1", &["citext", "pg_trgm"])])),
            &["provision postgres heal features=[citext,pg_trgm] reuse=p1 port=55432 replace=[]"],
        ),
        (
            "a wanted subset of the published extensions is still a heal",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![exited("c1", pg, &["citext", "pg_trgm"], "p1")],
            Some(status(&[(pg, "p1", &["citext", "pg_trgm"])])),
            &["provision postgres heal features=[citext,pg_trgm] reuse=p1 port=55432 replace=[c1]"],
        ),
        (
            "published credentials win over a running container they do not vouch for",
            Some(desired(&[pg], &[(pg, &["pg_trgm"])])),
            vec![
                exited("c1", pg, &["pg_trgm"], "p1"),
                running("c2", pg, &["pg_trgm"], "x2"),
            ],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres heal features=[pg_trgm] reuse=p1 port=55432 replace=[c1,c2]"],
        ),
        // --- replace -------------------------------------------------------
        (
            "a running container whose credentials were never published is replaced",
            Some(desired(&[pg], &[])),
            vec![running("c1", pg, &[], "x1")],
            None,
            &["provision postgres replace features=[] reuse=no port=- replace=[c1]"],
        ),
        (
            "a status without this engine does not vouch for its running container",
            Some(desired(&[pg, rd], &[])),
            vec![running("c1", pg, &[], "x1"), running("c2", rd, &[], "r1")],
            Some(status(&[(rd, "r1", &[])])),
            &[
                "provision postgres replace features=[] reuse=no port=- replace=[c1]",
                "keep redis instance=r1",
            ],
        ),
        (
            "a crash mid rotation is replaced with fresh credentials on the published port",
            Some(desired(&[pg], &[(pg, &["citext", "pg_trgm"])])),
            vec![running("c2", pg, &["citext", "pg_trgm"], "x2")],
            Some(status(&[(pg, "p1", &["pg_trgm"])])),
            &["provision postgres replace features=[citext,pg_trgm] reuse=no port=55432 replace=[c2]"],
        ),
        // --- duplicates ----------------------------------------------------
        (
            "a second running container of a kept engine is torn down at once",
            Some(desired(&[pg], &[])),
            vec![
                container("c1", pg, Running, &[], "x1", 1),
                running("c2", pg, &[], "p1"),
            ],
            Some(status(&[(pg, "p1", &[])])),
            &["keep postgres instance=p1", "teardown c1 duplicate"],
        ),
        (
            "dead leftovers of a kept engine are torn down as duplicates",
            Some(desired(&[pg], &[])),
            vec![
                running("c1", pg, &[], "p1"),
                exited("c2", pg, &[], "old"),
                container("c3", pg, Created, &[], "p1", 1),
            ],
            Some(status(&[(pg, "p1", &[])])),
            &[
                "keep postgres instance=p1",
                "teardown c2 duplicate",
                "teardown c3 duplicate",
            ],
        ),
        (
            "of two running copies of the published instance the first is kept",
            Some(desired(&[pg], &[])),
            vec![running("c1", pg, &[], "p1"), running("c2", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["keep postgres instance=p1", "teardown c2 duplicate"],
        ),
        (
            "the published copy with every wanted feature is the one kept",
            Some(desired(&[pg], &[(pg, &["citext"])])),
            vec![
                running("c1", pg, &[], "p1"),
                running("c2", pg, &["citext"], "p1"),
            ],
            Some(status(&[(pg, "p1", &["citext"])])),
            &["keep postgres instance=p1", "teardown c1 duplicate"],
        ),
        // --- service dropped -----------------------------------------------
        (
            "a dropped service older than the grace window is torn down",
            Some(desired(&[pg], &[])),
            vec![running("c1", pg, &[], "p1"), running("c2", rd, &[], "r1")],
            Some(status(&[(pg, "p1", &[]), (rd, "r1", &[])])),
            &["teardown c2 service_dropped", "keep postgres instance=p1"],
        ),
        (
            "a dropped service inside the grace window waits",
            Some(desired(&[pg], &[])),
            vec![
                running("c1", pg, &[], "p1"),
                container("c2", rd, Running, &[], "r1", YOUNG),
            ],
            Some(status(&[(pg, "p1", &[]), (rd, "r1", &[])])),
            &["wait c2 +60s", "keep postgres instance=p1"],
        ),
        (
            "every container of a dropped service is reaped on its own clock",
            Some(desired(&[rd], &[])),
            vec![
                running("c1", pg, &[], "p1"),
                container("c2", pg, Exited, &[], "old", YOUNG),
                running("c3", rd, &[], "r1"),
            ],
            Some(status(&[(pg, "p1", &[]), (rd, "r1", &[])])),
            &[
                "teardown c1 service_dropped",
                "wait c2 +60s",
                "keep redis instance=r1",
            ],
        ),
        // --- deleted -------------------------------------------------------
        (
            "a deleted row with nothing left plans nothing",
            None,
            vec![],
            Some(status(&[(pg, "p1", &[])])),
            &[],
        ),
        (
            "a deleted row reaps old containers and waits for young ones",
            None,
            vec![
                running("c1", pg, &[], "p1"),
                container("c2", rd, Running, &[], "r1", YOUNG),
                container("c3", pg, Exited, &[], "old", OLD),
            ],
            Some(status(&[(pg, "p1", &[]), (rd, "r1", &[])])),
            &["teardown c1 deleted", "wait c2 +60s", "teardown c3 deleted"],
        ),
        (
            "a container with neither a row nor a status is an orphan",
            None,
            vec![container("c1", pg, Created, &[], "x1", OLD)],
            None,
            &["teardown c1 orphan"],
        ),
        // --- expired -------------------------------------------------------
        (
            "an expired row reaps old containers and waits for young ones",
            Some(expiring(
                desired(&[pg, rd], &[]),
                now() - chrono::Duration::seconds(1),
            )),
            vec![
                running("c1", pg, &[], "p1"),
                container("c2", rd, Running, &[], "r1", YOUNG),
            ],
            Some(status(&[(pg, "p1", &[]), (rd, "r1", &[])])),
            &["teardown c1 expired", "wait c2 +60s"],
        ),
        (
            "a row expiring exactly now is expired",
            Some(expiring(desired(&[pg], &[]), now())),
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["teardown c1 expired"],
        ),
        (
            "an expired row provisions nothing",
            Some(expiring(
                desired(&[pg], &[]),
                now() - chrono::Duration::days(1),
            )),
            vec![],
            None,
            &[],
        ),
        (
            "a row expiring in the future is provisioned normally",
            Some(expiring(
                desired(&[pg, rd], &[]),
                now() + chrono::Duration::seconds(1),
            )),
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &[
                "keep postgres instance=p1",
                "provision redis create features=[] reuse=no port=- replace=[]",
            ],
        ),
        // --- removing ------------------------------------------------------
        (
            "a container being removed counts as gone",
            Some(desired(&[pg], &[])),
            vec![container("c1", pg, Removing, &[], "p1", OLD)],
            Some(status(&[(pg, "p1", &[])])),
            &["provision postgres heal features=[] reuse=p1 port=55432 replace=[]"],
        ),
        (
            "a container being removed is not kept nor listed as a duplicate",
            Some(desired(&[pg], &[])),
            vec![
                container("c1", pg, Removing, &[], "p1", OLD),
                running("c2", pg, &[], "p1"),
            ],
            Some(status(&[(pg, "p1", &[])])),
            &["keep postgres instance=p1"],
        ),
        (
            "a container being removed is not reaped again",
            None,
            vec![
                container("c1", pg, Removing, &[], "p1", OLD),
                container("c2", rd, Removing, &[], "r1", YOUNG),
            ],
            None,
            &[],
        ),
        (
            "a container of a dropped service being removed is left alone",
            Some(desired(&[pg], &[])),
            vec![
                running("c1", pg, &[], "p1"),
                container("c2", rd, Removing, &[], "r1", OLD),
            ],
            Some(status(&[(pg, "p1", &[])])),
            &["keep postgres instance=p1"],
        ),
        // --- several engines at once ---------------------------------------
        (
            "each engine is decided on its own",
            Some(desired(
                &["redis", "mongo", "postgres"],
                &[(pg, &["citext"]), (rd, &["search"])],
            )),
            vec![
                running("c1", pg, &[], "p1"),
                exited("c2", rd, &["search"], "r1"),
                running("c3", "mongo", &[], "x3"),
            ],
            Some(status(&[(pg, "p1", &[]), (rd, "r1", &["search"])])),
            &[
                "provision mongo replace features=[] reuse=no port=- replace=[c3]",
                "provision postgres rotate features=[citext] reuse=no port=- replace=[] then retire=c1",
                "provision redis heal features=[search] reuse=r1 port=56379 replace=[c2]",
            ],
        ),
    ]
}

#[test]
fn the_decision_table_holds() {
    let mut failures = Vec::new();
    for (name, desired, observed, status, expected) in table() {
        let got = plan_at(desired.as_ref(), &observed, status.as_ref());
        if got != expected {
            failures.push(format!(
                "{name}\n  expected: {expected:#?}\n  got:      {got:#?}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn decision_table_names_are_unique() {
    let names: BTreeSet<&str> = table().iter().map(|row| row.0).collect();
    assert_eq!(names.len(), table().len());
}

// ---------------------------------------------------------------------------
// Focused tests
// ---------------------------------------------------------------------------

#[test]
fn a_kept_engine_publishes_the_status_it_already_had() {
    let d = desired(&["postgres"], &[]);
    let s = status(&[("postgres", "p1", &[])]);
    let actions = plan(
        Some(&d),
        &[running("c1", "postgres", &[], "p1")],
        Some(&s),
        now(),
        GRACE,
    );
    assert_eq!(
        actions,
        vec![Action::Keep {
            engine: engine("postgres"),
            status: ServiceStatus::clone(&s.services["postgres"]),
        }]
    );
}

#[test]
fn a_heal_reuses_the_published_credentials_verbatim() {
    let d = desired(&["postgres"], &[]);
    let s = status(&[("postgres", "p1", &[])]);
    let actions = plan(
        Some(&d),
        &[exited("c1", "postgres", &[], "p1")],
        Some(&s),
        now(),
        GRACE,
    );
    let [Action::Provision(Provision {
        reuse: Some(reused),
        host_port,
        reason: ProvisionReason::Heal,
        ..
    })] = actions.as_slice()
    else {
        panic!("expected one heal, got {:?}", summaries(&actions));
    };
    assert_eq!(reused, &*s.services["postgres"]);
    assert_eq!(reused.password.expose(), "pw-p1");
    assert_eq!(*host_port, Some(reused.host_port));
}

#[test]
fn a_persistent_rotation_keeps_the_running_container_host_port_not_the_published_one() {
    let d = persistent(desired(&["postgres"], &[("postgres", &["citext"])]));
    let s = status(&[("postgres", "p1", &[])]);
    let mut c = running("c1", "postgres", &[], "p1");
    c.host_port = Some(41_000);
    let actions = plan(Some(&d), &[c], Some(&s), now(), GRACE);
    assert_eq!(
        summaries(&actions),
        ["provision postgres rotate features=[citext] reuse=no port=41000 replace=[c1]"]
    );
}

#[test]
fn a_runtime_that_cannot_rename_rotates_in_place_keeping_the_host_port() {
    let d = desired(&["postgres"], &[("postgres", &["citext"])]);
    let s = status(&[("postgres", "p1", &[])]);
    let mut c = running("c1", "postgres", &[], "p1");
    c.host_port = Some(41_000);
    let policy = Policy {
        rotate_in_place: true,
        ..Policy::with_grace(GRACE)
    };
    let actions = super::plan(Some(&d), &[c], Some(&s), None, None, now(), &policy).actions;
    assert_eq!(
        summaries(&actions),
        ["provision postgres rotate features=[citext] reuse=no port=41000 replace=[c1]"]
    );
}

#[test]
fn a_persistent_rotation_of_a_container_without_a_host_port_keeps_the_published_one() {
    let d = persistent(desired(&["postgres"], &[("postgres", &["citext"])]));
    let s = status(&[("postgres", "p1", &[])]);
    let mut c = running("c1", "postgres", &[], "p1");
    c.host_port = None;
    let actions = plan(Some(&d), &[c], Some(&s), now(), GRACE);
    assert_eq!(
        summaries(&actions),
        ["provision postgres rotate features=[citext] reuse=no port=55432 replace=[c1]"]
    );
}

#[test]
fn a_status_without_an_instance_token_vouches_for_no_container() {
    // Even a container whose label is also empty: an empty token links
    // nothing, so the status can only be used to heal.
    let d = desired(&["postgres"], &[]);
    let s = status(&[("postgres", "", &[])]);
    let actions = plan(
        Some(&d),
        &[running("c1", "postgres", &[], "")],
        Some(&s),
        now(),
        GRACE,
    );
    assert_eq!(
        summaries(&actions),
        ["provision postgres heal features=[] reuse= port=55432 replace=[c1]"]
    );
}

#[test]
fn the_order_of_services_in_the_row_does_not_change_the_plan() {
    let engines = ["postgres", "redis", "mongo"];
    let observed = vec![
        running("c1", "postgres", &["pg_trgm"], "p1"),
        exited("c2", "redis", &[], "r1"),
        running("c4", "redis", &[], "x4"),
    ];
    let s = status(&[("postgres", "p1", &["pg_trgm"]), ("redis", "r1", &[])]);
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let plans: Vec<Vec<String>> = orders
        .iter()
        .map(|order| {
            let services: Vec<&str> = order.iter().map(|&i| engines[i]).collect();
            let d = desired(&services, &[("postgres", &["citext"])]);
            plan_at(Some(&d), &observed, Some(&s))
        })
        .collect();
    assert_eq!(
        plans[0],
        [
            "provision mongo create features=[] reuse=no port=- replace=[]",
            "provision postgres rotate features=[citext,pg_trgm] reuse=no port=- replace=[] then retire=c1",
            "provision redis heal features=[] reuse=r1 port=56379 replace=[c2,c4]",
        ]
    );
    for (order, p) in orders.iter().zip(&plans) {
        assert_eq!(p, &plans[0], "services in order {order:?}");
    }
}

#[test]
fn the_order_of_observed_containers_only_picks_which_duplicate_survives() {
    // Keep always wins over its duplicates whatever the listing order.
    let d = desired(&["postgres"], &[]);
    let s = status(&[("postgres", "p1", &[])]);
    let a = running("c1", "postgres", &[], "x1");
    let b = running("c2", "postgres", &[], "p1");
    for observed in [vec![a.clone(), b.clone()], vec![b, a]] {
        assert_eq!(
            plan_at(Some(&d), &observed, Some(&s)),
            ["keep postgres instance=p1", "teardown c1 duplicate"]
        );
    }
}

#[test]
fn duplicates_are_torn_down_whatever_the_grace_window() {
    let d = desired(&["postgres"], &[]);
    let s = status(&[("postgres", "p1", &[])]);
    let observed = [
        running("c1", "postgres", &[], "p1"),
        container("c2", "postgres", ContainerState::Running, &[], "x2", 0),
    ];
    let year = Duration::from_secs(365 * 24 * 3600);
    let actions = plan(Some(&d), &observed, Some(&s), now(), year);
    assert_eq!(
        summaries(&actions),
        ["keep postgres instance=p1", "teardown c2 duplicate"]
    );
}

#[test]
fn a_grace_of_zero_reaps_a_container_created_this_instant() {
    let c = container("c1", "postgres", ContainerState::Running, &[], "p1", 0);
    let actions = plan(None, &[c], None, now(), Duration::ZERO);
    assert_eq!(summaries(&actions), ["teardown c1 orphan"]);
}

#[test]
fn a_container_exactly_as_old_as_the_grace_window_is_reaped() {
    let at_boundary = container("c1", "redis", ContainerState::Running, &[], "r1", 180);
    let just_younger = container("c2", "redis", ContainerState::Running, &[], "r2", 179);
    let d = desired(&["postgres"], &[]);
    let s = status(&[("postgres", "p1", &[])]);
    let pg = running("c0", "postgres", &[], "p1");
    assert_eq!(
        plan_at(Some(&d), &[pg, at_boundary, just_younger], Some(&s)),
        [
            "teardown c1 service_dropped",
            "wait c2 +1s",
            "keep postgres instance=p1"
        ]
    );
}

#[test]
fn the_grace_window_counts_from_container_creation_with_sub_second_precision() {
    let mut c = container("c1", "postgres", ContainerState::Running, &[], "p1", 0);
    c.created = now() - chrono::Duration::milliseconds(179_999);
    let actions = plan(None, &[c], None, now(), GRACE);
    assert_eq!(
        actions,
        vec![Action::Wait {
            container: ContainerId::new("c1"),
            until: now() + chrono::Duration::milliseconds(1),
        }]
    );
}

#[test]
fn a_grace_window_too_large_for_the_calendar_waits_forever_instead_of_panicking() {
    let c = container("c1", "postgres", ContainerState::Running, &[], "p1", OLD);
    for grace in [Duration::MAX, Duration::from_secs(u64::MAX / 1_000_000)] {
        let actions = plan(None, std::slice::from_ref(&c), None, now(), grace);
        assert_eq!(
            actions,
            vec![Action::Wait {
                container: ContainerId::new("c1"),
                until: DateTime::<Utc>::MAX_UTC,
            }],
            "grace {grace:?}"
        );
    }
}

#[test]
fn teardowns_carry_the_engine_of_the_container() {
    let actions = plan(
        None,
        &[running("c1", "redis", &[], "r1")],
        None,
        now(),
        GRACE,
    );
    assert_eq!(
        actions,
        vec![Action::Teardown(Teardown {
            container: ContainerId::new("c1"),
            engine: "redis".into(),
            reason: ReapReason::Orphan,
        })]
    );
}

#[test]
fn next_wake_is_the_earliest_wait() {
    let observed = [
        container("c1", "postgres", ContainerState::Running, &[], "p1", 30),
        container("c2", "redis", ContainerState::Running, &[], "r1", 170),
        container("c3", "mongo", ContainerState::Running, &[], "m1", 90),
        container("c4", "mongo", ContainerState::Exited, &[], "m0", OLD),
    ];
    let actions = plan(None, &observed, None, now(), GRACE);
    assert_eq!(
        summaries(&actions),
        [
            "wait c1 +150s",
            "wait c2 +10s",
            "wait c3 +90s",
            "teardown c4 orphan"
        ]
    );
    assert_eq!(
        next_wake(&actions),
        Some(now() + chrono::Duration::seconds(10))
    );
}

#[test]
fn next_wake_is_none_without_waits() {
    assert_eq!(next_wake(&[]), None);
    let d = desired(&["postgres"], &[]);
    let actions = plan(
        Some(&d),
        &[running("c1", "redis", &[], "r1")],
        None,
        now(),
        GRACE,
    );
    assert_eq!(
        summaries(&actions),
        [
            "teardown c1 service_dropped",
            "provision postgres create features=[] reuse=no port=- replace=[]"
        ]
    );
    assert_eq!(next_wake(&actions), None);
}

#[test]
fn containers_of_an_engine_the_row_names_but_this_binary_lacks_are_kept() {
    let mut d = desired(&["postgres"], &[]);
    d.unknown_services = vec!["nonesuch".into()];
    let s = status(&[("postgres", "p1", &[])]);
    let observed = [
        running("c1", "postgres", &[], "p1"),
        running("c2", "nonesuch", &[], "n1"),
    ];
    assert_eq!(
        plan_at(Some(&d), &observed, Some(&s)),
        ["keep postgres instance=p1"]
    );
}

#[test]
fn plans_list_their_steps_by_kind() {
    let d = desired(&["postgres", "redis"], &[]);
    let s = status(&[("postgres", "p1", &[])]);
    let observed = [
        running("c1", "postgres", &[], "p1"),
        container("c2", "mongo", ContainerState::Running, &[], "m1", YOUNG),
        running("c3", "postgres", &[], "x3"),
    ];
    let p = super::plan(
        Some(&d),
        &observed,
        Some(&s),
        None,
        None,
        now(),
        &Policy::with_grace(GRACE),
    );
    assert_eq!(p.wanted, Wanted::Yes);
    let kept: Vec<EngineName> = p.kept().map(|(e, _)| e).collect();
    assert_eq!(kept, [engine("postgres")]);
    let created: Vec<EngineName> = p.provisions().map(|p| p.engine).collect();
    assert_eq!(created, [engine("redis")]);
    let removed: Vec<&str> = p.teardowns().map(|t| t.container.as_str()).collect();
    assert_eq!(removed, ["c3"]);
    assert!(p.is_waiting());
    assert_eq!(p.next_wake(), Some(now() + chrono::Duration::seconds(60)));
}

#[test]
fn wanted_says_why_a_row_wants_nothing() {
    let live = desired(&["postgres"], &[]);
    let later = expiring(live.clone(), now() + chrono::Duration::seconds(1));
    let at_now = expiring(live.clone(), now());
    let wanted =
        |d: Option<&DesiredSandbox>| wanted_until(d, None, now(), &Policy::with_grace(GRACE));
    assert_eq!(wanted(None), (Wanted::Deleted, None));
    assert_eq!(wanted(Some(&live)), (Wanted::Yes, None));
    assert_eq!(
        wanted(Some(&later)),
        (Wanted::Yes, Some(now() + chrono::Duration::seconds(1)))
    );
    assert_eq!(wanted(Some(&at_now)).0, Wanted::Expired);
}

#[test]
fn reasons_have_stable_label_values() {
    let provision: Vec<&str> = [
        ProvisionReason::Create,
        ProvisionReason::Heal,
        ProvisionReason::Rotate,
        ProvisionReason::Replace,
    ]
    .into_iter()
    .map(ProvisionReason::as_str)
    .collect();
    assert_eq!(provision, ["create", "heal", "rotate", "replace"]);
    let reap: Vec<&str> = [
        ReapReason::Deleted,
        ReapReason::ServiceDropped,
        ReapReason::Expired,
        ReapReason::Duplicate,
    ]
    .into_iter()
    .map(ReapReason::as_str)
    .collect();
    assert_eq!(reap, ["deleted", "service_dropped", "expired", "duplicate"]);
}

// ---------------------------------------------------------------------------
// Convergence: replaying every table row against a simulated Docker
// ---------------------------------------------------------------------------

/// Applies actions the way `reconcile` and `provision` do: teardowns and
/// replaced containers disappear, a provision starts a container labelled
/// with the reused instance (or a fresh one) and publishes it, a keep
/// republishes, and a wait lets the clock run to its deadline.
struct World {
    now: DateTime<Utc>,
    observed: Vec<ObservedContainer>,
    status: Option<SandboxStatus>,
    minted: u32,
}

impl World {
    fn apply(&mut self, desired: Option<&DesiredSandbox>, actions: &[Action]) {
        let mut services = BTreeMap::new();
        let mut wake = None;
        for action in actions {
            match action {
                Action::Teardown(Teardown { container, .. }) => {
                    self.observed.retain(|c| &c.id != container);
                }
                Action::Wait { until, .. } => {
                    wake = Some(wake.map_or(*until, |w: DateTime<Utc>| w.min(*until)));
                }
                Action::Keep { engine, status } => {
                    services.insert(engine.as_str().to_owned(), Box::new(status.clone()));
                }
                Action::Promote {
                    engine,
                    container,
                    status,
                } => {
                    for c in self.observed.iter_mut().filter(|c| &c.id == container) {
                        c.name = engine_container_name(engine.as_str());
                    }
                    services.insert(engine.as_str().to_owned(), Box::new(status.clone()));
                }
                Action::Provision(Provision {
                    engine,
                    features,
                    reuse,
                    host_port,
                    replace,
                    retire,
                    ..
                }) => {
                    let engine = engine.as_str();
                    self.observed
                        .retain(|c| !replace.contains(&c.id) && Some(&c.id) != retire.as_ref());
                    self.minted += 1;
                    let id = format!("n{}", self.minted);
                    let instance = reuse
                        .as_ref()
                        .map_or_else(|| format!("fresh{}", self.minted), |s| s.instance.clone());
                    let port = host_port.unwrap_or(60_000 + self.minted as u16);
                    let mut c = container(&id, engine, ContainerState::Running, &[], &instance, 0);
                    c.created = self.now;
                    c.labels.features = features.clone();
                    c.host_port = Some(port);
                    self.observed.push(c);
                    let f: Vec<&str> = features.iter().map(String::as_str).collect();
                    let mut s = published(engine, &instance, &f);
                    s.host_port = port;
                    services.insert(engine.to_owned(), Box::new(s));
                }
            }
        }
        self.status = match wanted_until(desired, None, self.now, &Policy::with_grace(GRACE)).0 {
            Wanted::Yes => Some(SandboxStatus {
                services,
                ..status(&[])
            }),
            _ => None,
        };
        if let Some(t) = wake {
            self.now = self.now.max(t);
        }
    }
}

#[test]
fn every_table_row_converges_to_a_fixed_point_within_three_rounds() {
    for (name, desired, observed, status, _) in table() {
        let mut world = World {
            now: now(),
            observed,
            status,
            minted: 0,
        };
        let mut rounds = 0;
        loop {
            let actions = plan(
                desired.as_ref(),
                &world.observed,
                world.status.as_ref(),
                world.now,
                GRACE,
            );
            let settled = actions.iter().all(|a| matches!(a, Action::Keep { .. }));
            if settled {
                break;
            }
            rounds += 1;
            assert!(
                rounds <= 3,
                "{name}: still acting after 3 rounds: {:?}",
                summaries(&actions)
            );
            world.apply(desired.as_ref(), &actions);
        }

        // The fixed point: one running, published container per wanted
        // engine with every wanted feature, and nothing else.
        let live: Vec<&ObservedContainer> = world
            .observed
            .iter()
            .filter(|c| c.state != ContainerState::Removing)
            .collect();
        match desired.as_ref().filter(|d| !d.is_expired(world.now)) {
            None => assert!(live.is_empty(), "{name}: left {live:?}"),
            Some(d) => {
                assert_eq!(live.len(), d.services.len(), "{name}: left {live:?}");
                for &engine in &d.services {
                    let c = live
                        .iter()
                        .find(|c| c.labels.engine == engine.as_str())
                        .unwrap_or_else(|| panic!("{name}: no {engine} container"));
                    let s = &world.status.as_ref().unwrap().services[engine.as_str()];
                    assert_eq!(c.state, ContainerState::Running, "{name}");
                    assert_eq!(c.labels.instance, s.instance, "{name}: {engine}");
                    assert_eq!(c.name, engine_container_name(engine.as_str()), "{name}");
                    assert!(
                        d.features_for(engine).is_subset(&c.labels.features),
                        "{name}: {engine} lacks wanted features"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Idleness, persistence and the owner container
// ---------------------------------------------------------------------------

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ago(n: i64) -> DateTime<Utc> {
    now() - chrono::Duration::seconds(n)
}

fn idle_after(mut d: DesiredSandbox, timeout: u64, last_used: i64) -> DesiredSandbox {
    d.idle_timeout = Some(secs(timeout));
    d.last_used_at = ago(last_used);
    d
}

fn policy(idle_default: Option<u64>) -> Policy {
    Policy {
        grace: GRACE,
        idle_timeout: idle_default.map(secs),
        rotate_in_place: false,
        isolation: Default::default(),
    }
}

#[test]
fn a_row_unused_for_its_idle_timeout_is_released_and_its_containers_reaped() {
    let d = idle_after(desired(&["postgres"], &[]), 3, 5);
    let observed = [container(
        "c1",
        "postgres",
        ContainerState::Running,
        &[],
        "i1",
        OLD,
    )];
    let p = super::plan(Some(&d), &observed, None, None, None, now(), &policy(None));
    assert_eq!(p.wanted, Wanted::Idle);
    assert_eq!(
        p.teardowns().map(|t| t.reason).collect::<Vec<_>>(),
        [ReapReason::Idle]
    );
}

#[test]
fn a_touched_row_stays_and_is_looked_at_again_when_it_would_go_idle() {
    let d = idle_after(desired(&["postgres"], &[]), 3, 1);
    let (why, recheck) = wanted_until(Some(&d), None, now(), &policy(None));
    assert_eq!(why, Wanted::Yes);
    assert_eq!(recheck, Some(ago(1) + chrono::Duration::seconds(3)));
}

#[test]
fn the_controller_default_idle_timeout_applies_unless_the_row_says_never() {
    let mut d = desired(&["postgres"], &[]);
    d.last_used_at = ago(100);
    assert_eq!(
        wanted_until(Some(&d), None, now(), &policy(None)).0,
        Wanted::Yes
    );
    assert_eq!(
        wanted_until(Some(&d), None, now(), &policy(Some(60))).0,
        Wanted::Idle
    );
    d.idle_timeout = Some(Duration::ZERO);
    assert_eq!(
        wanted_until(Some(&d), None, now(), &policy(Some(60))),
        (Wanted::Yes, None)
    );
}

#[test]
fn a_persistent_sandbox_never_goes_idle_or_expires() {
    let mut d = expiring(idle_after(desired(&["postgres"], &[]), 3, 100), ago(10));
    d.persistent = true;
    assert_eq!(
        wanted_until(Some(&d), None, now(), &policy(Some(1))),
        (Wanted::Yes, None)
    );
}

#[test]
fn a_row_whose_owner_container_is_gone_past_the_grace_window_is_released() {
    let mut d = desired(&["postgres"], &[]);
    d.owner_container = Some("agent-7".into());
    d.updated_at = ago(600);
    let p = super::plan(
        Some(&d),
        &[running("c1", "postgres", &[], "i1")],
        None,
        Some(OwnerState::Missing),
        None,
        now(),
        &policy(None),
    );
    assert_eq!(p.wanted, Wanted::OwnerGone);
    assert_eq!(
        p.teardowns().map(|t| t.reason).collect::<Vec<_>>(),
        [ReapReason::OwnerGone]
    );
}

#[test]
fn an_owner_container_that_stopped_or_is_not_there_yet_gets_the_grace_window() {
    let mut d = desired(&["postgres"], &[]);
    d.owner_container = Some("agent-7".into());
    d.updated_at = ago(600);
    let stopped = OwnerState::Exited(Some(ago(30)));
    assert_eq!(
        wanted_until(Some(&d), Some(stopped), now(), &policy(None)),
        (Wanted::Yes, Some(ago(30) + chrono::Duration::seconds(180)))
    );
    // Asked for just now, before its agent was started.
    d.updated_at = ago(10);
    assert_eq!(
        wanted_until(Some(&d), Some(OwnerState::Missing), now(), &policy(None)),
        (Wanted::Yes, Some(ago(10) + chrono::Duration::seconds(180)))
    );
    assert_eq!(
        wanted_until(Some(&d), Some(OwnerState::Running), now(), &policy(None)),
        (Wanted::Yes, None)
    );
}

// ---------------------------------------------------------------------------
// Deleted rows: the grace window also counts from when the row was seen gone
// ---------------------------------------------------------------------------

/// (name, row, seen gone this many seconds before `now()` (`None`: not
/// known), observed, status, expected summaries).
type GoneRow = (
    &'static str,
    Option<DesiredSandbox>,
    Option<i64>,
    Vec<ObservedContainer>,
    Option<SandboxStatus>,
    &'static [&'static str],
);

fn deletion_table() -> Vec<GoneRow> {
    use ContainerState::Running;
    let pg = "postgres";
    let rd = "redis";
    vec![
        (
            "a row deleted just now keeps even old containers for the whole grace window",
            None,
            Some(0),
            vec![running("c1", pg, &[], "p1"), exited("c2", pg, &[], "old")],
            Some(status(&[(pg, "p1", &[])])),
            &["wait c1 +180s", "wait c2 +180s"],
        ),
        (
            "a row seen gone a while ago waits for the rest of the grace window",
            None,
            Some(150),
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["wait c1 +30s"],
        ),
        (
            "a young container of a row seen gone long ago waits for its own age",
            None,
            Some(150),
            vec![container("c1", rd, Running, &[], "r1", YOUNG)],
            Some(status(&[(rd, "r1", &[])])),
            &["wait c1 +60s"],
        ),
        (
            "a row seen gone exactly the grace window ago is reaped",
            None,
            Some(180),
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["teardown c1 deleted"],
        ),
        (
            "an orphan found at start keeps its old containers for the grace window from then",
            None,
            Some(0),
            vec![running("c1", pg, &[], "x1")],
            None,
            &["wait c1 +180s"],
        ),
        (
            "a missing row not yet seen gone counts from now",
            None,
            None,
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["wait c1 +180s"],
        ),
        (
            "an expired row is judged by its containers' age alone",
            Some(expiring(desired(&[pg], &[]), ago(1))),
            Some(0),
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["teardown c1 expired"],
        ),
        (
            "an idle row is judged by its containers' age alone",
            Some(idle_after(desired(&[pg], &[]), 3, 5)),
            Some(0),
            vec![running("c1", pg, &[], "p1")],
            Some(status(&[(pg, "p1", &[])])),
            &["teardown c1 idle"],
        ),
        (
            "a dropped service is judged by its container's age alone",
            Some(desired(&[pg], &[])),
            Some(0),
            vec![running("c1", pg, &[], "p1"), running("c2", rd, &[], "r1")],
            Some(status(&[(pg, "p1", &[]), (rd, "r1", &[])])),
            &["teardown c2 service_dropped", "keep postgres instance=p1"],
        ),
    ]
}

#[test]
fn the_deletion_grace_table_holds() {
    let mut failures = Vec::new();
    for (name, desired, gone_ago, observed, status, expected) in deletion_table() {
        let got = summaries(&plan_seen_gone(
            desired.as_ref(),
            &observed,
            status.as_ref(),
            now(),
            GRACE,
            gone_ago.map(ago),
        ));
        if got != expected {
            failures.push(format!(
                "{name}\n  expected: {expected:#?}\n  got:      {got:#?}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn deletion_grace_table_names_are_unique() {
    let names: BTreeSet<&str> = deletion_table().iter().map(|row| row.0).collect();
    assert_eq!(names.len(), deletion_table().len());
}

#[test]
fn a_row_owned_by_a_gone_container_is_judged_by_its_containers_age_alone() {
    let mut d = desired(&["postgres"], &[]);
    d.owner_container = Some("agent-7".into());
    d.updated_at = ago(600);
    let p = super::plan(
        Some(&d),
        &[running("c1", "postgres", &[], "i1")],
        None,
        Some(OwnerState::Missing),
        Some(now()),
        now(),
        &policy(None),
    );
    assert_eq!(summaries(&p.actions), ["teardown c1 owner_gone"]);
    assert_eq!(p.data_kept_until, None);
}

#[test]
fn next_wake_of_a_deleted_row_is_the_later_of_its_containers_age_and_when_it_was_seen_gone() {
    let observed = [
        running("c1", "postgres", &[], "p1"),
        container("c2", "redis", ContainerState::Running, &[], "r1", YOUNG),
    ];
    let s = status(&[("postgres", "p1", &[]), ("redis", "r1", &[])]);
    let p = super::plan(
        None,
        &observed,
        Some(&s),
        None,
        Some(ago(150)),
        now(),
        &Policy::with_grace(GRACE),
    );
    assert_eq!(summaries(&p.actions), ["wait c1 +30s", "wait c2 +60s"]);
    assert_eq!(p.next_wake(), Some(now() + chrono::Duration::seconds(30)));
    assert_eq!(p.next_look(), Some(now() + chrono::Duration::seconds(30)));
}

#[test]
fn a_deleted_rows_data_is_kept_for_the_grace_window_from_when_it_was_seen_gone() {
    let at = |gone_since| {
        super::plan(
            None,
            &[],
            None,
            None,
            gone_since,
            now(),
            &Policy::with_grace(GRACE),
        )
    };
    let p = at(Some(ago(60)));
    assert!(p.actions.is_empty());
    assert!(!p.is_waiting(), "no container waits");
    assert_eq!(
        p.data_kept_until,
        Some(now() + chrono::Duration::seconds(120))
    );
    assert_eq!(p.next_look(), p.data_kept_until, "looked at again then");
    assert_eq!(
        at(None).data_kept_until,
        Some(now() + chrono::Duration::seconds(180))
    );
    assert_eq!(at(Some(ago(180))).data_kept_until, None);
    assert_eq!(at(Some(ago(SEEN_GONE))).next_look(), None);

    // A row that exists keeps nothing back, whenever it was seen gone.
    let d = desired(&["postgres"], &[]);
    let live = super::plan(
        Some(&d),
        &[],
        None,
        None,
        Some(now()),
        now(),
        &Policy::with_grace(GRACE),
    );
    assert_eq!(live.data_kept_until, None);
}

// ---------------------------------------------------------------------------
// Incarnations: a row deleted and inserted again never inherits containers
// ---------------------------------------------------------------------------

/// `c` as made for the earlier incarnation of the row.
fn earlier(mut c: ObservedContainer) -> ObservedContainer {
    c.labels.incarnation = Some(EARLIER.into());
    c
}

/// `c` as made before incarnations existed (no label).
fn unlabelled(mut c: ObservedContainer) -> ObservedContainer {
    c.labels.incarnation = None;
    c
}

/// (name, row, observed, status of the row's incarnation, expected).
/// The status passed is what the reconcile keeps after
/// `status::of_incarnation`: an earlier incarnation's is none.
fn incarnation_table() -> Vec<Row> {
    let pg = "postgres";
    let rd = "redis";
    let invalid = |mut d: DesiredSandbox| {
        d.invalid = Some("services is NULL".into());
        d
    };
    vec![
        (
            "an earlier incarnation's published container is torn down at once and the row provisioned fresh",
            Some(desired(&[pg], &[])),
            vec![earlier(running("c1", pg, &[], "p1"))],
            None,
            &[
                "teardown c1 superseded",
                "provision postgres create features=[] reuse=no port=- replace=[]",
            ],
        ),
        (
            "an earlier incarnation's container younger than the grace window goes too",
            Some(desired(&[pg], &[])),
            vec![earlier(container("c1", pg, ContainerState::Running, &[], "p1", 1))],
            None,
            &[
                "teardown c1 superseded",
                "provision postgres create features=[] reuse=no port=- replace=[]",
            ],
        ),
        (
            "an earlier incarnation's engine the row no longer wants goes at once, not after the grace window",
            Some(desired(&[pg], &[])),
            vec![
                earlier(container("c1", rd, ContainerState::Running, &[], "r1", YOUNG)),
                running("c2", pg, &[], "p2"),
            ],
            Some(status(&[(pg, "p2", &[])])),
            &["teardown c1 superseded", "keep postgres instance=p2"],
        ),
        (
            "the row's own container is kept beside an earlier incarnation's of the same engine",
            Some(desired(&[pg], &[])),
            vec![earlier(running("c1", pg, &[], "p1")), running("c2", pg, &[], "p2")],
            Some(status(&[(pg, "p2", &[])])),
            &["teardown c1 superseded", "keep postgres instance=p2"],
        ),
        (
            "a container from before incarnations that the row's status publishes is kept",
            Some(desired(&[pg], &[])),
            vec![unlabelled(running("c1", pg, &[], "p1"))],
            Some(status(&[(pg, "p1", &[])])),
            &["keep postgres instance=p1"],
        ),
        (
            "a container from before incarnations that no status of the row publishes is replaced",
            Some(desired(&[pg], &[])),
            vec![unlabelled(running("c1", pg, &[], "p1"))],
            None,
            &["provision postgres replace features=[] reuse=no port=- replace=[c1]"],
        ),
        (
            "an unreadable row keeps even an earlier incarnation's container",
            Some(invalid(desired(&[pg], &[]))),
            vec![earlier(running("c1", pg, &[], "p1"))],
            None,
            &[],
        ),
        (
            "a deleted row's containers of any incarnation wait for the grace window",
            None,
            vec![
                earlier(container("c1", pg, ContainerState::Running, &[], "p1", YOUNG)),
                container("c2", rd, ContainerState::Running, &[], "r1", YOUNG),
            ],
            None,
            &["wait c1 +60s", "wait c2 +60s"],
        ),
        (
            "an expired row's earlier incarnation goes at once, its own containers by their age",
            Some(expiring(desired(&[pg], &[]), ago(1))),
            vec![
                earlier(container("c1", pg, ContainerState::Running, &[], "p1", YOUNG)),
                container("c2", pg, ContainerState::Running, &[], "p2", YOUNG),
            ],
            Some(status(&[(pg, "p2", &[])])),
            &["teardown c1 superseded", "wait c2 +60s"],
        ),
    ]
}

#[test]
fn the_incarnation_table_holds() {
    let mut failures = Vec::new();
    for (name, desired, observed, status, expected) in incarnation_table() {
        let got = plan_at(desired.as_ref(), &observed, status.as_ref());
        if got != expected {
            failures.push(format!(
                "{name}\n  expected: {expected:#?}\n  got:      {got:#?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn incarnation_table_names_are_unique() {
    let table = incarnation_table();
    let names: BTreeSet<&str> = table.iter().map(|r| r.0).collect();
    assert_eq!(names.len(), table.len());
}

#[test]
fn a_re_inserted_row_converges_to_containers_and_credentials_of_its_own_incarnation_only() {
    for (name, desired, observed, status, _) in incarnation_table() {
        let Some(d) = desired.filter(|d| d.invalid.is_none() && !d.is_expired(now())) else {
            continue;
        };
        let mut world = World {
            now: now(),
            observed,
            status,
            minted: 0,
        };
        for round in 0.. {
            let actions = plan(
                Some(&d),
                &world.observed,
                world.status.as_ref(),
                world.now,
                GRACE,
            );
            if actions.iter().all(|a| matches!(a, Action::Keep { .. })) {
                break;
            }
            assert!(round < 3, "{name}: still acting: {:?}", summaries(&actions));
            world.apply(Some(&d), &actions);
        }
        let status = world.status.as_ref().expect("a status");
        for c in &world.observed {
            assert_ne!(
                c.labels.incarnation.as_deref(),
                Some(EARLIER),
                "{name}: {c:?}"
            );
            assert_eq!(
                status.services[c.labels.engine.as_str()].instance,
                c.labels.instance,
                "{name}"
            );
        }
        assert_eq!(world.observed.len(), d.services.len(), "{name}");
    }
}

#[test]
fn an_earlier_incarnations_credentials_are_never_reused_even_by_a_heal() {
    // The earlier incarnation's container died; its status (of that
    // incarnation) is not passed to the plan: a fresh create, never a heal.
    let d = desired(&["postgres"], &[]);
    let dead = earlier(exited("c1", "postgres", &[], "p1"));
    let actions = plan(Some(&d), &[dead], None, now(), GRACE);
    assert_eq!(
        summaries(&actions),
        [
            "teardown c1 superseded",
            "provision postgres create features=[] reuse=no port=- replace=[]"
        ]
    );
}

// ---------------------------------------------------------------------------
// Pause on idle
// ---------------------------------------------------------------------------

fn pausing(d: DesiredSandbox) -> DesiredSandbox {
    DesiredSandbox {
        idle_action: IdleAction::Pause,
        ..d
    }
}

#[test]
fn an_idle_row_that_asks_to_pause_stays_wanted_keeps_its_containers_and_is_to_be_paused() {
    let d = pausing(idle_after(desired(&["postgres"], &[]), 3, 5));
    let observed = [running("c1", "postgres", &[], "i1")];
    let s = status(&[("postgres", "i1", &[])]);
    let p = super::plan(
        Some(&d),
        &observed,
        Some(&s),
        None,
        None,
        now(),
        &policy(None),
    );
    assert_eq!(p.wanted, Wanted::Yes);
    assert!(p.pause);
    assert_eq!(p.kept().count(), 1);
    assert_eq!(p.teardowns().count(), 0);
    // Nothing to look at again for idleness: a touch wakes the controller.
    assert_eq!(p.recheck_at, None);
}

#[test]
fn a_row_that_asks_to_pause_is_looked_at_again_when_it_would_go_idle_and_not_paused_before() {
    let d = pausing(idle_after(desired(&["postgres"], &[]), 3, 1));
    let observed = [running("c1", "postgres", &[], "i1")];
    let s = status(&[("postgres", "i1", &[])]);
    let p = super::plan(
        Some(&d),
        &observed,
        Some(&s),
        None,
        None,
        now(),
        &policy(None),
    );
    assert_eq!(p.wanted, Wanted::Yes);
    assert!(!p.pause);
    assert_eq!(p.recheck_at, Some(ago(1) + chrono::Duration::seconds(3)));
}

/// (idle action, row timeout, controller default, persistent, seconds
/// since last used, paused, wanted)
type PauseRow = (
    IdleAction,
    Option<u64>,
    Option<u64>,
    bool,
    i64,
    bool,
    Wanted,
);

#[test]
fn the_pause_decision_table_covers_the_idle_action_the_timeouts_and_persistence() {
    use IdleAction::{Pause, Release};
    let rows: [PauseRow; 8] = [
        (Pause, Some(3), None, false, 5, true, Wanted::Yes),
        (Pause, Some(3), None, false, 1, false, Wanted::Yes),
        (Pause, None, Some(3), false, 5, true, Wanted::Yes),
        (Pause, None, None, false, 5000, false, Wanted::Yes),
        (Pause, Some(0), Some(3), false, 5000, false, Wanted::Yes),
        // Pausing keeps the data: a persistent sandbox may pause.
        (Pause, Some(3), None, true, 5, true, Wanted::Yes),
        (Release, Some(3), None, false, 5, false, Wanted::Idle),
        (Release, Some(3), None, true, 5, false, Wanted::Yes),
    ];
    for (action, timeout, default, persistent, last_used, paused, wanted) in rows {
        let mut d = desired(&["postgres"], &[]);
        d.idle_action = action;
        d.idle_timeout = timeout.map(secs);
        d.persistent = persistent;
        d.last_used_at = ago(last_used);
        let p = super::plan(Some(&d), &[], None, None, None, now(), &policy(default));
        let row = (action, timeout, default, persistent, last_used);
        assert_eq!(p.pause, paused, "{row:?}");
        assert_eq!(p.wanted, wanted, "{row:?}");
    }
}

#[test]
fn a_paused_container_counts_as_alive_and_is_kept_not_healed() {
    let d = pausing(idle_after(desired(&["postgres"], &[]), 3, 5));
    let mut c = running("c1", "postgres", &[], "i1");
    c.paused = true;
    let s = status(&[("postgres", "i1", &[])]);
    let p = super::plan(
        Some(&d),
        &[c.clone()],
        Some(&s),
        None,
        None,
        now(),
        &policy(None),
    );
    assert_eq!(p.kept().count(), 1);
    assert_eq!(p.provisions().count(), 0);
    // Used again: still kept (the controller thaws it), not re-created.
    let used = idle_after(desired(&["postgres"], &[]), 3, 0);
    let p = super::plan(
        Some(&used),
        &[c],
        Some(&s),
        None,
        None,
        now(),
        &policy(None),
    );
    assert!(!p.pause);
    assert_eq!(p.kept().count(), 1);
    assert_eq!(p.provisions().count(), 0);
}

#[test]
fn a_paused_sandbox_whose_row_is_deleted_is_reaped_like_any_other() {
    let mut c = running("c1", "postgres", &[], "i1");
    c.paused = true;
    let s = status(&[("postgres", "i1", &[])]);
    let p = super::plan(
        None,
        &[c],
        Some(&s),
        None,
        Some(ago(SEEN_GONE)),
        now(),
        &policy(None),
    );
    assert_eq!(p.wanted, Wanted::Deleted);
    assert_eq!(
        p.teardowns().map(|t| t.reason).collect::<Vec<_>>(),
        [ReapReason::Deleted]
    );
}

// ---------------------------------------------------------------------------
// Isolation levels
// ---------------------------------------------------------------------------

fn under(
    mut c: ObservedContainer,
    isolation: crate::domain::isolation::Isolation,
) -> ObservedContainer {
    c.labels.isolation = isolation;
    c
}

#[test]
fn a_container_under_the_sandbox_s_isolation_level_keeps_serving() {
    use crate::domain::isolation::Isolation::{Container, Gvisor};
    let s = status(&[("postgres", "p1", &[])]);
    // (row's level, controller's floor, the running container's level)
    for (row, floor, running_under) in [
        (None, Container, Container),
        (Some(Gvisor), Container, Gvisor),
        (None, Gvisor, Gvisor),
        (Some(Container), Gvisor, Gvisor),
    ] {
        let mut d = desired(&["postgres"], &[]);
        d.isolation = row;
        let policy = Policy {
            isolation: floor,
            ..Policy::with_grace(GRACE)
        };
        let c = under(running("c1", "postgres", &[], "p1"), running_under);
        let actions = super::plan(Some(&d), &[c], Some(&s), None, None, now(), &policy).actions;
        assert_eq!(
            summaries(&actions),
            ["keep postgres instance=p1"],
            "{row:?} {floor:?}"
        );
    }
}

#[test]
fn a_row_that_raises_its_isolation_level_rotates_to_a_new_container() {
    use crate::domain::isolation::Isolation::{Container, Gvisor};
    let s = status(&[("postgres", "p1", &[])]);
    // The row asks for gVisor; its container runs under runc.
    let mut d = desired(&["postgres"], &[]);
    d.isolation = Some(Gvisor);
    let c = under(running("c1", "postgres", &[], "p1"), Container);
    let actions = plan(Some(&d), &[c], Some(&s), now(), GRACE);
    assert_eq!(
        summaries(&actions),
        ["provision postgres rotate features=[] reuse=no port=- replace=[] then retire=c1"]
    );
    // The operator raises every sandbox's level (--runtime runsc).
    let d = desired(&["postgres"], &[]);
    let c = under(running("c1", "postgres", &[], "p1"), Container);
    let policy = Policy {
        isolation: Gvisor,
        ..Policy::with_grace(GRACE)
    };
    let actions = super::plan(Some(&d), &[c], Some(&s), None, None, now(), &policy).actions;
    assert_eq!(
        summaries(&actions),
        ["provision postgres rotate features=[] reuse=no port=- replace=[] then retire=c1"]
    );
}

#[test]
fn a_row_that_lowers_its_isolation_level_below_the_container_s_rotates_too() {
    use crate::domain::isolation::Isolation::{Container, Gvisor};
    let s = status(&[("postgres", "p1", &[])]);
    let mut d = desired(&["postgres"], &[]);
    d.isolation = Some(Container);
    let c = under(running("c1", "postgres", &[], "p1"), Gvisor);
    let actions = plan(Some(&d), &[c], Some(&s), now(), GRACE);
    assert_eq!(
        summaries(&actions),
        ["provision postgres rotate features=[] reuse=no port=- replace=[] then retire=c1"]
    );
}

#[test]
fn a_container_serves_only_the_seed_its_row_names() {
    use crate::domain::seed::SeedHash;
    let hash = |c: char| SeedHash::parse(&format!("sha256:{}", c.to_string().repeat(64)));
    let (a, b) = (hash('a'), hash('b'));
    // (what, the row's seed, the container's seed label, the published
    // seed, whether the container runs) → (the action, the seed it loads).
    type Case<'a> = (
        &'a str,
        Option<SeedHash>,
        Option<SeedHash>,
        Option<SeedHash>,
        bool,
        &'a str,
        Option<SeedHash>,
    );
    let cases: [Case; 6] = [
        (
            "its seed, running: kept",
            a.clone(),
            a.clone(),
            a.clone(),
            true,
            "keep",
            None,
        ),
        (
            "no seed anywhere: kept",
            None,
            None,
            None,
            true,
            "keep",
            None,
        ),
        (
            "the row names another seed: fresh credentials, the new seed",
            b.clone(),
            a.clone(),
            a.clone(),
            true,
            "provision postgres rotate",
            b.clone(),
        ),
        (
            "the row drops its seed: fresh credentials, empty",
            None,
            a.clone(),
            a.clone(),
            true,
            "provision postgres rotate",
            None,
        ),
        (
            "its container died: healed with the seed again",
            a.clone(),
            a.clone(),
            a.clone(),
            false,
            "provision postgres heal",
            a.clone(),
        ),
        (
            "it died and the row names another seed: fresh credentials",
            b.clone(),
            a.clone(),
            a.clone(),
            false,
            "provision postgres rotate",
            b.clone(),
        ),
    ];
    for (what, row, label, published_seed, runs, action, loads) in cases {
        let mut d = desired(&["postgres"], &[]);
        if let Some(row) = row {
            d.seeds.insert(engine("postgres"), row);
        }
        let mut c = if runs {
            running("c1", "postgres", &[], "p1")
        } else {
            exited("c1", "postgres", &[], "p1")
        };
        c.labels.seed = label;
        let mut s = status(&[("postgres", "p1", &[])]);
        s.services.get_mut("postgres").unwrap().seed = published_seed;
        let actions = plan(Some(&d), &[c], Some(&s), now(), GRACE);
        let first = summaries(&actions).remove(0);
        assert!(first.starts_with(action), "{what}: {first}");
        let loaded = actions.iter().find_map(|a| match a {
            Action::Provision(p) => Some(p.seed.clone()),
            _ => None,
        });
        assert_eq!(loaded.flatten(), loads, "{what}");
    }
}
