//! The decision: from (desired row, observed containers, published status,
//! now) to the actions that converge them. Pure, so every case is a unit test.

use crate::model::{DesiredSandbox, SandboxStatus, ServiceStatus};
use crate::runtime::{ContainerState, ObservedContainer};
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Why an engine container is (re)created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProvisionReason {
    /// No usable container and no published credentials: fresh ones.
    Create,
    /// The container died or vanished: same credentials and endpoint.
    Heal,
    /// The requested features grew: the union, fresh credentials.
    Rotate,
    /// A running container whose credentials were never published
    /// (the controller stopped mid-provision): replaced with fresh ones.
    Replace,
}

impl ProvisionReason {
    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ProvisionReason::Create => "create",
            ProvisionReason::Heal => "heal",
            ProvisionReason::Rotate => "rotate",
            ProvisionReason::Replace => "replace",
        }
    }
}

/// Why a container is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapReason {
    /// The desired row was deleted (its status row still exists).
    Deleted,
    /// Neither a desired row nor a status row exists: a leftover, e.g. from
    /// a controller that lost its database or a crash before any status.
    Orphan,
    /// The row no longer lists the container's engine.
    ServiceDropped,
    /// The row is past `expires_at`.
    Expired,
    /// An extra container for an engine that already has a good one.
    Duplicate,
}

impl ReapReason {
    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ReapReason::Deleted => "deleted",
            ReapReason::Orphan => "orphan",
            ReapReason::ServiceDropped => "service_dropped",
            ReapReason::Expired => "expired",
            ReapReason::Duplicate => "duplicate",
        }
    }
}

/// One step towards the desired state.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The engine's container is fine: publish its existing status.
    Keep {
        /// Engine name.
        engine: String,
        /// Its published status.
        status: ServiceStatus,
    },
    /// Create the engine's container, removing `replace` first.
    Provision {
        /// Engine name.
        engine: String,
        /// Features to enable.
        features: BTreeSet<String>,
        /// Credentials and endpoint to keep (heal), or `None` for fresh ones.
        reuse: Option<ServiceStatus>,
        /// Host port to try to keep when not reusing a status.
        host_port: Option<u16>,
        /// Containers of this engine to remove first.
        replace: Vec<String>,
        /// Why.
        reason: ProvisionReason,
    },
    /// Remove a container now.
    Teardown {
        /// Container id.
        container: String,
        /// Engine name.
        engine: String,
        /// Why.
        reason: ReapReason,
    },
    /// A container to reap that is still inside the grace window.
    Wait {
        /// Container id.
        container: String,
        /// When it may be reaped.
        until: DateTime<Utc>,
    },
}

/// Whether a row wants anything, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// The row exists and is not expired.
    Yes,
    /// The row was deleted.
    Deleted,
    /// The row is past `expires_at`.
    Expired,
}

/// Decides what `wanted` means for the row.
pub fn wanted(desired: Option<&DesiredSandbox>, now: DateTime<Utc>) -> Wanted {
    match desired {
        None => Wanted::Deleted,
        Some(d) if d.is_expired(now) => Wanted::Expired,
        Some(_) => Wanted::Yes,
    }
}

fn reap(c: &ObservedContainer, reason: ReapReason, now: DateTime<Utc>, grace: Duration) -> Action {
    // Saturate: a grace window past the calendar's end means "not yet"
    // (`created + TimeDelta::MAX` would panic).
    let until = chrono::Duration::from_std(grace)
        .ok()
        .and_then(|g| c.created.checked_add_signed(g))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if now >= until || reason == ReapReason::Duplicate {
        Action::Teardown {
            container: c.id.clone(),
            engine: c.labels.engine.clone(),
            reason,
        }
    } else {
        Action::Wait {
            container: c.id.clone(),
            until,
        }
    }
}

/// Computes the actions for one sandbox.
///
/// `observed` are this deployment's containers for the sandbox; `status`
/// is what sandboxd published last (its credentials are the truth for
/// healing). Engines are visited in registry-independent sorted order.
pub fn plan(
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    status: Option<&SandboxStatus>,
    now: DateTime<Utc>,
    grace: Duration,
) -> Vec<Action> {
    let live: Vec<&ObservedContainer> = observed
        .iter()
        .filter(|c| c.state != ContainerState::Removing)
        .collect();
    let mut by_engine: BTreeMap<&str, Vec<&ObservedContainer>> = BTreeMap::new();
    for c in &live {
        by_engine
            .entry(c.labels.engine.as_str())
            .or_default()
            .push(c);
    }

    let why = wanted(desired, now);
    let desired = match (why, desired) {
        (Wanted::Yes, Some(d)) => d,
        _ => {
            let reason = match (why, status) {
                (Wanted::Expired, _) => ReapReason::Expired,
                (_, Some(_)) => ReapReason::Deleted,
                (_, None) => ReapReason::Orphan,
            };
            return live.iter().map(|c| reap(c, reason, now, grace)).collect();
        }
    };

    let mut actions = Vec::new();
    for (engine, containers) in &by_engine {
        if !desired.services.iter().any(|s| s == engine) {
            actions.extend(
                containers
                    .iter()
                    .map(|c| reap(c, ReapReason::ServiceDropped, now, grace)),
            );
        }
    }

    let mut services: Vec<&String> = desired.services.iter().collect();
    services.sort();
    services.dedup();
    for engine in services {
        let wanted_features = desired.features_for(engine);
        let containers = by_engine.get(engine.as_str()).cloned().unwrap_or_default();
        let published = status.and_then(|s| s.services.get(engine));
        actions.extend(plan_engine(
            engine,
            &wanted_features,
            &containers,
            published,
        ));
    }
    actions
}

fn plan_engine(
    engine: &str,
    wanted: &BTreeSet<String>,
    containers: &[&ObservedContainer],
    published: Option<&ServiceStatus>,
) -> Vec<Action> {
    let all_ids = |except: Option<&str>| -> Vec<String> {
        containers
            .iter()
            .filter(|c| Some(c.id.as_str()) != except)
            .map(|c| c.id.clone())
            .collect()
    };
    let running: Vec<&&ObservedContainer> = containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
        .collect();
    let is_published = |c: &ObservedContainer| {
        published.is_some_and(|p| !p.instance.is_empty() && p.instance == c.labels.instance)
    };

    // A running container whose credentials we published and that has every
    // wanted feature: keep it, remove any others.
    if let Some(good) = running
        .iter()
        .find(|c| is_published(c) && wanted.is_subset(&c.labels.features))
    {
        let mut actions = vec![Action::Keep {
            engine: engine.to_owned(),
            status: published.cloned().expect("is_published implies a status"),
        }];
        actions.extend(
            all_ids(Some(&good.id))
                .into_iter()
                .map(|id| Action::Teardown {
                    container: id,
                    engine: engine.to_owned(),
                    reason: ReapReason::Duplicate,
                }),
        );
        return actions;
    }

    // A running published container that lacks a wanted feature: rotate.
    if let Some(old) = running.iter().find(|c| is_published(c)) {
        return vec![Action::Provision {
            engine: engine.to_owned(),
            features: wanted.union(&old.labels.features).cloned().collect(),
            reuse: None,
            host_port: old.host_port.or(published.map(|p| p.host_port)),
            replace: all_ids(None),
            reason: ProvisionReason::Rotate,
        }];
    }

    // Nothing running with published credentials.
    if let Some(p) = published {
        let had: BTreeSet<String> = p.available_extensions.iter().cloned().collect();
        if wanted.is_subset(&had) {
            // Heal: the same credentials, endpoint and the features the
            // status promised.
            return vec![Action::Provision {
                engine: engine.to_owned(),
                features: had,
                reuse: Some(p.clone()),
                host_port: Some(p.host_port),
                replace: all_ids(None),
                reason: ProvisionReason::Heal,
            }];
        }
        if running.is_empty() {
            // The features grew while the container was gone: rotate to
            // the union, as for a running one.
            return vec![Action::Provision {
                engine: engine.to_owned(),
                features: had.union(wanted).cloned().collect(),
                reuse: None,
                host_port: Some(p.host_port),
                replace: all_ids(None),
                reason: ProvisionReason::Rotate,
            }];
        }
    }

    // A running container whose credentials were never published (the
    // controller stopped mid-provision), or nothing at all.
    let reason = if running.is_empty() {
        ProvisionReason::Create
    } else {
        ProvisionReason::Replace
    };
    vec![Action::Provision {
        engine: engine.to_owned(),
        features: wanted.clone(),
        reuse: None,
        host_port: published.map(|p| p.host_port),
        replace: all_ids(None),
        reason,
    }]
}

/// The earliest time a waiting reap becomes due, if any.
pub fn next_wake(actions: &[Action]) -> Option<DateTime<Utc>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Wait { until, .. } => Some(*until),
            _ => None,
        })
        .min()
}

#[cfg(test)]
mod tests;
