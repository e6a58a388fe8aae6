//! `sandboxd describe ID`: one sandbox at a glance, as `kubectl describe`
//! shows an object: what is asked, what runs (endpoint, image, features,
//! heals per engine; credentials only when asked), and its last events,
//! newest last.

use super::table::{age, Table};
use super::CliError;
use crate::client::{Client, RowSummary};
use crate::domain::event::RecordedEvent;
use crate::domain::id::{Deployment, SandboxId};
use crate::domain::network::container_selector;
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus, ServiceStatus};
use chrono::{DateTime, Utc};
use clap::{Args, ValueEnum};
use std::fmt::Write as _;

/// Everything `describe` shows of one sandbox.
#[derive(Debug)]
pub struct Described<'a> {
    /// The sandbox id.
    pub id: &'a str,
    /// Its desired row, if it exists.
    pub desired: Option<&'a DesiredSandbox>,
    /// When the row was inserted, its generation and engines.
    pub row: Option<&'a RowSummary>,
    /// Its status, if sandboxd wrote one.
    pub status: Option<&'a SandboxStatus>,
    /// Its newest events, oldest first.
    pub events: &'a [RecordedEvent],
    /// Whether to show passwords and URLs.
    pub show_secrets: bool,
    /// The deployment that runs it (for the selector of its containers).
    pub deployment: &'a Deployment,
}

impl Described<'_> {
    /// The `docker ps` that lists every container of the sandbox, claimed
    /// warm-pool containers included (see
    /// [`container_selector`]).
    pub fn containers_command(&self) -> String {
        match SandboxId::parse(self.id) {
            Ok(id) => format!(
                "docker ps -a --filter 'name={}'",
                container_selector(self.deployment, &id)
            ),
            Err(_) => "(not a sandbox id)".to_owned(),
        }
    }
}

/// `2026-12-01T21:50:00Z (5m ago)`, or `(in 5m)` for a time to come.
fn when(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let at = t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    if t > now {
        format!("{at} (in {})", age(now, t))
    } else {
        format!("{at} ({} ago)", age(t, now))
    }
}

fn field(out: &mut String, name: &str, value: impl std::fmt::Display) {
    let value = super::table::printable(&value.to_string());
    let _ = writeln!(out, "{:<14}{value}", format!("{name}:"));
}

fn engine(out: &mut String, name: &str, s: &ServiceStatus, show_secrets: bool, now: DateTime<Utc>) {
    let _ = writeln!(out, "  {name}:");
    let line = |out: &mut String, k: &str, v: String| {
        let v = super::table::printable(&v);
        let _ = writeln!(out, "    {:<14}{v}", format!("{k}:"));
    };
    line(
        out,
        "Endpoint",
        match s.host_port {
            // Published nowhere (a Swarm service without --swarm-publish).
            0 => format!(
                "{}:{} on the sandbox's network (not published on the host)",
                s.host, s.port
            ),
            port => format!(
                "{}:{} on the sandbox's network; 127.0.0.1:{port} on the host",
                s.host, s.port
            ),
        },
    );
    line(
        out,
        "Image",
        if s.image.is_empty() {
            "(not recorded)".to_owned()
        } else {
            s.image.clone()
        },
    );
    line(
        out,
        "Features",
        if s.available_extensions.is_empty() {
            "none".to_owned()
        } else {
            s.available_extensions.join(", ")
        },
    );
    if let Some(seed) = &s.seed {
        line(out, "Seed", seed.to_string());
    }
    line(out, "User", format!("{} (database {})", s.user, s.database));
    if show_secrets {
        line(out, "Password", s.password.expose().to_owned());
        line(out, "URL", s.url.clone());
    } else {
        line(out, "Password", "*** (--show-secrets)".to_owned());
    }
    line(out, "Heals", s.heals.to_string());
    if let Some(t) = s.ready_at {
        line(out, "Ready since", when(t, now));
    }
}

/// The text `describe` prints.
pub fn render(d: &Described<'_>, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    field(&mut out, "Name", d.id);
    if let Some(row) = d.desired {
        field(&mut out, "Owner", &row.owner);
    }
    match d.status {
        Some(s) => field(&mut out, "Phase", s.phase),
        None => field(
            &mut out,
            "Phase",
            "pending (sandboxd has not written a status yet)",
        ),
    }
    let observed = d.status.map(|s| s.observed_generation);
    match (d.row.map(|r| r.generation), observed) {
        (Some(g), Some(o)) => field(&mut out, "Generation", format!("{g} (observed {o})")),
        (Some(g), None) => field(&mut out, "Generation", format!("{g} (not observed yet)")),
        (None, Some(o)) => field(
            &mut out,
            "Generation",
            format!("{o} observed; the desired row is gone (released)"),
        ),
        (None, None) => {}
    }
    if let Some(row) = d.row {
        field(&mut out, "Created", when(row.created_at, now));
    }
    if let Some(row) = d.desired {
        desired(&mut out, row, now);
    }
    field(&mut out, "Containers", d.containers_command());
    if let Some(s) = d.status {
        field(
            &mut out,
            "Network",
            s.network.as_deref().unwrap_or("(none yet)"),
        );
        if !s.message.is_empty() {
            field(
                &mut out,
                "Message",
                s.message.replace('\n', "\n              "),
            );
        }
        if !s.services.is_empty() {
            out.push_str("Engines:\n");
            for (name, service) in &s.services {
                engine(&mut out, name, service, d.show_secrets, now);
            }
        }
    }
    events(&mut out, d.events, now);
    out
}

/// The desired row's fields: engines, features, timeouts, persistence,
/// owner container and attached containers.
fn desired(out: &mut String, row: &DesiredSandbox, now: DateTime<Utc>) {
    field(
        out,
        "Services",
        row.services
            .iter()
            .map(|e| e.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    );
    let features: Vec<String> = row
        .features
        .iter()
        .filter(|(_, f)| !f.is_empty())
        .map(|(e, f)| format!("{e}={}", f.iter().cloned().collect::<Vec<_>>().join(",")))
        .collect();
    if !features.is_empty() {
        field(out, "Features", features.join(" "));
    }
    if let Some(t) = row.expires_at {
        field(out, "Expires", when(t, now));
    }
    if let Some(t) = row.idle_timeout {
        let idle = if t.is_zero() {
            "never".to_owned()
        } else {
            format!(
                "{}s without a request or touch (last used {})",
                t.as_secs(),
                when(row.last_used_at, now)
            )
        };
        field(out, "Idle timeout", idle);
    }
    if row.idle_action != crate::domain::sandbox::IdleAction::Release {
        field(
            out,
            "Idle action",
            format!(
                "{} (a request, a touch or `sandboxd resume` resumes it)",
                row.idle_action
            ),
        );
    }
    if let Some(isolation) = row.isolation {
        field(out, "Isolation", isolation);
    }
    field(out, "Persistent", if row.persistent { "yes" } else { "no" });
    if let Some(of) = &row.fork_of {
        field(
            out,
            "Fork of",
            format!("{} (incarnation {})", of.sandbox, of.incarnation),
        );
    }
    if let Some(c) = &row.owner_container {
        field(out, "Owner cont.", c);
    }
    if !row.attach.is_empty() {
        field(out, "Attach", row.attach.join(", "));
    }
}

/// The events table, newest last, or `<none>`.
fn events(out: &mut String, events: &[RecordedEvent], now: DateTime<Utc>) {
    out.push_str("Events:\n");
    if events.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["LAST SEEN", "REASON", "ENGINE", "MESSAGE"]);
        for e in events {
            let repeated = if e.count > 1 {
                format!(" (x{} over {})", e.count, age(e.first_at, e.last_at))
            } else {
                String::new()
            };
            let detail = e
                .detail
                .as_deref()
                .map(|d| format!(" [{d}]"))
                .unwrap_or_default();
            t.row(vec![
                age(e.last_at, now),
                format!("{}{detail}", e.reason),
                e.engine.clone().unwrap_or_else(|| "-".into()),
                format!("{}{repeated}", e.message),
            ]);
        }
        for line in t.render().lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
}

/// What `describe --output json` prints: the desired row's summary, the
/// status (redacted unless `show_secrets`) and the events.
pub fn json(d: &Described<'_>) -> serde_json::Value {
    let status = d.status.map(|s| {
        let s = if d.show_secrets {
            s.clone()
        } else {
            s.redacted()
        };
        let services: serde_json::Map<String, serde_json::Value> = s
            .services
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::to_value(v).unwrap_or_default()))
            .collect();
        serde_json::json!({
            "phase": s.phase,
            "observed_generation": s.observed_generation,
            "message": s.message,
            "network": s.network,
            "services": services,
            "incarnation": s.incarnation.as_ref().map(|i| i.as_str()),
            "updated_at": s.updated_at,
        })
    });
    let desired = d.desired.map(|row| {
        serde_json::json!({
            "owner": row.owner,
            "services": row.services.iter().map(|e| e.as_str()).collect::<Vec<_>>(),
            "features": row.features.iter().map(|(e, f)| (e.as_str(), f)).collect::<std::collections::BTreeMap<_, _>>(),
            "generation": row.generation,
            "expires_at": row.expires_at,
            "persistent": row.persistent,
            "idle_action": row.idle_action.as_str(),
            "isolation": row.isolation.map(|i| i.as_str()),
            "fork_of": row.fork_of.as_ref().map(|f| serde_json::json!({
                "sandbox": f.sandbox.as_str(),
                "incarnation": f.incarnation.as_str(),
            })),
            "owner_container": row.owner_container,
            "attach": row.attach,
            "created_at": d.row.map(|r| r.created_at),
        })
    });
    serde_json::json!({
        "id": d.id,
        "desired": desired,
        "status": status,
        "events": d.events,
        "container_selector": SandboxId::parse(d.id).ok().map(|id| container_selector(d.deployment, &id)),
    })
}

/// Flags of `sandboxd describe`.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// Sandbox id.
    pub id: SandboxId,
    /// Show each engine's password and URL.
    #[arg(long)]
    pub show_secrets: bool,
    /// How many of the newest events to show (1 to 1000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub events: u32,
    /// `text` (for reading) or `json`.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: DescribeOutput,
    /// The deployment that runs the sandbox (`sandboxd run --deployment`):
    /// its containers' names start with it.
    #[arg(long, env = "SANDBOXD_DEPLOYMENT", default_value = "default")]
    pub deployment: Deployment,
}

/// `sandboxd describe --output` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DescribeOutput {
    /// For reading.
    Text,
    /// One JSON object: desired, status, events.
    Json,
}

/// `sandboxd describe ID`.
pub(super) async fn run(url: &str, args: DescribeArgs) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    let (status, desired, row, events) = tokio::try_join!(
        client.status(&args.id),
        client.desired(&args.id),
        client.row(&args.id),
        client.events(&args.id, args.events),
    )?;
    if status.is_none() && desired.is_none() && events.is_empty() {
        return Err(CliError::NotFound(args.id));
    }
    let d = Described {
        id: args.id.as_str(),
        desired: desired.as_ref(),
        row: row.as_ref(),
        status: status.as_ref(),
        events: &events,
        show_secrets: args.show_secrets,
        deployment: &args.deployment,
    };
    match args.output {
        DescribeOutput::Text => say!("{}", render(&d, chrono::Utc::now()).trim_end()),
        DescribeOutput::Json => say!("{}", serde_json::to_string_pretty(&json(&d)).expect("JSON")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::id::SandboxId;
    use crate::domain::sandbox::Phase;
    use crate::domain::secret::Secret;
    use std::collections::BTreeMap;

    fn status() -> SandboxStatus {
        let pg = ServiceStatus {
            host: "postgres".into(),
            port: 5432,
            host_port: 49153,
            user: "sandbox".into(),
            password: Secret::new("hunter2-hunter2-hunter2"),
            database: "sandbox".into(),
            url: "postgres://sandbox:hunter2-hunter2-hunter2@postgres:5432/sandbox".into(),
            env: BTreeMap::new(),
            available_extensions: vec!["pg_trgm".into()],
            instance: "i".into(),
            ready_at: None,
            heals: 2,
            image: "sandboxd/postgres:17".into(),
            node: None,
            seed: None,
        };
        SandboxStatus {
            id: SandboxId::parse("agent-7").unwrap(),
            phase: Phase::Ready,
            observed_generation: 3,
            message: String::new(),
            services: [("postgres".to_owned(), Box::new(pg))].into(),
            network: Some("sandboxd.default.agent-7".into()),
            updated_at: None,
            incarnation: None,
        }
    }

    #[test]
    fn describe_shows_each_engine_and_the_events_newest_last_and_no_secret_unless_asked() {
        let now = Utc::now();
        let s = status();
        let events = [
            RecordedEvent {
                last_at: now - chrono::Duration::seconds(300),
                first_at: now - chrono::Duration::seconds(300),
                count: 1,
                reason: "provisioned".into(),
                engine: Some("postgres".into()),
                detail: Some("template".into()),
                message: "created from the template: ready in 559 ms".into(),
            },
            RecordedEvent {
                last_at: now - chrono::Duration::seconds(10),
                first_at: now - chrono::Duration::seconds(70),
                count: 2,
                reason: "healed".into(),
                engine: Some("postgres".into()),
                detail: Some("exited".into()),
                message: "its container stopped: re-created".into(),
            },
        ];
        let d = Described {
            id: "agent-7",
            desired: None,
            row: None,
            status: Some(&s),
            events: &events,
            show_secrets: false,
            deployment: &Deployment::parse("default").unwrap(),
        };
        let text = render(&d, now);
        for want in [
            "Phase:        ready",
            "Network:      sandboxd.default.agent-7",
            "postgres:5432 on the sandbox's network; 127.0.0.1:49153 on the host",
            "Image:        sandboxd/postgres:17",
            "Features:     pg_trgm",
            "Heals:        2",
            "Password:     *** (--show-secrets)",
            r"Containers:   docker ps -a --filter 'name=^sandboxd\.default\.agent-7\.'",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        assert!(!text.contains("hunter2"), "{text}");
        let provisioned = text.find("provisioned [template]").expect(&text);
        let healed = text.find("healed [exited]").expect(&text);
        assert!(provisioned < healed, "newest last:\n{text}");
        assert!(text.contains("(x2 over 60s)"), "{text}");
        assert!(!json(&d).to_string().contains("hunter2"));
        assert_eq!(
            json(&d)["container_selector"],
            r"^sandboxd\.default\.agent-7\."
        );

        let shown = render(
            &Described {
                show_secrets: true,
                ..d
            },
            now,
        );
        assert!(shown.contains("hunter2-hunter2-hunter2"), "{shown}");
    }

    #[test]
    fn an_engine_published_nowhere_is_described_so() {
        let mut s = status();
        for service in s.services.values_mut() {
            service.host_port = 0;
        }
        let d = Described {
            id: "agent-7",
            desired: None,
            row: None,
            status: Some(&s),
            events: &[],
            show_secrets: false,
            deployment: &Deployment::parse("default").unwrap(),
        };
        let text = render(&d, Utc::now());
        assert!(
            text.contains("postgres:5432 on the sandbox's network (not published on the host)"),
            "{text}"
        );
        assert!(!text.contains("127.0.0.1:0"), "{text}");
    }
}
