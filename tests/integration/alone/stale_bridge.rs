//! A bridge that outlived its network: a Linux bridge named like
//! sandboxd's (`sbx…`) that no Docker network owns, holding a route for a
//! subnet of the controller's pool (real Docker, real host routes).
//!
//! Its subnet is never handed out; a sandbox whose host route it takes
//! over fails its readiness with a message that names it; the next
//! relists remove it (found stale for --stale-bridge-age) and count it, and the
//! sandbox heals.
//!
//! Alone: the bridge and its routes are the host's, and any other
//! controller running beside this test would remove the bridge at its own
//! relist (it is stale for every sandboxd on the host).

use crate::common;

use bollard::query_parameters::InspectNetworkOptions;
use common::{eventually, free_port, http_get, request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sandboxd::config::{readiness_overrides, NetworkLayout};
use sandboxd::domain::network::{Ipv4Net, SubnetPool};
use sandboxd::domain::Phase;
use std::time::Duration;

/// `ip ARGS…`, which must succeed.
fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the host has a link called `name`.
fn link_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

/// The test's own bridge, removed when the test ends however it ends.
struct Bridge(String);

impl Drop for Bridge {
    fn drop(&mut self) {
        if link_exists(&self.0) {
            let _ = std::process::Command::new("ip")
                .args(["link", "delete", &self.0])
                .status();
        }
    }
}

/// Plants a bridge that outlived its network: named like sandboxd's,
/// owned by no Docker network.
fn plant_stale_bridge() -> Bridge {
    let hex = common::random_suffix()
        .bytes()
        .map(|b| format!("{:x}", b % 16))
        .collect::<String>();
    let bridge = Bridge(format!("sbx{}", &format!("{hex}00")[..12]));
    ip(&["link", "add", &bridge.0, "type", "bridge"]);
    bridge
}

/// The subnet of the Docker network `name`.
async fn subnet_of(env: &TestEnv, name: &str) -> Ipv4Net {
    let info = env
        .docker
        .inspect_network(name, None::<InspectNetworkOptions>)
        .await
        .expect("the network exists");
    info.ipam.and_then(|i| i.config).expect("an IPAM config")[0]
        .subnet
        .as_deref()
        .expect("a subnet")
        .parse()
        .expect("an IPv4 subnet")
}

#[tokio::test]
async fn a_stale_sbx_bridge_keeps_its_subnet_from_being_handed_out_is_named_when_it_takes_a_route_and_is_removed_by_the_next_relists(
) {
    let env = TestEnv::new().await;
    // A pool of this test's own, four /29s, that no other test uses.
    let octet = 20 + std::process::id() % 200;
    let pool: Ipv4Net = format!("10.219.{octet}.0/27").parse().unwrap();
    let subnets: Vec<Ipv4Net> = pool.subnets(29).collect();
    let mut config = env.config();
    config.network = NetworkLayout::PerSandbox {
        subnets: SubnetPool::new(pool, 29).unwrap(),
        egress: false,
    };
    // The first relist runs at start; no other within the test until the
    // second controller starts.
    config.relist_interval = Duration::from_secs(3600);
    config.readiness = readiness_overrides(&[("redis".into(), Duration::from_secs(4))]).unwrap();
    let controller = env.start(config.clone());
    eventually(
        "the controller has made its first relist",
        Duration::from_secs(30),
        || async { controller.readiness.is_ready().then_some(()) },
    )
    .await;

    // A bridge that outlived its network: named like sandboxd's, owned by
    // no Docker network, with the route for the pool's first subnet.
    let bridge = plant_stale_bridge();
    let name = bridge.0.as_str();
    let gateway = subnets[0].gateway().to_string();
    ip(&["addr", "add", &format!("{gateway}/29"), "dev", name]);
    ip(&["link", "set", name, "up"]);

    // Two sandboxes: neither is given the subnet the bridge's route holds.
    let client = Client::from_pool(env.pool.clone());
    let (a, b) = (sandbox_id("stale-a"), sandbox_id("stale-b"));
    let mut given = Vec::new();
    for id in [&a, &b] {
        let status = client
            .provision(id, &request(&["redis"], &[]), Duration::from_secs(60))
            .await
            .expect("ready on another subnet");
        let network = status.network.clone().expect("its network");
        given.push(subnet_of(&env, &network).await);
    }
    assert!(link_exists(name), "the bridge is still there");
    assert_eq!(
        given,
        subnets[1..3],
        "handed out around the bridge's subnet"
    );

    // The bridge takes over the route to a's subnet (two /30s are more
    // specific than its /29): a's engine, killed and healed, is up but
    // unreachable from the host, and the status says why.
    let a_network = client.status(&a).await.unwrap().unwrap().network.unwrap();
    for half in subnets[1].subnets(30) {
        ip(&["route", "add", &half.to_string(), "dev", name]);
    }
    let engine = env.containers(Some(&a)).await;
    common::docker_ok(&["kill", &engine[0].name]);
    // (The last status seen goes into the failure: a flake in CI once
    // timed out here with nothing to go on.)
    let last = std::sync::Mutex::new(String::new());
    let message = tokio::time::timeout(
        Duration::from_secs(60),
        eventually(
            "a's heal fails and names the bridge",
            Duration::from_secs(3600),
            || async {
                let status = client.status(&a).await.ok()??;
                *last.lock().unwrap() = format!("{:?}: {}", status.phase, status.message);
                status.message.contains(name).then_some(status.message)
            },
        ),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "a's heal did not name the bridge within 60 s; the last status: {}; a's containers: {:?}",
            last.lock().unwrap(),
            String::from_utf8_lossy(
                &common::docker(&[
                    "ps",
                    "-a",
                    "--filter",
                    &format!("label=io.sandboxd.sandbox={a}"),
                    "--format",
                    "{{.Names}} {{.Status}}",
                ])
                .stdout
            )
        )
    });
    for part in [
        "did not become ready",
        &format!("through {name}"),
        "/30",
        &a_network,
        "no Docker network owns",
        "relist",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    controller.stop().await;

    // The next relists (a new controller's: every relist must have found
    // the bridge stale for a while, here 6 s rather than the default 30 s)
    // remove the bridge, with its routes, count it, and a heals.
    config.relist_interval = Duration::from_secs(3);
    let runtime = sandboxd::adapters::docker::DockerRuntime::connect()
        .await
        .expect("docker")
        .with_stale_bridge_age(Duration::from_secs(6));
    let controller = env.start_on(
        std::sync::Arc::new(runtime),
        config,
        sandboxd::adapters::postgres::PgStore::with_engines(
            env.pool.clone(),
            sandboxd::engine::REGISTRY,
        ),
    );
    eventually(
        "the relist removes the stale bridge",
        Duration::from_secs(30),
        || async { (!link_exists(name)).then_some(()) },
    )
    .await;
    // Counted (with any other stale bridge the host had).
    eventually(
        "the removal is counted",
        Duration::from_secs(10),
        || async {
            let removed = common::sample(
                &controller.metrics.render(),
                "sandboxd_stale_bridges_total{outcome=\"removed\"}",
            );
            removed.is_some_and(|n| n >= 1.0).then_some(())
        },
    )
    .await;
    let healed = eventually(
        "a heals once the route is its network's again",
        Duration::from_secs(90),
        || async {
            let s = client.status(&a).await.ok()??;
            (s.phase == Phase::Ready).then_some(s)
        },
    )
    .await;
    assert_eq!(healed.network.as_deref(), Some(a_network.as_str()));
    controller.stop().await;
}

#[tokio::test]
async fn without_cap_net_admin_a_stale_bridge_is_counted_and_left_and_sandboxd_keeps_running() {
    let env = TestEnv::new().await;
    let bridge = plant_stale_bridge();
    // `sandboxd run` as root without CAP_NET_ADMIN (dropped from the
    // bounding set, so neither it nor the `ip` it starts has it): an
    // operator's unprivileged deployment.
    let port = free_port();
    let mut sandboxd = env.spawn_binary_under(
        &[
            "setpriv",
            "--bounding-set=-net_admin",
            "--inh-caps=-net_admin",
            "--",
        ],
        port,
        &[
            ("SANDBOXD_RELIST_INTERVAL", "1s"),
            ("SANDBOXD_STALE_BRIDGE_AGE", "3s"),
        ],
    );
    eventually("sandboxd /readyz", Duration::from_secs(30), || async {
        matches!(http_get(port, "/readyz").await, Some((200, _))).then_some(())
    })
    .await;
    eventually(
        "the refusal is counted",
        Duration::from_secs(30),
        || async {
            let (_, text) = http_get(port, "/metrics").await?;
            let refused = common::sample(
                &text,
                "sandboxd_stale_bridges_total{outcome=\"not_permitted\"}",
            )?;
            (refused >= 1.0).then_some(())
        },
    )
    .await;
    assert!(link_exists(&bridge.0), "the bridge is left to the operator");
    // Relists go on: still ready, still running.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sandboxd.0.try_wait().unwrap().is_none(), "sandboxd runs");
    assert!(matches!(http_get(port, "/readyz").await, Some((200, _))));
}
