//! Which containers a row's `attach` may put on its sandbox's network
//! (issue 29, hole 1): only those that opt in for the row's owner with the
//! label `io.sandboxd.attach-owner`, named exactly, and holding nothing of
//! the host; every refusal reads the same, whatever exists. The row's
//! `owner_container` takes the same opt-in (issue 50): one that did not
//! opt in is as gone as one that does not exist. Real Docker, real
//! Postgres.

use crate::common;

use common::{request, sandbox_id, Agent, TestEnv, OWNER};
use sandboxd::client::{Client, ClientError};
use sandboxd::domain::attach::OPT_IN;
use sandboxd::domain::{Phase, SandboxId};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

/// The message of the sandbox `id`, which must fail: `attach` names
/// `names` (and redis).
async fn failed_with(client: &Client, id: &SandboxId, owner: &str, names: &[String]) -> String {
    let mut req = request(&["redis"], &[]);
    req.owner = owner.into();
    req.attach = names.to_vec();
    match client.provision(id, &req, READY).await {
        Err(ClientError::Failed { message, .. }) => message,
        other => panic!("expected {id} to fail, got {other:?}"),
    }
}

/// What the status says of `name`, given what it says of `missing`, a
/// name no container has: the same words.
fn refusal_like(message: &str, missing: &str, name: &str) -> String {
    let start = message
        .find(&format!("attach {missing}: not attachable"))
        .unwrap_or_else(|| panic!("no refusal of {missing} in: {message}"));
    let end = start + message[start..].find(')').expect("the refusal's closing )") + 1;
    message[start..end].replace(missing, name)
}

#[tokio::test]
async fn attach_refuses_what_did_not_opt_in_for_the_owner_or_holds_the_host_with_one_message_for_all(
) {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let tag = env.deployment.to_string();
    let opt_in = format!("{OPT_IN}={OWNER}");
    let name = |what: &str| format!("{what}-{tag}");
    // Opted in for nobody: another tenant's agent, the state database, Grafana.
    let plain = Agent::run(&name("plain"), "sandboxd/redis:8", &[]);
    // Opted in for this owner, but named by an id prefix.
    let opted = Agent::start(&name("opted"));
    // Opted in for another owner.
    let theirs = Agent::run(
        &name("theirs"),
        "sandboxd/redis:8",
        &["--label", &format!("{OPT_IN}=another-tenant")],
    );
    // Opted in for this owner, and holding the host (the privileged one
    // only created: this host's engine may not start it).
    let privileged = Agent::created(
        &name("privileged"),
        "sandboxd/redis:8",
        &["--label", &opt_in, "--privileged"],
    );
    let socket = Agent::run(
        &name("socket"),
        "sandboxd/redis:8",
        &[
            "--label",
            &opt_in,
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock:ro",
        ],
    );
    let host = Agent::run(
        &name("hostnet"),
        "sandboxd/redis:8",
        &["--label", &opt_in, "--network", "host"],
    );
    let missing = name("missing");
    let prefix = |agent: &Agent| agent.id()[..12].to_owned();
    let names = vec![
        missing.clone(),
        plain.0.clone(),
        prefix(&plain),
        prefix(&opted),
        theirs.0.clone(),
        privileged.0.clone(),
        socket.0.clone(),
        host.0.clone(),
    ];
    let id = sandbox_id("refuse");
    let message = failed_with(&client, &id, OWNER, &names).await;

    // Every name is refused in the words a name no container has gets.
    for refused in &names {
        let like_missing = refusal_like(&message, &missing, refused);
        assert!(message.contains(&like_missing), "{refused}: {message}");
    }
    // Nothing about what Docker found: no ids, no Docker error, no reason.
    for agent in [&plain, &opted, &theirs, &privileged, &socket, &host] {
        assert!(!message.contains(&agent.id()), "{message}");
    }
    for leak in ["No such container", "status code", "another-tenant"] {
        assert!(!message.contains(leak), "{leak} in: {message}");
    }
    // And none of them is on the sandbox's network.
    let status = client.status(&id).await.unwrap().expect("a status");
    let network = status.network.expect("the status names the network");
    let members = env.network_members(&network).await;
    for agent in [&plain, &opted, &theirs, &privileged, &socket, &host] {
        assert!(!members.contains(&agent.0), "{} on {members:?}", agent.0);
    }
    client.release(&id).await.unwrap();
    controller.stop().await;
}

/// Docker volumes a test made by hand, removed when it ends (even in a
/// panic).
struct Volumes(Vec<String>);

impl Volumes {
    /// Creates the local volume `name` with `options` (`--opt` values).
    fn create(&mut self, name: &str, options: &[&str]) {
        let mut args = vec!["volume", "create"];
        for o in options {
            args.extend(["--opt", o]);
        }
        args.push(name);
        let out = common::docker(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.0.push(name.to_owned());
    }
}

impl Drop for Volumes {
    fn drop(&mut self) {
        for v in &self.0 {
            let _ = common::docker(&["volume", "rm", "-f", v]);
        }
    }
}

/// Issue 50, finding 14: what `docker run` can give a container of the
/// host beyond privilege, the socket and the host's network. Each holder
/// opted in for the owner and runs; each is refused in the one message,
/// while a container that dropped capabilities, kept Docker's
/// confinement and mounts only a plain named volume and a tmpfs is
/// attached.
#[tokio::test]
async fn attach_refuses_host_namespaces_added_capabilities_devices_host_paths_and_lifted_confinement_but_attaches_a_confined_container(
) {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let tag = env.deployment.to_string();
    let opt_in = format!("{OPT_IN}={OWNER}");
    let name = |what: &str| format!("{what}-{tag}");
    let host_dir = std::env::temp_dir().join(format!("sandboxd-attach-{tag}"));
    std::fs::create_dir_all(&host_dir).unwrap();
    let host_dir = host_dir.to_str().unwrap().to_owned();
    let mut volumes = Volumes(Vec::new());
    let plain = name("work");
    volumes.create(&plain, &[]);
    let disguised = name("hostdir");
    volumes.create(
        &disguised,
        &["type=none", "o=bind", &format!("device={host_dir}")],
    );
    let holding = |what: &str, options: &[&str]| {
        let mut all = vec!["--label", &opt_in];
        all.extend(options);
        Agent::run(&name(what), "sandboxd/redis:8", &all)
    };
    let bind = format!("{host_dir}:/host");
    let through_volume = format!("{disguised}:/host");
    let holders = [
        holding("pid", &["--pid", "host"]),
        holding("ipc", &["--ipc", "host"]),
        holding("uts", &["--uts", "host"]),
        holding("userns", &["--userns", "host"]),
        holding("cap", &["--cap-add", "SYS_ADMIN"]),
        holding("device", &["--device", "/dev/zero:/dev/hostzero"]),
        holding("cgrouprule", &["--device-cgroup-rule", "b 8:* rmw"]),
        holding("bind", &["-v", &bind]),
        holding("volbind", &["-v", &through_volume]),
        holding("seccomp", &["--security-opt", "seccomp=unconfined"]),
        holding("paths", &["--security-opt", "systempaths=unconfined"]),
    ];
    let work = format!("{plain}:/work");
    let confined = holding(
        "confined",
        &[
            "--cap-drop",
            "ALL",
            "--cap-add",
            "NET_BIND_SERVICE",
            "--security-opt",
            "no-new-privileges",
            "-v",
            &work,
            "--tmpfs",
            "/scratch",
        ],
    );
    let missing = name("missing");
    let mut names: Vec<String> = holders.iter().map(|a| a.0.clone()).collect();
    names.push(missing.clone());
    names.push(confined.0.clone());
    let id = sandbox_id("holds");
    let message = failed_with(&client, &id, OWNER, &names).await;

    for holder in &holders {
        let like_missing = refusal_like(&message, &missing, &holder.0);
        assert!(message.contains(&like_missing), "{}: {message}", holder.0);
        assert!(!message.contains(&holder.id()), "{message}");
    }
    assert!(
        !message.contains(&format!("attach {}:", confined.0)),
        "the confined container is attached: {message}"
    );
    let status = client.status(&id).await.unwrap().expect("a status");
    let network = status.network.expect("the status names the network");
    let members = env.network_members(&network).await;
    assert!(members.contains(&confined.0), "{members:?}");
    for holder in &holders {
        assert!(!members.contains(&holder.0), "{} on {members:?}", holder.0);
    }
    client.release(&id).await.unwrap();
    controller.stop().await;
    drop((holders, confined));
    let _ = std::fs::remove_dir_all(&host_dir);
}

#[tokio::test]
async fn a_container_opted_in_for_the_owner_is_attached_by_its_name_and_no_other_owner_can_take_it()
{
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let agent = Agent::start(&format!("agent-{}", env.deployment));
    let mine = sandbox_id("mine");
    let mut req = request(&["redis"], &[]);
    req.attach = vec![agent.0.clone()];
    let status = client
        .provision(&mine, &req, READY)
        .await
        .unwrap_or_else(|e| panic!("{mine} ready: {e}"));
    let network = status
        .network
        .clone()
        .expect("the status names the network");
    assert!(env.network_members(&network).await.contains(&agent.0));

    // The agent reaches its sandbox's engine by the engine's name.
    let auth = format!(
        "REDISCLI_AUTH={}",
        status.services["redis"].password.expose()
    );
    let (code, out) = common::exec_in(&env, &agent.0, "redis-cli -h redis ping", vec![auth]).await;
    assert_eq!((code, out.trim()), (0, "PONG"), "the engine from the agent");

    // Another tenant names the same container: refused, and not put on its
    // network.
    let theirs = sandbox_id("theirs");
    let message = failed_with(
        &client,
        &theirs,
        "another-tenant",
        std::slice::from_ref(&agent.0),
    )
    .await;
    assert!(
        message.contains(&format!(
            "attach {}: not attachable (it must exist under this exact name, carry the label {OPT_IN}=another-tenant",
            agent.0
        )),
        "{message}"
    );
    let status = client.status(&theirs).await.unwrap().expect("a status");
    let network = status.network.expect("the status names the network");
    assert!(!env.network_members(&network).await.contains(&agent.0));
    client.release(&mine).await.unwrap();
    client.release(&theirs).await.unwrap();
    controller.stop().await;
}

/// Whether a sandbox was released told a tenant whether a container of
/// the name its row gave as `owner_container` existed on the host (issue
/// 50, finding 9). Now only a container opted in for the row's owner, named
/// exactly, counts as the owner; any other name releases the sandbox as a
/// name no container has does, in the same words.
#[tokio::test]
async fn an_owner_container_that_did_not_opt_in_for_the_owner_releases_the_sandbox_as_a_missing_one_does(
) {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let tag = env.deployment.to_string();
    let name = |what: &str| format!("{what}-{tag}");
    let plain = Agent::run(&name("plain-owner"), "sandboxd/redis:8", &[]);
    let theirs = Agent::run(
        &name("their-owner"),
        "sandboxd/redis:8",
        &["--label", &format!("{OPT_IN}=another-tenant")],
    );
    let opted = Agent::start(&name("own-owner"));
    let owned_by = |container: &str| {
        let mut req = request(&["redis"], &[]);
        req.owner_container = Some(container.to_owned());
        req
    };
    // Opted in for this owner and running: the sandbox stays.
    let kept = sandbox_id("kept");
    client
        .provision(&kept, &owned_by(&opted.0), READY)
        .await
        .unwrap_or_else(|e| panic!("{kept} ready: {e}"));

    // Seventeen containers of this test's: two of them share the first
    // digit of their ids, a prefix Docker finds ambiguous.
    let crowd: Vec<Agent> = (0..17)
        .map(|i| Agent::created(&name(&format!("crowd{i}")), "sandboxd/redis:8", &[]))
        .collect();
    let crowd_ids: Vec<String> = crowd.iter().map(Agent::id).collect();
    let shared = crowd_ids
        .iter()
        .map(|id| &id[..1])
        .find(|p| crowd_ids.iter().filter(|id| id.starts_with(p)).count() > 1)
        .expect("17 ids, 16 digits")
        .to_owned();
    // No container; running but opted in for nobody; opted in for another
    // owner; this owner's, named by an id prefix (Docker resolves those);
    // a prefix of several ids.
    let refused = [
        name("missing-owner"),
        plain.0.clone(),
        theirs.0.clone(),
        opted.id()[..12].to_owned(),
        shared,
    ];
    let mut released = Vec::new();
    for container in &refused {
        let id = sandbox_id("owned");
        client.apply(&id, &owned_by(container)).await.unwrap();
        released.push(id);
    }
    let mut messages = Vec::new();
    for (id, container) in released.iter().zip(&refused) {
        let status = common::eventually(
            &format!("{id}, owned by {container}, released"),
            Duration::from_secs(30),
            || async {
                let s = client.status(id).await.unwrap()?;
                (s.phase == Phase::Terminating).then_some(s)
            },
        )
        .await;
        let named = format!("owner container {container} is");
        messages.push(status.message.replace(&named, "owner container NAME is"));
    }
    assert!(
        messages.iter().all(|m| m == &messages[0]),
        "one message whatever exists: {messages:#?}"
    );
    assert!(
        messages[0].contains("owner container NAME")
            && messages[0].contains(&format!("{OPT_IN}={OWNER}")),
        "it names the label to add: {}",
        messages[0]
    );
    for agent in [&plain, &theirs, &opted] {
        assert!(!messages[0].contains(&agent.id()[..12]), "{}", messages[0]);
    }
    let kept_status = client.status(&kept).await.unwrap().expect("a status");
    assert_eq!(kept_status.phase, Phase::Ready, "{}", kept_status.message);
    for id in released.iter().chain([&kept]) {
        client.release(id).await.unwrap();
    }
    controller.stop().await;
}

#[test]
fn every_service_of_the_compose_stack_is_labelled_as_sandboxds_own() {
    // What sandboxd never attaches (a state database, Prometheus, Grafana:
    // none is a tenant's to put on a sandbox's network), whatever labels
    // an orchestrator might hope for.
    let compose = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/compose.yaml"),
    )
    .expect("read deploy/compose.yaml");
    let services = compose
        .split_once("\nservices:\n")
        .expect("a services section")
        .1;
    // The section ends at the next top-level key.
    let services = services
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with(' ') || l.starts_with('#'))
        .collect::<Vec<_>>();
    let mut blocks: Vec<(String, Vec<&str>)> = Vec::new();
    for line in services {
        let is_service = line.starts_with("  ")
            && !line.starts_with("   ")
            && !line.trim_start().starts_with('#')
            && line.trim_end().ends_with(':');
        if is_service {
            blocks.push((line.trim().trim_end_matches(':').to_owned(), Vec::new()));
        } else if let Some((_, lines)) = blocks.last_mut() {
            lines.push(line.trim());
        }
    }
    assert!(blocks.len() >= 4, "services found: {blocks:?}");
    for (service, lines) in &blocks {
        assert!(
            lines.contains(&"io.sandboxd.managed-by: sandboxd")
                && lines.iter().any(|l| l.starts_with("io.sandboxd.role: ")),
            "the compose service {service} is not labelled io.sandboxd.managed-by=sandboxd with a role"
        );
    }
}
