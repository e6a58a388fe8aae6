//! Rotation builds before it destroys.

use super::*;

/// Row `name` asking for the fake engine's feature `alpha`.
fn with_alpha(name: &str) -> DesiredSandbox {
    let mut r = row(name);
    r.features = BTreeMap::from([(ENGINE, ["alpha".to_owned()].into())]);
    r
}

/// The fake container `id`.
fn fake(h: &Harness, id: &ContainerId) -> crate::testing::FakeContainer {
    h.runtime.containers()[id].clone()
}

#[tokio::test]
async fn a_rotation_switches_to_the_new_container_under_the_engines_name_and_alias() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let canonical = fake(&h, &old).name;

    h.store.put_desired(with_alpha("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let (new, after) = h.published(&id("a"));
    assert_ne!(new, old, "a new container");
    assert_ne!(after.password, before.password, "fresh credentials");
    assert_eq!(after.available_extensions, ["alpha"]);
    let c = fake(&h, &new);
    assert_eq!(c.name, canonical, "it took the engine's container name");
    assert_eq!(c.spec.aliases, [ENGINE.as_str()], "and its network alias");
    assert_eq!(
        after.host_port, c.host_port,
        "the host port it was bound to when it took the alias is published"
    );
    assert_eq!(after.host, before.host, "the same endpoint");
    assert_eq!(h.metric("sandboxd_rotations_total{engine=\"fakedb\"}"), 1.0);
    // Settled: nothing left to switch.
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(h.published(&id("a")).1, after);
}

#[tokio::test]
async fn in_the_shared_network_layout_a_rotation_hands_over_the_container_name_clients_use() {
    let mut h = Harness::new();
    h.config.network = crate::config::NetworkLayout::Shared {
        name: "shared".into(),
    };
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    assert_eq!(before.host, fake(&h, &old).name, "clients use the name");

    h.store.put_desired(with_alpha("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert_ne!(new, old);
    assert_eq!(after.host, before.host);
    let c = fake(&h, &new);
    assert_eq!(c.name, before.host, "the new container took the name");
    assert!(c.spec.aliases.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_container_that_never_becomes_ready_leaves_the_old_one_serving() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));

    // The new container's probe never passes.
    h.runtime.faults.set(RuntimeOp::Exec, Fault::FailAlways);
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    let ReconcileError::Provision(message) = &err else {
        panic!("expected a provisioning failure, got {err}");
    };
    assert!(message.starts_with("fakedb: "), "{message}");
    assert!(message.contains("did not become ready"), "{message}");
    assert!(
        message.contains("the running container keeps serving the published credentials"),
        "{message}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert_eq!(&status.message, message);
    assert_eq!(
        *status.services[ENGINE.as_str()],
        before,
        "the old credentials stay published"
    );
    assert_eq!(
        h.containers(&id("a")),
        [(old.clone(), before.instance.clone())],
        "the new container was removed, the old one kept"
    );
    assert_eq!(
        fake(&h, &old).state,
        crate::domain::container::ContainerState::Running
    );

    // Retried: the same failure never touches the old container.
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(err.to_string().contains("did not become ready"), "{err}");
    assert_eq!(h.containers(&id("a")), [(old, before.instance.clone())]);

    h.runtime.faults.clear(RuntimeOp::Exec);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (_, after) = h.published(&id("a"));
    assert_ne!(after.instance, before.instance, "rotated once it could");
}

#[tokio::test]
async fn a_new_container_that_fails_to_start_leaves_the_old_one_serving() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));

    h.runtime.faults.set(RuntimeOp::Create, Fault::FailAlways);
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(
        err.to_string().contains("the rotation was abandoned"),
        "{err}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert_eq!(*status.services[ENGINE.as_str()], before);
    assert_eq!(h.containers(&id("a")), [(old, before.instance)]);
}

#[tokio::test]
async fn a_rotation_stopped_before_its_new_container_was_published_keeps_the_old_one() {
    let h = Harness::new();
    h.store.put_desired(row("a"));
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));

    // The write naming the new container fails (the first write, the
    // provisioning status, goes through): as if the controller stopped
    // just before publishing it.
    h.store
        .faults
        .set(StoreOp::WriteStatus, Fault::FailOnceAfter(1));
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&h.context(), &id("a")).await.unwrap_err();
    assert!(err.to_string().contains("could not be published"), "{err}");
    let containers = h.containers(&id("a"));
    assert_eq!(
        containers.len(),
        2,
        "the new one is left to the next look: {containers:?}"
    );
    assert_eq!(
        *h.store.status_of(&id("a")).unwrap().services[ENGINE.as_str()],
        before,
        "the status still names the old container: it is the live one"
    );

    // A restarted controller keeps the published (old) container, removes
    // the unpublished one and rotates again.
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert!(containers.iter().all(|(c, _)| c != &new));
    assert_ne!(after.instance, before.instance);
    assert_ne!(new, old);
}

#[tokio::test]
async fn a_rotation_stopped_after_its_new_container_was_published_finishes_the_switch() {
    let h = Harness::new();
    h.store.put_desired(row("a"));
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let canonical = fake(&h, &old).name;

    // Removing the old container fails once: as if the controller stopped
    // right after publishing the new one.
    h.runtime.faults.set(RuntimeOp::Remove, Fault::Fail(1));
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&h.context(), &id("a")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("the next attempt finishes the switch"),
        "{err}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    let published = status.services[ENGINE.as_str()].clone();
    assert_ne!(
        published.instance, before.instance,
        "the new container is published"
    );
    let containers = h.containers(&id("a"));
    assert_eq!(containers.len(), 2, "{containers:?}");
    let (new, _) = containers
        .iter()
        .find(|(_, instance)| instance == &published.instance)
        .expect("the published container exists")
        .clone();
    assert_ne!(
        fake(&h, &new).name,
        canonical,
        "still under its temporary name"
    );

    // A restarted controller removes the old container and finishes.
    reconcile(&h.context(), &id("a")).await.unwrap();
    let (kept, after) = h.published(&id("a"));
    assert_eq!(kept, new);
    assert_eq!(
        after.password, published.password,
        "the published credentials stay"
    );
    let c = fake(&h, &new);
    assert_eq!(c.name, canonical);
    assert_eq!(c.spec.aliases, [ENGINE.as_str()]);
    assert_eq!(after.host_port, c.host_port);
}

#[tokio::test]
async fn a_persistent_sandbox_rotates_on_its_volume_after_removing_the_old_container() {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r.clone());
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let volume = fake(&h, &old).spec.volume.expect("a data volume");

    let mut r2 = with_alpha("a");
    r2.persistent = true;
    h.store.put_desired(r2);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert_ne!(new, old);
    assert_ne!(after.password, before.password);
    assert_eq!(fake(&h, &new).spec.volume, Some(volume), "the same data");
    assert_eq!(after.host_port, before.host_port, "it kept the host port");
}

#[tokio::test]
async fn a_persistent_sandboxs_failed_rotation_restores_the_old_credentials_on_its_volume() {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let volume = fake(&h, &old).spec.volume.expect("a data volume");

    // The new container fails once it exists (after the old one went).
    h.runtime
        .faults
        .set(RuntimeOp::PublishedPort, Fault::Fail(1));
    let mut r2 = with_alpha("a");
    r2.persistent = true;
    h.store.put_desired(r2);
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(
        err.to_string().contains("the rotation was rolled back"),
        "{err}"
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    assert!(
        status
            .message
            .ends_with("restored (a persistent sandbox's on its volume, with its data)"),
        "{}",
        status.message
    );
    let containers = h.containers(&id("a"));
    let [(restored, instance)] = containers.as_slice() else {
        panic!("one container: {containers:?}");
    };
    let published = &status.services[ENGINE.as_str()];
    assert_eq!(
        &published.instance, instance,
        "the restored container is published"
    );
    assert_eq!(
        published.password, before.password,
        "with the old credentials"
    );
    assert_eq!(
        published.host_port, before.host_port,
        "on the old host port"
    );
    let c = fake(&h, restored);
    assert_eq!(c.spec.volume, Some(volume), "on the same data");
    assert!(c.labels.features.is_empty(), "with the old features");

    // A later attempt rotates from the restored container.
    reconcile(&ctx, &id("a")).await.unwrap();
    let (_, after) = h.published(&id("a"));
    assert_ne!(after.password, before.password);
    assert_eq!(after.available_extensions, ["alpha"]);
}

#[tokio::test]
async fn a_runtime_that_cannot_rename_rotates_in_place_and_a_failed_rotation_restores_the_old_credentials(
) {
    let h = Harness::new();
    h.runtime.capabilities.lock().unwrap().renames = false;
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    let name = fake(&h, &old).name;

    // The new container fails once it exists (after the old one went).
    h.runtime
        .faults
        .set(RuntimeOp::PublishedPort, Fault::Fail(1));
    h.store.put_desired(with_alpha("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(
        err.to_string().contains("the rotation was rolled back"),
        "{err}"
    );
    let containers = h.containers(&id("a"));
    let [(restored, instance)] = containers.as_slice() else {
        panic!("one container: {containers:?}");
    };
    assert_ne!(restored, &old, "the old container went first");
    let status = h.store.status_of(&id("a")).unwrap();
    let published = &status.services[ENGINE.as_str()];
    assert_eq!(&published.instance, instance);
    assert_eq!(published.password, before.password, "the old credentials");
    assert_eq!(fake(&h, restored).name, name, "under its name");

    // The next attempt rotates in place, never renaming.
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, after) = h.published(&id("a"));
    assert_ne!(after.password, before.password);
    assert_eq!(after.available_extensions, ["alpha"]);
    assert_eq!(fake(&h, &new).name, name);
    assert_eq!(h.containers(&id("a")).len(), 1);
}
