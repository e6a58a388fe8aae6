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
//! Whatever opts in, a container that holds anything of the host is never
//! attached ([`Holds::host_access`]): privileged; any host path mounted
//! (a bind mount, or a local volume whose `device` is a host path: the
//! Docker socket is refused by its own name); any of the host's namespaces
//! or another container's (`--network`, `--pid`, `--ipc`, `--uts`,
//! `--userns`); a capability beyond Docker's default set; a host device
//! (`--device`, `--device-cgroup-rule`, `--gpus`); its confinement lifted
//! (`seccomp` other than Docker's default, `apparmor=unconfined`,
//! `label=disable`, `systempaths=unconfined`). Nor is sandboxd's own
//! (engines, state databases, the compose stack's services).
//!
//! The cgroup namespace is not judged: `host` is Docker's default on
//! cgroup v1 hosts, and shows only the host's cgroup paths.
//!
//! A refusal tells the orchestrator nothing about what exists: one message
//! ([`AttachError::NotAttachable`]) for a missing container and for every
//! failed check, so the status cannot be used to list the host's
//! containers. The reason ([`Refusal`]) goes to the operator's log only.
//!
//! A row's `owner_container` takes the same opt-in ([`opted_in`]: the exact
//! name, not sandboxd's own, the label with the row's owner), but not the
//! checks of what the container holds: it is only watched, never
//! connected. A name that fails it counts as a container that is not there,
//! so whether the sandbox is released tells nothing of what runs on the
//! host either.
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
    /// What it was given of the host.
    pub holds: Holds,
}

/// What a container was given of the host, from its `HostConfig` and
/// mounts. [`Holds::default`] is a container that `docker run` made
/// without any option that gives the host away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holds {
    /// Whether it runs `--privileged`.
    pub privileged: bool,
    /// Its network mode (`bridge`, `host`, `none`, `container:ID`, a
    /// network's name).
    pub network_mode: String,
    /// Its PID, IPC, UTS and user namespace modes (`""`, `private`,
    /// `shareable`, `host`, `container:ID`).
    pub pid_mode: String,
    /// See [`Holds::pid_mode`].
    pub ipc_mode: String,
    /// See [`Holds::pid_mode`].
    pub uts_mode: String,
    /// See [`Holds::pid_mode`].
    pub userns_mode: String,
    /// The host paths mounted into it: bind mounts' sources, and the
    /// `device` of local volumes mounted from a host path or device.
    pub host_paths: Vec<String>,
    /// `--cap-add`, as given (`SYS_ADMIN`, `CAP_SYS_ADMIN`, `ALL`).
    pub cap_add: Vec<String>,
    /// The host devices it may use: `--device` host paths, device cgroup
    /// rules, device requests (`--gpus`), one entry each.
    pub devices: Vec<String>,
    /// `--security-opt`, as Docker stores them (`seccomp=unconfined`,
    /// `label=disable`, `no-new-privileges`).
    pub security_opt: Vec<String>,
    /// The paths of its `/proc` and `/sys` Docker masks, and those it
    /// makes read-only (both empty after `systempaths=unconfined`).
    pub masked_paths: Vec<String>,
    /// See [`Holds::masked_paths`].
    pub readonly_paths: Vec<String>,
}

/// Paths Docker masks or makes read-only by default whose loss gives a
/// container the host: `/proc/sysrq-trigger` (reboot the host),
/// `/proc/sys` (the kernel's settings), `/proc/kcore` (its memory),
/// `/proc/keys`, `/sys/firmware`. Each must be masked or read-only.
const CONFINED_PATHS: [&str; 5] = [
    "/proc/sysrq-trigger",
    "/proc/sys",
    "/proc/kcore",
    "/proc/keys",
    "/sys/firmware",
];

/// Docker's default capabilities: adding one of these back (after
/// `--cap-drop ALL`) gives nothing beyond a plain container.
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// A namespace other than the network's that a container may share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Namespace {
    /// `--pid`.
    Pid,
    /// `--ipc`.
    Ipc,
    /// `--uts`.
    Uts,
    /// `--userns`.
    User,
}

impl Default for Holds {
    fn default() -> Self {
        Self {
            privileged: false,
            network_mode: "bridge".into(),
            pid_mode: String::new(),
            ipc_mode: "private".into(),
            uts_mode: String::new(),
            userns_mode: String::new(),
            host_paths: Vec::new(),
            cap_add: Vec::new(),
            devices: Vec::new(),
            security_opt: Vec::new(),
            masked_paths: ["/proc/kcore", "/proc/keys", "/sys/firmware"]
                .map(String::from)
                .to_vec(),
            readonly_paths: ["/proc/sys", "/proc/sysrq-trigger"]
                .map(String::from)
                .to_vec(),
        }
    }
}

impl Holds {
    /// What of the host these give a container, if anything (the first
    /// found, in the order of [`Refusal`]).
    pub(crate) fn host_access(&self) -> Option<Refusal> {
        if self.privileged {
            return Some(Refusal::Privileged);
        }
        if self.host_paths.iter().any(|s| exposes_docker_socket(s)) {
            return Some(Refusal::DockerSocket);
        }
        if !self.host_paths.is_empty() {
            return Some(Refusal::HostPath);
        }
        if self.network_mode == "host" {
            return Some(Refusal::HostNetwork);
        }
        if self.network_mode.starts_with("container:") {
            return Some(Refusal::SharedNamespace);
        }
        for (namespace, mode) in [
            (Namespace::Pid, &self.pid_mode),
            (Namespace::Ipc, &self.ipc_mode),
            (Namespace::Uts, &self.uts_mode),
            (Namespace::User, &self.userns_mode),
        ] {
            if mode == "host" {
                return Some(Refusal::HostNamespace(namespace));
            }
            if mode.starts_with("container:") {
                return Some(Refusal::SharedNamespace);
            }
        }
        if self.cap_add.iter().any(|c| !is_default_capability(c)) {
            return Some(Refusal::Capabilities);
        }
        if !self.devices.is_empty() {
            return Some(Refusal::Devices);
        }
        let confined = |path: &str| {
            self.masked_paths.iter().any(|p| p == path)
                || self.readonly_paths.iter().any(|p| p == path)
        };
        let lifted = self.security_opt.iter().any(|o| lifts_confinement(o));
        if lifted || !CONFINED_PATHS.iter().all(|p| confined(p)) {
            return Some(Refusal::Unconfined);
        }
        None
    }
}

/// Whether `--cap-add` of `cap` adds nothing to Docker's default set
/// (Docker takes `CAP_X` and `X`, in any case).
fn is_default_capability(cap: &str) -> bool {
    let cap = cap.to_ascii_uppercase();
    let cap = cap.strip_prefix("CAP_").unwrap_or(&cap);
    DEFAULT_CAPABILITIES.contains(&cap)
}

/// Whether the security option `option` (`KEY=VALUE`, or Docker's older
/// `KEY:VALUE`) lifts what Docker confines a container with: any
/// `seccomp` profile (Docker's default is not listed; a profile of the
/// container's creator may allow anything), AppArmor `unconfined`,
/// SELinux labels off.
fn lifts_confinement(option: &str) -> bool {
    let Some((key, value)) = option.split_once(['=', ':']) else {
        return false;
    };
    match key {
        "seccomp" => true,
        "apparmor" => value == "unconfined",
        "label" => value == "disable",
        "systempaths" => value == "unconfined",
        _ => false,
    }
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
    /// Another host path (or a host device) is mounted.
    HostPath,
    /// The container is on the host's network.
    HostNetwork,
    /// The container shares another container's network, PID or IPC
    /// namespace.
    SharedNamespace,
    /// The container shares one of the host's other namespaces.
    HostNamespace(Namespace),
    /// A capability beyond Docker's default set was added.
    Capabilities,
    /// A host device was given (`--device`, a device cgroup rule,
    /// `--gpus`).
    Devices,
    /// Its seccomp, AppArmor or SELinux confinement, or the masking of
    /// the host's `/proc` and `/sys`, was lifted.
    Unconfined,
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
            Refusal::HostPath => "host_path",
            Refusal::HostNetwork => "host_network",
            Refusal::SharedNamespace => "shared_namespace",
            Refusal::HostNamespace(Namespace::Pid) => "host_pid",
            Refusal::HostNamespace(Namespace::Ipc) => "host_ipc",
            Refusal::HostNamespace(Namespace::Uts) => "host_uts",
            Refusal::HostNamespace(Namespace::User) => "host_userns",
            Refusal::Capabilities => "capabilities",
            Refusal::Devices => "devices",
            Refusal::Unconfined => "unconfined",
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
            Refusal::HostPath => {
                "the container mounts a host path (a bind mount, or a local volume on a host path or device)"
            }
            Refusal::HostNetwork => "the container is on the host's network",
            Refusal::SharedNamespace => {
                "the container shares another container's network, PID or IPC namespace"
            }
            Refusal::HostNamespace(Namespace::Pid) => "the container is in the host's PID namespace",
            Refusal::HostNamespace(Namespace::Ipc) => "the container is in the host's IPC namespace",
            Refusal::HostNamespace(Namespace::Uts) => "the container is in the host's UTS namespace",
            Refusal::HostNamespace(Namespace::User) => {
                "the container is in the host's user namespace (--userns host)"
            }
            Refusal::Capabilities => {
                "the container was given a capability beyond Docker's default set"
            }
            Refusal::Devices => {
                "the container was given a host device (--device, --device-cgroup-rule or --gpus)"
            }
            Refusal::Unconfined => {
                "the container's seccomp, AppArmor or SELinux confinement, or the masking of /proc and /sys, was lifted"
            }
        }
    }
}

/// What the status says of a container in `attach` that was not attached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AttachError {
    /// Refused, for whatever [`Refusal`]: the same text for all of them.
    #[error("attach {name}: not attachable (it must exist under this exact name, carry the label io.sandboxd.attach-owner={owner}, and hold nothing of the host: no privilege, added capability, device, host path or host or shared namespace, and Docker's confinement kept)")]
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
    let c = opted_in(name, owner, found)?;
    if let Some(refusal) = c.holds.host_access() {
        return Err(refusal);
    }
    Ok(c)
}

/// Whether the container Docker resolved `name` to (`found`; `None`: none)
/// is one a row of owner `owner` may name: that exact name, not sandboxd's
/// own, opted in for `owner`. All a row's `owner_container` needs; [`judge`]
/// adds what `attach` needs besides.
pub(crate) fn opted_in<'a>(
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
        None => Err(Refusal::NotOptedIn),
        Some(theirs) if theirs != owner => Err(Refusal::OtherOwner),
        Some(_) => Ok(c),
    }
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

    /// `agent-7`, opted in for alice, as `docker run` makes it without
    /// options: on a bridge, holding nothing of the host.
    fn agent() -> Candidate {
        Candidate {
            id: ContainerId::new("0123456789abcdef"),
            name: "agent-7".into(),
            labels: HashMap::from([(OPT_IN.to_owned(), OWNER.to_owned())]),
            holds: Holds::default(),
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
        let to = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let harmless = [
            Some(agent()),
            with(|c| c.holds.network_mode = "agents".into()),
            with(|c| c.holds.network_mode = "none".into()),
            with(|c| c.holds.ipc_mode = "shareable".into()),
            with(|c| c.holds.pid_mode = "private".into()),
            // Docker's default set, dropped and partly added back.
            with(|c| c.holds.cap_add = to(&["NET_BIND_SERVICE", "cap_chown", "Kill"])),
            with(|c| c.holds.security_opt = to(&["no-new-privileges", "no-new-privileges:true"])),
            with(|c| {
                c.holds.security_opt =
                    to(&["apparmor=docker-default", "label=type:svirt_lxc_net_t"])
            }),
            // More masked than Docker's default.
            with(|c| c.holds.masked_paths.push("/proc/asound".into())),
            // Masked rather than read-only.
            with(|c| {
                let ro = std::mem::take(&mut c.holds.readonly_paths);
                c.holds.masked_paths.extend(ro);
            }),
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
        let bind = |source: &str| with(|c| c.holds.host_paths.push(source.into()));
        let network = |mode: &str| with(|c| c.holds.network_mode = mode.into());
        let pid = |mode: &str| with(|c| c.holds.pid_mode = mode.into());
        let ipc = |mode: &str| with(|c| c.holds.ipc_mode = mode.into());
        let cap = |cap: &str| with(|c| c.holds.cap_add.push(cap.into()));
        let opt = |o: &str| with(|c| c.holds.security_opt.push(o.into()));
        let unmask = |path: &str| {
            with(|c| {
                c.holds.masked_paths.retain(|p| p != path);
                c.holds.readonly_paths.retain(|p| p != path);
            })
        };
        let host = Refusal::HostNamespace;
        let cases = [
            (with(|c| c.holds.privileged = true), Refusal::Privileged),
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
            // Any other host path: a bind mount, or a local volume's device.
            (bind("/srv/agent-7/work"), Refusal::HostPath),
            (bind("/run/docker.sock.d"), Refusal::HostPath),
            (bind("/var/lib/agent"), Refusal::HostPath),
            (bind("/dev/loop3"), Refusal::HostPath),
            (network("host"), Refusal::HostNetwork),
            (network("container:0123abcd"), Refusal::SharedNamespace),
            (pid("host"), host(Namespace::Pid)),
            (pid("container:0123abcd"), Refusal::SharedNamespace),
            (ipc("host"), host(Namespace::Ipc)),
            (ipc("container:0123abcd"), Refusal::SharedNamespace),
            (
                with(|c| c.holds.uts_mode = "host".into()),
                host(Namespace::Uts),
            ),
            (
                with(|c| c.holds.userns_mode = "host".into()),
                host(Namespace::User),
            ),
            (cap("CAP_SYS_ADMIN"), Refusal::Capabilities),
            (cap("sys_ptrace"), Refusal::Capabilities),
            (cap("NET_ADMIN"), Refusal::Capabilities),
            (cap("ALL"), Refusal::Capabilities),
            (
                with(|c| c.holds.devices.push("/dev/sda".into())),
                Refusal::Devices,
            ),
            (
                with(|c| c.holds.devices.push("b 8:* rwm".into())),
                Refusal::Devices,
            ),
            (opt("seccomp=unconfined"), Refusal::Unconfined),
            (opt("seccomp:unconfined"), Refusal::Unconfined),
            (
                opt(r#"seccomp={"defaultAction":"SCMP_ACT_ALLOW"}"#),
                Refusal::Unconfined,
            ),
            (opt("apparmor=unconfined"), Refusal::Unconfined),
            (opt("label=disable"), Refusal::Unconfined),
            (opt("label:disable"), Refusal::Unconfined),
            // systempaths=unconfined: Docker masks nothing.
            (
                with(|c| {
                    c.holds.masked_paths.clear();
                    c.holds.readonly_paths.clear();
                }),
                Refusal::Unconfined,
            ),
            (unmask("/proc/sysrq-trigger"), Refusal::Unconfined),
            (unmask("/proc/kcore"), Refusal::Unconfined),
            (unmask("/proc/sys"), Refusal::Unconfined),
        ];
        for (found, refusal) in cases {
            assert_eq!(verdict(found.clone()), Err(refusal), "{found:?}");
        }
    }

    #[test]
    fn an_owner_container_needs_the_opt_in_but_may_hold_the_host() {
        // Watched, never connected: what it holds is not the question.
        let holding = [
            with(|c| c.holds.privileged = true),
            with(|c| c.holds.host_paths.push("/var/run/docker.sock".into())),
            with(|c| c.holds.network_mode = "host".into()),
            with(|c| c.holds.pid_mode = "host".into()),
        ];
        for found in holding {
            let named = opted_in("agent-7", OWNER, found.as_ref()).map(|_| ());
            assert_eq!(named, Ok(()), "{found:?}");
        }
        let own = with(|c| {
            c.labels
                .insert(labels::OWN_CONTAINERS[0].into(), "true".into());
        });
        let refused = [
            (None, OWNER, Refusal::Missing),
            (with(|c| c.name = "web".into()), OWNER, Refusal::NotItsName),
            (own, OWNER, Refusal::Sandboxd),
            (Some(agent()), "", Refusal::NoOwner),
            (with(|c| c.labels.clear()), OWNER, Refusal::NotOptedIn),
            (Some(agent()), "bob", Refusal::OtherOwner),
        ];
        for (found, owner, refusal) in refused {
            let named = opted_in("agent-7", owner, found.as_ref()).map(|_| ());
            assert_eq!(named, Err(refusal), "{found:?} for {owner:?}");
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
