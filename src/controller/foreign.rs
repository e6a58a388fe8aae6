//! Another state database's containers, networks and volumes on this
//! deployment: never touched, counted by every relist
//! (`sandboxd_foreign_containers`) and reported with one warning each,
//! not one per look.

use crate::domain::container::ObservedContainer;
use crate::domain::identity::{self, StateId};
use crate::ports::runtime::ObservedResource;
use std::collections::HashSet;
use std::sync::Mutex;

/// What has been reported already, so each foreign object is warned about
/// once while it exists (and again if it comes back after it was gone).
#[derive(Debug, Default)]
pub(crate) struct Foreign {
    reported: Mutex<HashSet<String>>,
}

impl Foreign {
    /// Warns about every foreign object in a full listing that was not
    /// reported yet, and forgets those no longer listed. `containers` are
    /// the foreign containers; `networks` and `volumes` everything of the
    /// deployment (those of another identity are picked here).
    pub(crate) fn report(
        &self,
        state: &StateId,
        containers: &[&ObservedContainer],
        networks: &[ObservedResource],
        volumes: &[ObservedResource],
    ) {
        let mut listed = HashSet::new();
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        for c in containers {
            let key = format!("container:{}", c.id.as_str());
            if reported.insert(key.clone()) {
                tracing::warn!(
                    container = %c.name,
                    sandbox = %c.labels.sandbox,
                    engine = c.labels.engine.as_str(),
                    their_state_id = c.labels.state_id.as_deref().unwrap_or("(none: created before identities)"),
                    state_id = %state,
                    "a container of this deployment belongs to another state database: it is never torn down, healed or rotated; point every controller of this deployment at one state database, or remove it by hand if nothing uses it"
                );
            }
            listed.insert(key);
        }
        for (kind, resources) in [("network", networks), ("volume", volumes)] {
            for r in resources
                .iter()
                .filter(|r| !identity::resource_is_ours(r.state_id.as_deref(), state))
            {
                let key = format!("{kind}:{}", r.name);
                if reported.insert(key.clone()) {
                    tracing::warn!(
                        kind,
                        name = %r.name,
                        their_state_id = r.state_id.as_deref().unwrap_or_default(),
                        state_id = %state,
                        "a network or volume of this deployment belongs to another state database: it is never removed"
                    );
                }
                listed.insert(key);
            }
        }
        reported.retain(|k| listed.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::container::ContainerState;
    use crate::domain::id::{ContainerId, Deployment, SandboxId};
    use crate::domain::labels::{self, ContainerLabels};
    use std::sync::{Arc, Mutex};

    const OURS: &str = "11111111-1111-4111-8111-111111111111";
    const THEIRS: &str = "22222222-2222-4222-8222-222222222222";

    fn theirs(id: &str) -> ObservedContainer {
        ObservedContainer {
            id: ContainerId::new(id),
            name: format!("sandboxd.test.{id}.redis"),
            labels: ContainerLabels {
                deployment: Deployment::parse("test").unwrap(),
                sandbox: SandboxId::parse(id).unwrap(),
                owner: String::new(),
                engine: "redis".into(),
                generation: 1,
                features: Default::default(),
                instance: "i".into(),
                state_id: Some(THEIRS.into()),
                incarnation: None,
                isolation: Default::default(),
                seed: None,
            },
            state: ContainerState::Running,
            created: chrono::DateTime::UNIX_EPOCH,
            host_port: None,
            networks: Vec::new(),
            paused: false,
        }
    }

    fn resource(name: &str, state_id: Option<&str>) -> ObservedResource {
        let mut l = labels::of_sandbox(
            &Deployment::parse("test").unwrap(),
            &SandboxId::parse("a").unwrap(),
        );
        if let Some(s) = state_id {
            l.insert(labels::STATE_ID.into(), s.into());
        }
        ObservedResource::of(name.into(), &l, &Deployment::parse("test").unwrap()).unwrap()
    }

    /// The warnings `f` logs.
    fn warnings(f: impl FnOnce()) -> Vec<String> {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn each_foreign_object_is_reported_once_while_it_exists_and_again_if_it_comes_back() {
        let foreign = Foreign::default();
        let state = StateId::parse(OURS).unwrap();
        let (a, b) = (theirs("a"), theirs("b"));
        let networks = [
            resource("sandboxd.test.a", Some(THEIRS)),
            resource("sandboxd.test.b", Some(OURS)),
            resource("sandboxd.test.c", None),
        ];
        let first = warnings(|| foreign.report(&state, &[&a, &b], &networks, &[]));
        assert_eq!(first.len(), 3, "{first:#?}");
        assert!(
            first[0].contains(THEIRS) && first[0].contains(OURS),
            "{}",
            first[0]
        );
        assert!(first
            .iter()
            .any(|l| l.contains("sandboxd.test.a") && l.contains("network")));

        let again = warnings(|| foreign.report(&state, &[&a, &b], &networks, &[]));
        assert!(again.is_empty(), "{again:#?}");

        // b is gone, then comes back: reported again.
        assert!(warnings(|| foreign.report(&state, &[&a], &networks, &[])).is_empty());
        let back = warnings(|| foreign.report(&state, &[&a, &b], &networks, &[]));
        assert_eq!(back.len(), 1, "{back:#?}");
        assert!(back[0].contains("sandboxd.test.b.redis"), "{}", back[0]);
    }
}
