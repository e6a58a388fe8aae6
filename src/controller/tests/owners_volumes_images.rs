//! Owner containers, persistent volumes, images that lack a feature.

use super::*;

#[tokio::test]
async fn a_sandbox_whose_owner_container_vanished_is_released_once_the_grace_runs_out() {
    let h = Harness::new();
    let ctx = h.context();
    h.runtime.set_agent(
        "agent-1",
        Some(crate::domain::container::RunState {
            running: true,
            ..Default::default()
        }),
    );
    let mut r = row("a");
    r.owner_container = Some("agent-1".into());
    h.store.put_desired(r);
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    h.published(&id("a"));

    h.runtime.set_agent("agent-1", None);
    // Grace from the row's last change.
    let updated = created();
    let Next::After(wait) = reconcile(&ctx, &id("a")).await.unwrap() else {
        panic!("a missing owner is looked at again once its grace runs out");
    };
    assert_eq!(
        ctx.env.clock.now() + chrono::Duration::from_std(wait).unwrap(),
        updated + chrono::Duration::from_std(h.config.grace).unwrap()
    );
    h.clock.advance(chrono::Duration::from_std(wait).unwrap());
    reconcile(&ctx, &id("a")).await.unwrap();
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Terminating);
    assert!(status.message.contains("agent-1"), "{}", status.message);
    assert!(h.containers(&id("a")).is_empty());
}

#[tokio::test]
async fn an_owner_container_not_opted_in_for_the_rows_owner_is_judged_missing_word_for_word() {
    use crate::domain::attach::{Candidate, OPT_IN};
    let h = Harness::new();
    let ctx = h.context();
    // Running, but opted in for another owner; and no container at all.
    h.runtime.set_agent(
        "agent-1",
        Some(crate::domain::container::RunState {
            running: true,
            ..Default::default()
        }),
    );
    h.runtime.set_attach_candidate(
        "agent-1",
        Some(Candidate {
            id: ContainerId::new("agent-1"),
            name: "agent-1".into(),
            labels: std::collections::HashMap::from([(OPT_IN.into(), "someone-else".into())]),
            holds: Default::default(),
        }),
    );
    let rows = [("a", "agent-1"), ("b", "missing-1")];
    let mut waits = Vec::new();
    for (name, owner) in rows {
        let mut r = row(name);
        r.owner_container = Some(owner.into());
        h.store.put_desired(r);
        let Next::After(wait) = reconcile(&ctx, &id(name)).await.unwrap() else {
            panic!("{name}: an owner that does not count is looked at again after its grace");
        };
        waits.push(wait);
    }
    assert_eq!(waits[0], waits[1], "the same grace");
    h.clock
        .advance(chrono::Duration::from_std(waits[0]).unwrap());
    let mut messages = Vec::new();
    for (name, owner) in rows {
        reconcile(&ctx, &id(name)).await.unwrap();
        let status = h.store.status_of(&id(name)).unwrap();
        assert_eq!(status.phase, Phase::Terminating, "{name}");
        assert!(h.containers(&id(name)).is_empty(), "{name}");
        messages.push(status.message.replace(owner, "NAME"));
    }
    assert_eq!(messages[0], messages[1]);
}

#[tokio::test]
async fn a_persistent_sandbox_keeps_its_volume_until_its_row_is_deleted() {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    let volume = h.runtime.containers()[&container]
        .spec
        .volume
        .clone()
        .expect("a data volume");
    assert_eq!(h.runtime.volume_names(), std::slice::from_ref(&volume.name));
    let spec = &h.runtime.containers()[&container].spec;
    assert!(
        spec.tmpfs.iter().all(|t| t.path != volume.path),
        "the data directory is the volume, not a tmpfs"
    );

    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(
        h.runtime.volume_names(),
        std::slice::from_ref(&volume.name),
        "kept while its container waits out the grace window"
    );
    h.clock.advance(chrono::Duration::seconds(600));
    h.look(&ctx);
    reconcile(&ctx, &id("a")).await.unwrap();
    assert!(h.containers(&id("a")).is_empty());
    assert!(
        h.runtime.volume_names().is_empty(),
        "the volume went with the row"
    );
}

#[tokio::test]
async fn a_persistent_sandboxs_volume_without_containers_is_kept_for_the_grace_window_from_when_its_row_was_seen_gone(
) {
    let h = Harness::new();
    let ctx = h.context();
    let mut r = row("a");
    r.persistent = true;
    h.store.put_desired(r);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    // Its container is gone (say, removed by hand), then its row.
    h.runtime
        .remove(&container, Duration::from_secs(1))
        .await
        .unwrap();
    h.store.delete_desired(&id("a"));
    h.clock.advance(chrono::Duration::hours(1));

    assert_eq!(
        reconcile(&ctx, &id("a")).await.unwrap(),
        Next::After(Duration::from_secs(180))
    );
    assert_eq!(h.runtime.volume_names().len(), 1, "the data is kept");
    h.clock.advance(chrono::Duration::seconds(180));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert!(h.runtime.volume_names().is_empty());
    assert_eq!(ctx.reaps.gone.len(), 0);
}

#[tokio::test]
async fn a_rotation_to_an_image_that_lacks_the_feature_fails_without_touching_the_container() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (before, _) = h.published(&id("a"));
    let image = h.config.images.image_for(&FakeEngine::PLAIN, true);
    h.runtime.label_image(
        &image,
        std::collections::HashMap::from([(
            super::image::FEATURES_LABEL.to_owned(),
            "other".to_owned(),
        )]),
    );
    let mut r = row("a");
    r.features = BTreeMap::from([(ENGINE, ["alpha".to_owned()].into())]);
    h.store.put_desired(r);
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(err.to_string().contains(&image), "{err}");
    h.assert_failed_and_kept(&id("a"), &before);
}
