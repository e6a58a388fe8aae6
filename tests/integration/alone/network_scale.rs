//! One network per sandbox at fleet scale: a hundred sandboxes at once,
//! each on its own network with its own subnet, all removed with their
//! sandboxes. In the `alone` module, so that its burst of network churn
//! runs alone.

use crate::common;

use bollard::query_parameters::InspectNetworkOptions;
use common::{eventually, request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use sandboxd::ports::runtime::Networks;
use std::collections::BTreeSet;
use std::time::Duration;

#[tokio::test]
async fn a_hundred_sandboxes_at_once_each_get_their_own_network() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.concurrency = 16;
    // A hundred engine caps are more than this host's memory budget (the
    // admission test is tests/integration/quotas.rs): this one is about networks.
    config.memory_budget = Some(100 * config.limits.memory_bytes as u64);
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let ids: Vec<SandboxId> = (0..100).map(|i| sandbox_id(&format!("h{i}"))).collect();
    let req = request(&["redis"], &[]);
    for id in &ids {
        client.apply(id, &req).await.unwrap();
    }
    let statuses = eventually("100 sandboxes ready", Duration::from_secs(300), || async {
        let all = client.list().await.ok()?;
        let ready: Vec<SandboxStatus> = all
            .into_iter()
            .filter(|s| s.phase == Phase::Ready)
            .collect();
        (ready.len() == ids.len()).then_some(ready)
    })
    .await;
    let networks: BTreeSet<String> = statuses.iter().filter_map(|s| s.network.clone()).collect();
    assert_eq!(networks.len(), 100, "one network per sandbox");
    let mut subnets = BTreeSet::new();
    for name in &networks {
        let net = env
            .docker
            .inspect_network(name, None::<InspectNetworkOptions>)
            .await
            .unwrap();
        let subnet = net.ipam.and_then(|i| i.config).unwrap()[0]
            .subnet
            .clone()
            .unwrap();
        subnets.insert(subnet);
        assert_eq!(
            net.containers.unwrap_or_default().len(),
            1,
            "{name} holds its own engine only"
        );
    }
    assert_eq!(subnets.len(), 100, "distinct subnets");
    for id in &ids {
        client.release(id).await.unwrap();
    }
    eventually(
        "every network is removed",
        Duration::from_secs(180),
        || async {
            let left = env.runtime.networks(&env.deployment).await.ok()?;
            left.is_empty().then_some(())
        },
    )
    .await;
    controller.stop().await;
}
