//! Isolation levels: a sandbox runs under the OCI runtime its level needs,
//! is refused (and nothing touched) when the daemon lacks it, and moves to
//! a new container when its level rises.

use super::*;
use crate::domain::isolation::Isolation;

fn under_gvisor(name: &str) -> DesiredSandbox {
    DesiredSandbox {
        isolation: Some(Isolation::Gvisor),
        ..row(name)
    }
}

/// The fake container `id`.
fn fake(h: &Harness, id: &ContainerId) -> crate::testing::FakeContainer {
    h.runtime.containers()[id].clone()
}

#[tokio::test]
async fn a_gvisor_row_runs_under_runsc_and_says_so_on_its_container() {
    let h = Harness::new();
    h.runtime.set_oci_runtimes(&["runc", "runsc"]);
    let ctx = h.context();
    h.store.put_desired(under_gvisor("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let (container, _) = h.published(&id("a"));
    let c = fake(&h, &container);
    assert_eq!(c.spec.runtime.as_deref(), Some("runsc"));
    assert_eq!(c.labels.isolation, Isolation::Gvisor);
    // Settled: the container under runsc keeps serving.
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    assert_eq!(h.published(&id("a")).0, container);
}

#[tokio::test]
async fn a_gvisor_row_is_failed_with_what_to_do_when_the_daemon_lacks_runsc() {
    let h = Harness::new();
    h.runtime.set_oci_runtimes(&["runc"]);
    let ctx = h.context();
    h.store.put_desired(under_gvisor("a"));
    let err = reconcile(&ctx, &id("a")).await.unwrap_err();
    let status = h.store.status_of(&id("a")).unwrap();
    assert_eq!(status.phase, Phase::Failed);
    for said in [
        "isolation gvisor needs the OCI runtime runsc",
        "(it has: runc)",
        "SANDBOXD_INSTALL_RUNSC=1",
        "ask for isolation 'container'",
    ] {
        assert!(status.message.contains(said), "{said}: {}", status.message);
        assert!(err.to_string().contains(said), "{said}: {err}");
    }
    assert!(h.containers(&id("a")).is_empty(), "nothing was created");
}

#[tokio::test]
async fn raising_a_row_s_level_rotates_to_a_container_under_runsc_with_fresh_credentials() {
    let h = Harness::new();
    h.runtime.set_oci_runtimes(&["runc", "runsc"]);
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (old, before) = h.published(&id("a"));
    assert_eq!(
        fake(&h, &old).spec.runtime,
        None,
        "Docker's default runtime"
    );
    assert_eq!(fake(&h, &old).labels.isolation, Isolation::Container);

    h.store.put_desired(under_gvisor("a"));
    assert_eq!(reconcile(&ctx, &id("a")).await.unwrap(), Next::Idle);
    let (new, after) = h.published(&id("a"));
    assert_ne!(new, old, "a new container: a runtime cannot change");
    assert_eq!(fake(&h, &new).spec.runtime.as_deref(), Some("runsc"));
    assert_ne!(after.password, before.password, "fresh credentials");
    assert_eq!(h.containers(&id("a")).len(), 1, "the old one is gone");
}

#[tokio::test]
async fn raising_a_row_s_level_where_runsc_is_missing_keeps_the_working_container() {
    let h = Harness::new();
    h.runtime.set_oci_runtimes(&["runc"]);
    let ctx = h.context();
    h.store.put_desired(row("a"));
    reconcile(&ctx, &id("a")).await.unwrap();
    let (before, _) = h.published(&id("a"));

    h.store.put_desired(under_gvisor("a"));
    reconcile(&ctx, &id("a")).await.unwrap_err();
    h.assert_failed_and_kept(&id("a"), &before);
}

#[tokio::test]
async fn the_controller_s_runtime_is_the_least_every_row_gets() {
    let mut h = Harness::new();
    h.config.isolation = Isolation::Gvisor;
    h.runtime.set_oci_runtimes(&["runc", "runsc"]);
    let ctx = h.context();
    // One row asks for nothing, one for less than the controller's level.
    h.store.put_desired(row("a"));
    h.store.put_desired(DesiredSandbox {
        isolation: Some(Isolation::Container),
        ..row("b")
    });
    for name in ["a", "b"] {
        reconcile(&ctx, &id(name)).await.unwrap();
        let (container, _) = h.published(&id(name));
        assert_eq!(
            fake(&h, &container).spec.runtime.as_deref(),
            Some("runsc"),
            "{name}"
        );
    }
}
