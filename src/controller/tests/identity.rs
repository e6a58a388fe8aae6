//! State database identity and incarnations.

use super::*;

/// Another state database's identity.
const THEIRS: &str = "7b7b7b7b-0000-4000-8000-000000000002";

#[tokio::test(start_paused = true)]
async fn another_state_databases_container_is_never_reaped_or_healed_and_a_row_wanting_its_name_fails_saying_why(
) {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (container, _) = h.published(&id("a"));
    // It is another state database's now, and this one knows nothing of it.
    h.runtime
        .set_label(&container, crate::domain::labels::STATE_ID, THEIRS);
    h.store.delete_desired(&id("a"));
    let term = ctx.env.fence.check().unwrap();
    h.store.delete_status(&id("a"), term).await.unwrap();
    h.runtime.kill(&container, false);
    h.clock.advance(chrono::Duration::hours(1));

    // Dead and long past every grace window, counted from its creation
    // and from when its row was seen gone: neither reaped nor healed.
    reconcile(&ctx, &id("a")).await.unwrap();
    h.clock.advance(chrono::Duration::seconds(181));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let left = h.runtime.containers_of(&id("a"));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, container, "never reaped");
    assert_eq!(
        left[0].1.state,
        crate::domain::container::ContainerState::Exited,
        "never healed"
    );
    assert!(h.store.status_of(&id("a")).is_none());
    assert_eq!(
        h.networks().await.len(),
        1,
        "the network its container is on stays"
    );

    // This database asks for the same sandbox: the name is taken.
    h.store.put_desired(row("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Provision(_)), "{err}");
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    for fragment in [
        "held by container",
        THEIRS,
        crate::testing::FAKE_STATE_ID,
        "docker rm -f",
    ] {
        assert!(
            status.message.contains(fragment),
            "{fragment}: {}",
            status.message
        );
    }
    assert!(status.services.is_empty());
    let left = h.runtime.containers_of(&id("a"));
    assert_eq!(left.len(), 1, "nothing created beside it");
    assert_eq!(left[0].0, container, "not replaced");

    // Every relist counts it.
    h.step_down().await;
    let (stop, task) = start(h.controller());
    until("the foreign container is counted", || {
        h.metric("sandboxd_foreign_containers") == 1.0
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_re_inserted_row_never_inherits_the_earlier_incarnations_container_or_credentials() {
    let h = Harness::new();
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, old_service) = h.published(&id("a"));
    let old_incarnation = h.store.incarnation_of(&id("a")).unwrap();

    // Released: its container waits out the grace window.
    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    assert_eq!(h.store.phase_of(&id("a")), Some(Phase::Terminating));
    assert_eq!(h.containers(&id("a"))[0].0, old);

    // Inserted again, well within the grace window.
    h.store.put_desired(row("a"));
    let incarnation = h.store.incarnation_of(&id("a")).unwrap();
    assert_ne!(incarnation, old_incarnation);
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, service) = h.published(&id("a"));
    assert_ne!(new, old);
    assert!(
        !h.runtime.containers().contains_key(&old),
        "torn down at once"
    );
    assert_ne!(service.password.expose(), old_service.password.expose());
    assert_ne!(service.instance, old_service.instance);
    assert_eq!(
        h.runtime.containers()[&new].labels.incarnation.as_deref(),
        Some(incarnation.as_str())
    );
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.incarnation, Some(incarnation));
    assert_eq!(status.observed_generation, 1);
    assert_eq!(h.metric("sandboxd_reaps_total{reason=\"superseded\"}"), 1.0);
}

#[tokio::test]
async fn a_re_inserted_persistent_row_never_mounts_the_earlier_incarnations_data() {
    let h = Harness::new();
    let ctx = h.context();
    let persistent = || {
        let mut r = row("a");
        r.persistent = true;
        r
    };
    h.store.put_desired(persistent());
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, _) = h.published(&id("a"));
    let volume = h.runtime.containers()[&old].spec.volume.clone().unwrap();
    let label = |labels: Option<std::collections::HashMap<String, String>>| {
        labels.and_then(|l| l.get(crate::domain::labels::INCARNATION).cloned())
    };
    let first = h.store.incarnation_of(&id("a")).unwrap();
    assert_eq!(
        label(h.runtime.volume_labels(&volume.name)).as_deref(),
        Some(first.as_str())
    );

    h.store.delete_desired(&id("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    h.store.put_desired(persistent());
    let second = h.store.incarnation_of(&id("a")).unwrap();
    reconcile(&ctx, &id("a")).await.unwrap();
    let (new, _) = h.published(&id("a"));
    assert_eq!(
        h.runtime.containers()[&new]
            .spec
            .volume
            .as_ref()
            .map(|v| &v.name),
        Some(&volume.name)
    );
    assert_eq!(
        label(h.runtime.volume_labels(&volume.name)).as_deref(),
        Some(second.as_str()),
        "the earlier incarnation's volume was removed and a fresh one made"
    );
}

#[tokio::test(start_paused = true)]
async fn a_template_is_built_once_in_the_background_and_a_failed_build_is_retried_after_a_minute() {
    let h = Harness::new();
    let ctx = h.context();
    let postgres = crate::engine::lookup("postgres").unwrap();
    let key = template::TemplateKey {
        engine: postgres.name(),
        image: "sandboxd/postgres:17".into(),
        image_id: "sha256:0123456789abcdef".into(),
        features: BTreeSet::new(),
    };
    let settle = || tokio::time::sleep(Duration::from_millis(10));
    h.runtime.faults.set(RuntimeOp::TemplateJob, Fault::Fail(1));
    assert_eq!(
        ctx.sources.templates.lookup(&ctx.env, postgres, &key),
        None,
        "a sandbox starts cold while its template is built"
    );
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 0, "the first job failed");
    assert_eq!(ctx.sources.templates.lookup(&ctx.env, postgres, &key), None);
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 0, "not tried again at once");

    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(ctx.sources.templates.lookup(&ctx.env, postgres, &key), None);
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 1, "tried again after a minute");
    let mounts = ctx
        .sources
        .templates
        .lookup(&ctx.env, postgres, &key)
        .expect("the template is ready");
    let volume = mounts.data;
    assert!(
        volume
            .name
            .starts_with("test-template-postgres-plain-0123456789ab."),
        "{}",
        volume.name
    );
    assert_eq!(volume.path, "/var/lib/postgresql/template");
    let binaries = mounts.binaries.expect("Postgres shares its binaries");
    assert_eq!(binaries.name, "test-binaries-postgres-plain-0123456789ab");
    assert_eq!(binaries.path, "/usr");
    assert!(
        h.runtime.volume_labels(&binaries.name).is_some(),
        "the job made the binaries volume"
    );
    assert_eq!(
        volume
            .labels
            .get("io.sandboxd.template")
            .map(String::as_str),
        Some("postgres")
    );
    settle().await;
    assert_eq!(h.runtime.template_jobs(), 1, "built once");

    ctx.sources.templates.forget(&volume.name);
    assert_eq!(ctx.sources.templates.lookup(&ctx.env, postgres, &key), None);
    settle().await;
    assert_eq!(
        h.runtime.template_jobs(),
        2,
        "a forgotten template is checked again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_template_of_another_state_database_is_reused_and_one_of_another_deployment_is_refused_and_counted(
) {
    use crate::domain::template_volume::Refusal;
    let h = Harness::new();
    let ctx = h.context();
    let postgres = crate::engine::lookup("postgres").unwrap();
    let key = template::TemplateKey {
        engine: postgres.name(),
        image: "sandboxd/postgres-ext:17".into(),
        image_id: "sha256:0123456789abcdef".into(),
        features: ["pg_trgm".to_owned()].into(),
    };
    let settle = || tokio::time::sleep(Duration::from_millis(10));
    let refused = |reason: &str| {
        h.metric(&format!(
            "sandboxd_templates_refused{{reason=\"{reason}\"}}"
        ))
    };
    assert_eq!(ctx.sources.templates.lookup(&ctx.env, postgres, &key), None);
    settle().await;
    let volume = ctx
        .sources
        .templates
        .lookup(&ctx.env, postgres, &key)
        .expect("built")
        .data;

    // The state database is recreated: the template now says another
    // identity built it. Its content is what this one builds: reused.
    let mut theirs = h.runtime.volume_labels(&volume.name).unwrap();
    theirs.insert(crate::domain::labels::STATE_ID.into(), THEIRS.into());
    h.runtime.put_volume(&volume.name, theirs.clone());
    ctx.sources.templates.forget(&volume.name);
    assert_eq!(ctx.sources.templates.lookup(&ctx.env, postgres, &key), None);
    settle().await;
    assert_eq!(
        ctx.sources
            .templates
            .lookup(&ctx.env, postgres, &key)
            .map(|m| m.data),
        Some(volume.clone()),
        "served from the other identity's template"
    );
    assert_eq!(h.runtime.template_jobs(), 2);
    assert_eq!(
        h.runtime.volume_labels(&volume.name),
        Some(theirs),
        "reused, not rebuilt"
    );
    for r in Refusal::ALL {
        assert_eq!(refused(r.as_str()), 0.0, "{r:?}");
    }

    // Another deployment's volume under that name: never touched, counted.
    let mut other = h.runtime.volume_labels(&volume.name).unwrap();
    other.insert(crate::domain::labels::DEPLOYMENT.into(), "other".into());
    h.runtime.put_volume(&volume.name, other.clone());
    ctx.sources.templates.forget(&volume.name);
    assert_eq!(ctx.sources.templates.lookup(&ctx.env, postgres, &key), None);
    settle().await;
    assert_eq!(
        ctx.sources.templates.resolve(&ctx.env, postgres, &key),
        template::Resolved::Refused(Refusal::AnotherDeployment)
    );
    assert_eq!(refused("another_deployment"), 1.0);
    assert_eq!(h.runtime.volume_labels(&volume.name), Some(other));

    // Once the operator removed it, the next look builds the template and
    // the refusal is no longer counted.
    h.runtime
        .remove_volume(&volume.name, &"other".parse().unwrap(), None)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(
        ctx.sources.templates.resolve(&ctx.env, postgres, &key),
        template::Resolved::Refused(Refusal::AnotherDeployment),
        "still refused while its job looks again"
    );
    settle().await;
    assert!(ctx
        .sources
        .templates
        .lookup(&ctx.env, postgres, &key)
        .is_some());
    assert_eq!(refused("another_deployment"), 0.0);
}
