//! Whether a container a row names in `attach` may join that sandbox's
//! network.
//!
//! An orchestrator names containers by text, and Docker resolves text
//! generously (a full id, an exact name, or any unique id prefix), so
//! without a rule an own-rows-only orchestrator could put any container on
//! the host (another tenant's agent, the state database, Grafana) on its
//! sandbox's network. The rule: the container opts in. It must carry the
//! label [`OPT_IN`] with the row's owner as its value, exactly. A label is
//! fixed when a container is created, so the opt-in is made by whoever
//! created the container, and that is who already controls it; the owner in
//! the value stops tenant A from naming B's opted-in container. (An
//! allowlist only the administrator writes would work too, but it makes the
//! administrator a party to every agent's start, and the label already
//! proves the one thing that matters: the container's creator agreed.)
//!
//! Whatever opts in, a few kinds of container are never attached, as they
//! hold the host: privileged ones, ones with the Docker socket (or a
//! directory holding it) bind-mounted, ones on the host's network or in
//! another container's network namespace, and sandboxd's own (engines,
//! state databases, the compose stack's services).
//!
//! A refusal tells the orchestrator nothing about what exists: one message
//! ([`AttachError::NotAttachable`]) for a missing container and for every
//! failed check, so the status cannot be used to list the host's
//! containers. The reason ([`Refusal`]) goes to the operator's log only.
//!
//! Pure, tested with a table.

use super::id::ContainerId;
use super::labels;
use std::collections::HashMap;

/// The label a container carries to be attachable to sandboxes of one
/// owner: `io.sandboxd.attach-owner=OWNER`.
pub const OPT_IN: &str = "io.sandboxd.attach-owner";

/// Where the Docker daemon's socket lives (`/var/run` is usually a link
/// to `/run`; both are checked, and their parent directories).
const DOCKER_SOCKETS: [&str; 2] = ["/var/run/docker.sock", "/run/docker.sock"];

/// What the runtime says of the container it resolved a name in `attach`
/// to (the runtime resolves as Docker does, id prefixes included: the
/// judgement compares the name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its full id: what is connected once it is judged attachable, so the
    /// container judged is the container connected.
    pub id: ContainerId,
    /// Its name, without Docker's leading `/`.
    pub name: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
    /// Whether it runs `--privileged`.
    pub privileged: bool,
    /// Its network mode (`bridge`, `host`, `none`, `container:ID`, a
    /// network's name).
    pub network_mode: String,
    /// The host paths bind-mounted into it.
    pub bind_sources: Vec<String>,
}

/// Why a container is not attached (for the operator's log; the status
/// says only [`AttachError::NotAttachable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No container answers to the name.
    Missing,
    /// The name resolved to a container of another name (an id or an id
    /// prefix): only exact names are attached.
    NotItsName,
    /// A container sandboxd runs itself.
    Sandboxd,
    /// The row has no owner, so no container can have opted in for it.
    NoOwner,
    /// The container carries no [`OPT_IN`] label.
    NotOptedIn,
    /// The container opted in for another owner.
    OtherOwner,
    /// The container is privileged.
    Privileged,
    /// The Docker socket, or a directory holding it, is bind-mounted.
    DockerSocket,
    /// The container is on the host's network.
    HostNetwork,
    /// The container shares another container's network namespace.
    SharedNamespace,
}

impl Refusal {
    /// The `reason` field of the log line.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::NotItsName => "not_its_name",
            Refusal::Sandboxd => "sandboxd_own",
            Refusal::NoOwner => "no_owner",
            Refusal::NotOptedIn => "not_opted_in",
            Refusal::OtherOwner => "other_owner",
            Refusal::Privileged => "privileged",
            Refusal::DockerSocket => "docker_socket",
            Refusal::HostNetwork => "host_network",
            Refusal::SharedNamespace => "shared_namespace",
        }
    }

    /// What it means, for the operator.
    pub(crate) fn phrase(self) -> &'static str {
        match self {
            Refusal::Missing => "no container has this name",
            Refusal::NotItsName => {
                "the name resolved to a container of another name (an id or id prefix); only exact names are attached"
            }
            Refusal::Sandboxd => {
                "the container is sandboxd's own (an engine, a state database, a service of the stack)"
            }
            Refusal::NoOwner => "the row has no owner to match the container's opt-in label against",
            Refusal::NotOptedIn => "the container carries no io.sandboxd.attach-owner label",
            Refusal::OtherOwner => "the container's io.sandboxd.attach-owner label names another owner",
            Refusal::Privileged => "the container is privileged",
            Refusal::DockerSocket => {
                "the container bind-mounts the Docker socket or a directory holding it"
            }
            Refusal::HostNetwork => "the container is on the host's network",
            Refusal::SharedNamespace => "the container shares another container's network namespace",
        }
    }
}

/// What the status says of a container in `attach` that was not attached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AttachError {
    /// Refused, for whatever [`Refusal`]: the same text for all of them.
    #[error("attach {name}: not attachable (it must exist under this exact name, carry the label io.sandboxd.attach-owner={owner}, and be neither privileged, on the host network or another container's, nor mounting the Docker socket)")]
    NotAttachable {
        /// The name in `attach`.
        name: String,
        /// The row's owner.
        owner: String,
    },
    /// Judged attachable, but Docker would not connect it (the container
    /// opted in for this owner, so saying so reveals nothing).
    #[error("attach {name}: could not be connected to the sandbox's network (sandboxd's log says why); the next reconcile tries again")]
    NotConnected {
        /// The name in `attach`.
        name: String,
    },
}

/// Whether the container Docker resolved `name` to (`found`; `None`: none)
/// may join the network of a sandbox whose row's owner is `owner`: the
/// container to connect, or why not.
pub(crate) fn judge<'a>(
    name: &str,
    owner: &str,
    found: Option<&'a Candidate>,
) -> Result<&'a Candidate, Refusal> {
    let Some(c) = found else {
        return Err(Refusal::Missing);
    };
    if c.name != name {
        return Err(Refusal::NotItsName);
    }
    if c.labels
        .keys()
        .any(|k| labels::OWN_CONTAINERS.contains(&k.as_str()))
    {
        return Err(Refusal::Sandboxd);
    }
    if owner.is_empty() {
        return Err(Refusal::NoOwner);
    }
    match c.labels.get(OPT_IN) {
        None => return Err(Refusal::NotOptedIn),
        Some(theirs) if theirs != owner => return Err(Refusal::OtherOwner),
        Some(_) => {}
    }
    if c.privileged {
        return Err(Refusal::Privileged);
    }
    if c.bind_sources.iter().any(|s| exposes_docker_socket(s)) {
        return Err(Refusal::DockerSocket);
    }
    if c.network_mode == "host" {
        return Err(Refusal::HostNetwork);
    }
    if c.network_mode.starts_with("container:") {
        return Err(Refusal::SharedNamespace);
    }
    Ok(c)
}

/// Whether bind-mounting the host path `source` gives the container the
/// Docker socket: the socket itself, a directory above it (`/run`,
/// `/var/run`, `/`), or any file called `docker.sock`.
fn exposes_docker_socket(source: &str) -> bool {
    let parts: Vec<&str> = source.split('/').filter(|p| !p.is_empty()).collect();
    if parts.last() == Some(&"docker.sock") {
        return true;
    }
    DOCKER_SOCKETS.iter().any(|socket| {
        let socket: Vec<&str> = socket.split('/').filter(|p| !p.is_empty()).collect();
        socket.starts_with(&parts)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "alice";

    /// `agent-7`, opted in for alice, unprivileged, on a bridge, a data
    /// directory bind-mounted.
    fn agent() -> Candidate {
        Candidate {
            id: ContainerId::new("0123456789abcdef"),
            name: "agent-7".into(),
            labels: HashMap::from([(OPT_IN.to_owned(), OWNER.to_owned())]),
            privileged: false,
            network_mode: "bridge".into(),
            bind_sources: vec!["/srv/agent-7/work".into()],
        }
    }

    fn with(f: impl FnOnce(&mut Candidate)) -> Option<Candidate> {
        let mut c = agent();
        f(&mut c);
        Some(c)
    }

    /// The verdict on `found`, what Docker resolved `agent-7` to, for a
    /// row of alice's.
    fn verdict(found: Option<Candidate>) -> Result<(), Refusal> {
        judge("agent-7", OWNER, found.as_ref()).map(|_| ())
    }

    #[test]
    fn an_agent_opted_in_for_the_owner_holding_nothing_of_the_host_is_attached() {
        let harmless = [
            Some(agent()),
            with(|c| c.network_mode = "agents".into()),
            with(|c| c.bind_sources = vec!["/run/docker.sock.d".into()]),
            with(|c| c.bind_sources = vec!["/run/agent".into()]),
            with(|c| c.bind_sources = vec!["/var/lib/agent".into()]),
        ];
        for found in harmless {
            assert_eq!(verdict(found.clone()), Ok(()), "{found:?}");
        }
    }

    #[test]
    fn only_the_container_of_exactly_that_name_is_judged() {
        let named = |name: &str| with(|c| c.name = name.into());
        let cases = [
            (None, Refusal::Missing),
            // Docker resolved an id prefix, or a full id.
            (named("web"), Refusal::NotItsName),
            (named("Agent-7"), Refusal::NotItsName),
        ];
        for (found, refusal) in cases {
            assert_eq!(verdict(found.clone()), Err(refusal), "{found:?}");
        }
        let full_id = agent().id.as_str().to_owned();
        let resolved = judge(&full_id, OWNER, Some(&agent())).map(|_| ());
        assert_eq!(resolved, Err(Refusal::NotItsName));
    }

    #[test]
    fn sandboxds_own_containers_are_never_attached_even_opted_in() {
        for key in labels::OWN_CONTAINERS {
            let own = with(|c| {
                c.labels.insert((*key).into(), "true".into());
            });
            assert_eq!(verdict(own), Err(Refusal::Sandboxd), "{key}");
        }
    }

    #[test]
    fn the_opt_in_must_name_the_rows_owner_exactly() {
        let opted_in_for = |owner: &str| {
            with(|c| {
                c.labels.insert(OPT_IN.into(), owner.into());
            })
        };
        for theirs in ["bob", "Alice", "alic", "alice2", "alice ", ""] {
            let found = opted_in_for(theirs);
            assert_eq!(verdict(found), Err(Refusal::OtherOwner), "{theirs:?}");
        }
        let unlabelled = with(|c| c.labels.clear());
        assert_eq!(verdict(unlabelled), Err(Refusal::NotOptedIn));
        // A row without an owner matches no label, not even an empty one.
        let empty = opted_in_for("");
        let resolved = judge("agent-7", "", empty.as_ref()).map(|_| ());
        assert_eq!(resolved, Err(Refusal::NoOwner));
    }

    #[test]
    fn a_container_holding_the_host_is_never_attached() {
        let bind = |source: &str| with(|c| c.bind_sources.push(source.into()));
        let network = |mode: &str| with(|c| c.network_mode = mode.into());
        let cases = [
            (with(|c| c.privileged = true), Refusal::Privileged),
            (bind("/var/run/docker.sock"), Refusal::DockerSocket),
            (bind("/run/docker.sock"), Refusal::DockerSocket),
            (bind("//var/run//docker.sock/"), Refusal::DockerSocket),
            // A rootless daemon's.
            (bind("/run/user/1000/docker.sock"), Refusal::DockerSocket),
            // A directory holding it.
            (bind("/var/run"), Refusal::DockerSocket),
            (bind("/run/"), Refusal::DockerSocket),
            (bind("/var"), Refusal::DockerSocket),
            (bind("/"), Refusal::DockerSocket),
            (network("host"), Refusal::HostNetwork),
            (network("container:0123abcd"), Refusal::SharedNamespace),
        ];
        for (found, refusal) in cases {
            assert_eq!(verdict(found.clone()), Err(refusal), "{found:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_label_to_add_and_nothing_about_the_container() {
        let refused = AttachError::NotAttachable {
            name: "agent-7".into(),
            owner: OWNER.into(),
        }
        .to_string();
        assert!(
            refused.starts_with("attach agent-7: not attachable"),
            "{refused}"
        );
        assert!(refused.contains(&format!("{OPT_IN}={OWNER}")), "{refused}");
    }
}
