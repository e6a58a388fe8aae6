//! Events: what sandboxd did to one sandbox, kept in `sandbox_events` and
//! shown by `sandboxd describe` (like Kubernetes Events). Each constructor
//! here words one kind of event from what the reconcile planned and what
//! came of it; a [`Journal`] collects a reconcile's events and scrubs them
//! of every password the reconcile saw. Pure, so every message is a test.

use super::crash_loop::HealGate;
use super::id::{EngineName, Incarnation, SandboxId};
use super::plan::{HealCause, Provision, ProvisionReason, ReapReason, Teardown};
use super::sandbox::{SandboxStatus, ServiceStatus};
use chrono::{DateTime, Utc};
use std::fmt;
use std::time::Duration;

/// The longest message kept (the table refuses longer ones; the tail of a
/// long error is cut).
pub(crate) const MAX_MESSAGE: usize = 1000;

/// What happened, as stored in `sandbox_events.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventReason {
    /// An engine's container was created and is ready with fresh
    /// credentials (cold or from a template).
    Provisioned,
    /// A new engine was served by claiming a ready warm-pool container.
    Claimed,
    /// A dead or vanished container was re-created with the same
    /// credentials (`detail`: the cause).
    Healed,
    /// The features grew: a new container with the union and fresh
    /// credentials replaced the old one.
    Rotated,
    /// A container was torn down (`detail`: why).
    Reaped,
    /// Something failed (`detail`: what was attempted); retried with
    /// backoff.
    Failed,
    /// A container that keeps dying is not healed for now (crash-loop
    /// back-off), or no more at this generation.
    BackOff,
    /// Nothing was created: the row waits for its owner's quota or the
    /// host's memory budget (`detail`: owner, budget or never).
    Waiting,
    /// An idle sandbox's containers were frozen (its row asks to pause).
    Paused,
    /// A paused sandbox's containers were thawed: it was used again.
    Resumed,
    /// The sandbox's data was recorded as a checkpoint (`detail`: its name).
    Checkpointed,
    /// The sandbox's data went back to a checkpoint (`detail`: its name,
    /// `baseline` for the empty database).
    Reset,
    /// A new engine container started from the row's seed (`detail`: the
    /// seed's hash, shortened; the message has it whole).
    Seeded,
    /// A fork's engine container started from its copy of the source's
    /// data (`detail`: the source's id).
    Forked,
}

impl EventReason {
    /// Every reason.
    pub const ALL: [EventReason; 14] = [
        EventReason::Provisioned,
        EventReason::Claimed,
        EventReason::Healed,
        EventReason::Rotated,
        EventReason::Reaped,
        EventReason::Failed,
        EventReason::BackOff,
        EventReason::Waiting,
        EventReason::Paused,
        EventReason::Resumed,
        EventReason::Checkpointed,
        EventReason::Reset,
        EventReason::Seeded,
        EventReason::Forked,
    ];

    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::Provisioned => "provisioned",
            EventReason::Claimed => "claimed",
            EventReason::Healed => "healed",
            EventReason::Rotated => "rotated",
            EventReason::Reaped => "reaped",
            EventReason::Failed => "failed",
            EventReason::BackOff => "backoff",
            EventReason::Waiting => "waiting",
            EventReason::Paused => "paused",
            EventReason::Resumed => "resumed",
            EventReason::Checkpointed => "checkpointed",
            EventReason::Reset => "reset",
            EventReason::Seeded => "seeded",
            EventReason::Forked => "forked",
        }
    }

    /// Whether the event says something went wrong (Kubernetes' `Warning`).
    pub fn is_warning(self) -> bool {
        matches!(self, EventReason::Failed | EventReason::BackOff)
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a ready container came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A ready warm-pool container, claimed.
    Pool,
    /// A container started from a pre-initialised template.
    Template,
    /// A container that initialised its data at start.
    Cold,
    /// A container that initialised its data at start because its
    /// template's volume is refused (counted as `cold`; the event says
    /// why, so `sandboxd describe` shows it).
    ColdTemplateRefused(super::template_volume::Refusal),
    /// A fork's container, started from its copy of the source's data.
    Fork,
    /// A container started from its seed's template (a copy of a
    /// container the seed was loaded into once; counted as `template`).
    SeedTemplate,
}

impl Origin {
    /// Label value for metrics and events.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Origin::Pool => "pool",
            Origin::Template | Origin::SeedTemplate => "template",
            Origin::Cold | Origin::ColdTemplateRefused(_) => "cold",
            Origin::Fork => "fork",
        }
    }

    fn phrase(self) -> String {
        match self {
            Origin::Pool => "from the warm pool".to_owned(),
            Origin::Template => "from the template".to_owned(),
            Origin::Cold => "cold".to_owned(),
            Origin::Fork => "from its copy of the source's data".to_owned(),
            Origin::SeedTemplate => "from its seed's template".to_owned(),
            Origin::ColdTemplateRefused(refusal) => format!(
                "cold (its template is refused [{}]: {}; see SandboxdTemplateRefused in docs/runbook.md)",
                refusal.as_str(),
                refusal.phrase()
            ),
        }
    }
}

/// One event to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub reason: EventReason,
    /// The engine it happened to, if one.
    pub engine: Option<String>,
    /// A short machine-readable detail: the heal cause, the reap reason,
    /// where a container came from, or what failed.
    pub detail: Option<String>,
    /// What an operator reads.
    pub message: String,
}

/// How a provision ended well.
#[derive(Debug, Clone, Copy)]
pub struct Done<'a> {
    /// The published status of the new container.
    pub status: &'a ServiceStatus,
    pub(crate) origin: Origin,
    /// How long the provision took.
    pub elapsed: Duration,
    /// Whether the sandbox's data is on a volume (kept across a heal).
    pub(crate) data_kept: bool,
}

/// `1.23 s` or `35 ms`.
fn took(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// `image I, features a, b` (or `image I, no features`).
fn what_runs(status: &ServiceStatus) -> String {
    let image = if status.image.is_empty() {
        String::new()
    } else {
        format!("image {}, ", status.image)
    };
    let features = if status.available_extensions.is_empty() {
        "no features".to_owned()
    } else {
        format!("features {}", status.available_extensions.join(", "))
    };
    format!("{image}{features}")
}

impl Event {
    fn new(
        reason: EventReason,
        engine: Option<&str>,
        detail: Option<&str>,
        message: String,
    ) -> Self {
        Self {
            reason,
            engine: engine.map(str::to_owned),
            detail: detail.map(str::to_owned),
            message,
        }
    }

    /// A provision that ended with the engine ready. `cause` says why a
    /// heal was needed.
    pub(crate) fn provisioned(p: &Provision, cause: Option<HealCause>, done: Done<'_>) -> Self {
        let engine = Some(p.engine.as_str());
        let (origin, took) = (done.origin.phrase(), took(done.elapsed));
        let runs = what_runs(done.status);
        match p.reason {
            ProvisionReason::Heal => {
                let cause = cause.unwrap_or(HealCause::Exited);
                let data = if done.data_kept {
                    "; its data was kept on the sandbox's volume"
                } else {
                    "; its data starts empty"
                };
                Self::new(
                    EventReason::Healed,
                    engine,
                    Some(cause.as_str()),
                    format!(
                        "{}: re-created with the same credentials {origin} in {took} (heal {}){data}",
                        cause.phrase(),
                        done.status.heals
                    ),
                )
            }
            ProvisionReason::Rotate => Self::new(
                EventReason::Rotated,
                engine,
                Some(done.origin.as_str()),
                format!(
                    "the row asks for more than the container gives (features, seed or isolation level): a new container with fresh credentials {origin} in {took} replaced the old one ({runs})"
                ),
            ),
            ProvisionReason::Create | ProvisionReason::Replace => {
                let (reason, what) = match (done.origin, p.reason) {
                    (Origin::Pool, _) => (EventReason::Claimed, "claimed a ready warm-pool container"),
                    (_, ProvisionReason::Replace) => (
                        EventReason::Provisioned,
                        "replaced a container whose credentials were never published (sandboxd stopped while provisioning it)",
                    ),
                    _ => (EventReason::Provisioned, "created"),
                };
                let origin = if done.origin == Origin::Pool { "" } else { &origin };
                let sep = if origin.is_empty() { "" } else { " " };
                Self::new(
                    reason,
                    engine,
                    Some(done.origin.as_str()),
                    format!("{what}{sep}{origin}: ready in {took} ({runs})"),
                )
            }
        }
    }

    /// The seed a provision that ended with the engine ready started it
    /// from, if any: loaded into it, or (a claim) into the pool container
    /// before it was offered.
    pub(crate) fn seeded(p: &Provision, origin: Origin, from_file: bool) -> Option<Self> {
        let seed = p.seed.as_ref()?;
        let how = if origin == Origin::Pool {
            "the warm-pool container was seeded before it was claimed"
        } else if origin == Origin::SeedTemplate {
            "its seed's template, a copy of a container the seed was loaded into once"
        } else if from_file {
            "its data file, which the engine loaded at its start"
        } else {
            "loaded as the agent once the engine was ready"
        };
        Some(Self::new(
            EventReason::Seeded,
            Some(p.engine.as_str()),
            Some(&format!("sha256:{}", seed.short())),
            format!("started from seed {seed}: {how}"),
        ))
    }

    /// The source whose data a fork's provision that ended with the
    /// engine ready started it from, if it did: copied now, or (a heal)
    /// the copy made when the engine was first provisioned.
    pub(crate) fn forked(p: &Provision, origin: Origin, source: &SandboxId) -> Option<Self> {
        if origin != Origin::Fork {
            return None;
        }
        let how = if p.reason == ProvisionReason::Heal {
            format!(
                "started again from its copy of sandbox {source}'s data, made when it was forked"
            )
        } else {
            format!("started from a copy of sandbox {source}'s data, taken with the source frozen for the copy; fresh credentials")
        };
        Some(Self::new(
            EventReason::Forked,
            Some(p.engine.as_str()),
            Some(source.as_str()),
            how,
        ))
    }

    /// A provision that failed with `error`.
    pub(crate) fn provision_failed(p: &Provision, cause: Option<HealCause>, error: &str) -> Self {
        let attempt = match p.reason {
            ProvisionReason::Heal => format!(
                "healing ({}) failed",
                cause.unwrap_or(HealCause::Exited).phrase()
            ),
            ProvisionReason::Rotate => {
                "rotating to a new container (more features, another seed or a stronger isolation level) failed"
                    .to_owned()
            }
            ProvisionReason::Create => "provisioning failed".to_owned(),
            ProvisionReason::Replace => "replacing an unpublished container failed".to_owned(),
        };
        Self::new(
            EventReason::Failed,
            Some(p.engine.as_str()),
            Some(p.reason.as_str()),
            format!("{attempt}: {error}; retried with backoff"),
        )
    }

    /// A row whose new engines wait for admission (`detail`: the
    /// [`WaitReason`](super::admission::WaitReason)); nothing was created.
    pub(crate) fn admission_waiting(reason: super::admission::WaitReason, message: &str) -> Self {
        Self::new(
            EventReason::Waiting,
            None,
            Some(reason.as_str()),
            message.to_owned(),
        )
    }

    /// An engine that could not even be attempted (`detail`: why, e.g.
    /// `image`).
    pub(crate) fn not_provisioned(engine: EngineName, detail: &str, error: &str) -> Self {
        Self::new(
            EventReason::Failed,
            Some(engine.as_str()),
            Some(detail),
            format!("{error}; retried with backoff"),
        )
    }

    /// The switch to a rotation's new container, published before sandboxd
    /// stopped, was finished (or failed with `error`).
    pub(crate) fn promoted(engine: EngineName, error: Option<&str>) -> Self {
        match error {
            None => Self::new(
                EventReason::Rotated,
                Some(engine.as_str()),
                Some("resumed"),
                "finished switching to the rotation's new container, published before sandboxd stopped".to_owned(),
            ),
            Some(e) => Self::new(
                EventReason::Failed,
                Some(engine.as_str()),
                Some("rotate"),
                format!("finishing the switch to the rotation's new container failed: {e}; retried with backoff"),
            ),
        }
    }

    /// A container torn down (`error`: the removal failed and is retried).
    pub(crate) fn reaped(t: &Teardown, error: Option<&str>) -> Self {
        let why = match t.reason {
            ReapReason::Deleted => "the sandbox was released (its row deleted)",
            ReapReason::Orphan => "it belongs to no row and no status",
            ReapReason::ServiceDropped => "the row no longer requests this engine",
            ReapReason::Expired => "the row is past its expires_at",
            ReapReason::Duplicate => "another container serves this engine",
            ReapReason::Idle => "the sandbox was idle for its idle timeout",
            ReapReason::OwnerGone => "the row's owner container is gone",
            ReapReason::Superseded => {
                "it belongs to an earlier incarnation of the id (deleted and inserted again)"
            }
        };
        let engine = Some(t.engine.as_str());
        match error {
            None => Self::new(
                EventReason::Reaped,
                engine,
                Some(t.reason.as_str()),
                format!("container {} torn down: {why}", t.container),
            ),
            Some(e) => Self::new(
                EventReason::Failed,
                engine,
                Some("teardown"),
                format!(
                    "tearing container {} down ({why}) failed: {e}; retried with backoff",
                    t.container
                ),
            ),
        }
    }

    /// A heal held back by the crash-loop back-off. It reads the same at
    /// every death, so that repeats are counted, not stored (the status
    /// says how many and when the next heal is).
    pub(crate) fn held(engine: EngineName, gate: HealGate) -> Self {
        let message = match gate {
            HealGate::At { .. } => "crash loop: its container keeps dying on its own; each heal waits twice as long as the last, up to the cap, and heals go on; its last container's logs say why it dies".to_owned(),
            HealGate::Now => "its container keeps dying: healing it now".to_owned(),
        };
        Self::new(
            EventReason::BackOff,
            Some(engine.as_str()),
            Some("crash_loop"),
            message,
        )
    }

    /// Containers the row names in `attach` that could not be attached.
    pub(crate) fn attach_failed(failures: &[String]) -> Self {
        Self::new(
            EventReason::Failed,
            None,
            Some("attach"),
            format!("{}; retried with backoff", failures.join("; ")),
        )
    }

    /// The idle sandbox's `engines` were frozen (`None`), or freezing
    /// failed with `error` (a `failed` event, detail `pause`).
    pub fn paused(engines: &[String], error: Option<&str>) -> Self {
        match error {
            None => Self::new(
                EventReason::Paused,
                None,
                None,
                format!(
                    "paused {}: idle for longer than its idle timeout (no request, touch or client connection); frozen with their data and credentials until a request, a touch or `sandboxd resume`",
                    engines.join(", ")
                ),
            ),
            Some(e) => Self::new(
                EventReason::Failed,
                None,
                Some("pause"),
                format!("pausing the idle sandbox failed: {e}; retried with backoff"),
            ),
        }
    }

    /// The paused sandbox's containers were thawed in `elapsed` (`None`),
    /// or thawing failed with `error` (a `failed` event, detail `resume`).
    pub fn resumed(engines: &[String], elapsed: Duration, error: Option<&str>) -> Self {
        match error {
            None => Self::new(
                EventReason::Resumed,
                None,
                None,
                format!(
                    "resumed {} in {}: used again; same data and credentials",
                    engines.join(", "),
                    took(elapsed)
                ),
            ),
            Some(e) => Self::new(
                EventReason::Failed,
                None,
                Some("resume"),
                format!("resuming the paused sandbox failed: {e}; retried with backoff"),
            ),
        }
    }

    /// Checkpoint `name` of the sandbox was recorded: `size` bytes (all
    /// engines), taken in `elapsed`.
    pub fn checkpointed(name: &str, size: u64, elapsed: Duration) -> Self {
        Self::new(
            EventReason::Checkpointed,
            None,
            Some(name),
            format!(
                "checkpoint {name} recorded ({}) in {}",
                super::checkpoint::mib(size),
                took(elapsed)
            ),
        )
    }

    /// The sandbox's data went back to checkpoint `name` in `elapsed`;
    /// connected clients' sessions were closed.
    pub fn reset(name: &str, elapsed: Duration) -> Self {
        let what = if name == super::checkpoint::BASELINE {
            "the baseline (empty, with its features)".to_owned()
        } else {
            format!("checkpoint {name}")
        };
        Self::new(
            EventReason::Reset,
            None,
            Some(name),
            format!(
                "data reset to {what} in {}, same credentials; connected sessions were closed",
                took(elapsed)
            ),
        )
    }

    /// A checkpoint (`what` = `checkpoint`) or reset (`reset`) of `name`
    /// failed with `error` (the request is marked failed, not retried).
    pub(crate) fn checkpoint_failed(what: &str, name: &str, error: &str) -> Self {
        Self::new(
            EventReason::Failed,
            None,
            Some(what),
            format!("{what} {name} failed: {error}"),
        )
    }

    /// A whole reconcile failed with `error` before it could say more.
    pub(crate) fn reconcile_failed(error: &str) -> Self {
        Self::new(
            EventReason::Failed,
            None,
            Some("reconcile"),
            format!("{error}; retried with backoff"),
        )
    }
}

/// `text` with every non-empty secret replaced by `***`, cut to
/// [`MAX_MESSAGE`] characters.
pub(crate) fn scrub<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        if !secret.is_empty() {
            out = out.replace(secret, "***");
        }
    }
    if out.chars().count() > MAX_MESSAGE {
        out = out.chars().take(MAX_MESSAGE - 1).collect();
        out.push('…');
    }
    out
}

/// A reconcile's events, and what is needed to record them: whose sandbox
/// it is (the owner row-level security filters by, the incarnation) and
/// every password the reconcile saw, which no message may hold.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    events: Vec<Event>,
    secrets: Vec<super::secret::Secret>,
    /// The owner to record (the row's, or the containers' label's once the
    /// row is gone).
    pub(crate) owner: Option<String>,
    pub(crate) incarnation: Option<Incarnation>,
}

impl Journal {
    pub(crate) fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    /// Remembers every password `status` holds, so that no message shows it.
    pub(crate) fn saw(&mut self, status: &SandboxStatus) {
        for s in status.services.values() {
            self.saw_service(s);
        }
    }

    /// Remembers one engine's password.
    pub(crate) fn saw_service(&mut self, status: &ServiceStatus) {
        if !status.password.expose().is_empty() {
            self.secrets.push(status.password.clone());
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events so far, scrubbed, leaving the journal empty.
    pub(crate) fn take(&mut self) -> Vec<Event> {
        let secrets: Vec<&str> = self.secrets.iter().map(|s| s.expose()).collect();
        std::mem::take(&mut self.events)
            .into_iter()
            .map(|mut e| {
                e.message = scrub(&e.message, secrets.iter().copied());
                e
            })
            .collect()
    }
}

/// One stored event, as read back for `describe`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecordedEvent {
    /// The last time it happened.
    pub last_at: DateTime<Utc>,
    /// The first time it happened (equal events in a row are one, counted).
    pub first_at: DateTime<Utc>,
    /// How many times it happened in a row.
    pub count: i32,
    /// What happened (an [`EventReason`], as text: a newer sandboxd may
    /// have written one this binary does not know).
    pub reason: String,
    /// The engine, if one.
    pub engine: Option<String>,
    /// The detail (heal cause, reap reason, origin, what failed).
    pub detail: Option<String>,
    /// The message.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::id::ContainerId;
    use crate::domain::secret::Secret;
    use std::collections::{BTreeMap, BTreeSet};

    fn service(password: &str, heals: u32) -> ServiceStatus {
        ServiceStatus {
            host: "postgres".into(),
            port: 5432,
            host_port: 49153,
            user: "sandbox".into(),
            password: Secret::new(password),
            database: "sandbox".into(),
            url: format!("postgres://sandbox:{password}@postgres:5432/sandbox"),
            env: BTreeMap::new(),
            available_extensions: vec!["pg_trgm".into()],
            instance: "i1".into(),
            ready_at: None,
            heals,
            image: "sandboxd/postgres:17".into(),
            node: None,
            seed: None,
        }
    }

    fn provision(reason: ProvisionReason) -> Provision {
        Provision {
            engine: EngineName::of_engine("postgres"),
            features: BTreeSet::new(),
            reuse: Some(service("pw", 0)),
            host_port: None,
            replace: vec![ContainerId::new("old")],
            retire: None,
            reason,
            seed: None,
        }
    }

    #[test]
    fn a_fork_says_whose_data_it_started_from_and_whether_the_copy_is_new() {
        let source = SandboxId::parse("agent-7").unwrap();
        let cases = [
            (
                ProvisionReason::Create,
                Origin::Fork,
                Some("taken with the source frozen"),
            ),
            (
                ProvisionReason::Heal,
                Origin::Fork,
                Some("started again from its copy"),
            ),
            (ProvisionReason::Create, Origin::Template, None),
            (ProvisionReason::Heal, Origin::Cold, None),
        ];
        for (reason, origin, says) in cases {
            let e = Event::forked(&provision(reason), origin, &source);
            match (e, says) {
                (Some(e), Some(says)) => {
                    assert_eq!(e.reason, EventReason::Forked);
                    assert_eq!(e.detail.as_deref(), Some("agent-7"));
                    assert!(e.message.contains(says), "{reason:?}: {}", e.message);
                    assert!(
                        e.message.contains("sandbox agent-7's data"),
                        "{}",
                        e.message
                    );
                }
                (None, None) => {}
                (e, _) => panic!("{reason:?} {origin:?}: {e:?}"),
            }
        }
    }

    #[test]
    fn a_heal_names_its_cause_origin_and_count_and_never_a_credential() {
        let status = service("s3cret-password", 3);
        let e = Event::provisioned(
            &provision(ProvisionReason::Heal),
            Some(HealCause::Oom),
            Done {
                status: &status,
                origin: Origin::Template,
                elapsed: Duration::from_millis(707),
                data_kept: false,
            },
        );
        assert_eq!(e.reason, EventReason::Healed);
        assert_eq!(e.detail.as_deref(), Some("oom"));
        assert_eq!(e.engine.as_deref(), Some("postgres"));
        assert_eq!(
            e.message,
            "its container was killed for lack of memory: re-created with the same credentials from the template in 707 ms (heal 3); its data starts empty"
        );
        assert!(!e.message.contains("s3cret"));
    }

    #[test]
    fn a_pool_hit_is_a_claim_and_a_cold_create_says_what_runs() {
        let status = service("pw", 0);
        let done = |origin| Done {
            status: &status,
            origin,
            elapsed: Duration::from_millis(1500),
            data_kept: false,
        };
        let create = provision(ProvisionReason::Create);
        let claimed = Event::provisioned(&create, None, done(Origin::Pool));
        assert_eq!(claimed.reason, EventReason::Claimed);
        assert_eq!(
            claimed.message,
            "claimed a ready warm-pool container: ready in 1.50 s (image sandboxd/postgres:17, features pg_trgm)"
        );
        let cold = Event::provisioned(&create, None, done(Origin::Cold));
        assert_eq!(cold.reason, EventReason::Provisioned);
        assert_eq!(cold.detail.as_deref(), Some("cold"));
        assert_eq!(
            cold.message,
            "created cold: ready in 1.50 s (image sandboxd/postgres:17, features pg_trgm)"
        );
        let rotated = Event::provisioned(
            &provision(ProvisionReason::Rotate),
            None,
            done(Origin::Cold),
        );
        assert_eq!(rotated.reason, EventReason::Rotated);
        // A cold start for a refused template says so (describe shows it)
        // and counts as cold.
        let refused = Event::provisioned(
            &create,
            None,
            done(Origin::ColdTemplateRefused(
                super::super::template_volume::Refusal::AnotherDeployment,
            )),
        );
        assert_eq!(refused.detail.as_deref(), Some("cold"));
        assert!(
            refused.message.starts_with(
                "created cold (its template is refused [another_deployment]: a volume of another deployment"
            ),
            "{}",
            refused.message
        );
        assert!(refused.message.contains("SandboxdTemplateRefused"));
    }

    #[test]
    fn failures_say_what_was_attempted_and_reaps_say_why() {
        let e = Event::provision_failed(
            &provision(ProvisionReason::Heal),
            Some(HealCause::Removed),
            "docker said no",
        );
        assert_eq!(e.reason, EventReason::Failed);
        assert_eq!(e.detail.as_deref(), Some("heal"));
        assert_eq!(
            e.message,
            "healing (its container was removed) failed: docker said no; retried with backoff"
        );
        let t = Teardown {
            container: ContainerId::new("sandboxd-x-postgres"),
            engine: "postgres".into(),
            reason: ReapReason::Idle,
        };
        let reaped = Event::reaped(&t, None);
        assert_eq!(reaped.reason, EventReason::Reaped);
        assert_eq!(reaped.detail.as_deref(), Some("idle"));
        assert!(reaped.message.contains("idle"), "{}", reaped.message);
        let failed = Event::reaped(&t, Some("busy"));
        assert_eq!(failed.reason, EventReason::Failed);
        assert_eq!(failed.detail.as_deref(), Some("teardown"));
        assert!(EventReason::BackOff.is_warning() && !EventReason::Healed.is_warning());
    }

    #[test]
    fn a_held_heal_reads_the_same_each_time_so_repeats_are_counted_not_stored() {
        let pg = EngineName::of_engine("postgres");
        let now = Utc::now();
        let later = now + chrono::Duration::seconds(9);
        assert_eq!(
            Event::held(pg, HealGate::At { at: now, heals: 2 }),
            Event::held(
                pg,
                HealGate::At {
                    at: later,
                    heals: 3
                }
            )
        );
        assert!(Event::held(pg, HealGate::At { at: now, heals: 2 })
            .message
            .contains("heals go on"));
    }

    #[test]
    fn a_journal_scrubs_every_password_it_saw_and_cuts_long_messages() {
        let mut j = Journal::default();
        let old = SandboxStatus {
            id: crate::domain::id::SandboxId::parse("agent-7").unwrap(),
            phase: crate::domain::sandbox::Phase::Ready,
            observed_generation: 1,
            message: String::new(),
            services: [("postgres".to_owned(), Box::new(service("old-pass", 0)))].into(),
            network: None,
            updated_at: None,
            incarnation: None,
        };
        j.saw(&old);
        j.saw_service(&service("new-pass", 0));
        j.push(Event::reconcile_failed(
            "login old-pass failed; url postgres://sandbox:new-pass@x",
        ));
        j.push(Event::reconcile_failed(&"x".repeat(5000)));
        let events = j.take();
        assert!(j.is_empty());
        assert_eq!(
            events[0].message,
            "login *** failed; url postgres://sandbox:***@x; retried with backoff"
        );
        assert_eq!(events[1].message.chars().count(), MAX_MESSAGE);
        assert!(events[1].message.ends_with('…'));
        assert_eq!(
            EventReason::ALL.map(EventReason::as_str).len(),
            EventReason::ALL.len()
        );
    }
}
