//! Whether an existing volume may serve as one of this deployment's
//! templates (or template binaries): reused as it is, replaced, or
//! refused.
//!
//! A template holds no tenant's data: it is built from the engine image
//! and the feature set only, by a job whose recipe (environment,
//! arguments, user, mount point, builder version) is fixed by the code.
//! So unlike a sandbox's data volume ([`super::identity::may_mount`],
//! which never mounts another state database's or incarnation's data),
//! a template is *not* scoped to the state database that built it: after
//! the state database is recreated (a new [`super::identity::StateId`]),
//! the same deployment would build byte-for-byte the same content, so the
//! old volume is reused when its labels prove that content (image id,
//! features, recipe), and replaced when they do not. The state database
//! and incarnation labels are not read here at all.
//!
//! What is never touched is what might not be a template: a volume of
//! another deployment (or none: not sandboxd's), and one that names a
//! sandbox (its data). Those are refused, counted in
//! `sandboxd_templates_refused` and shown by `sandboxd describe`; an
//! operator removes or renames them (docs/runbook.md,
//! SandboxdTemplateRefused).
//!
//! Pure, tested with a table.

use super::labels;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// The label naming the engine a template volume is for.
pub const TEMPLATE: &str = "io.sandboxd.template";
/// The label naming the image id a template volume was built from.
pub const TEMPLATE_IMAGE: &str = "io.sandboxd.template-image";
/// The label naming the engine a template binaries volume is for.
pub const TEMPLATE_BINARIES: &str = "io.sandboxd.template-binaries";
/// The label holding the digest of everything the template job does
/// besides its image (see [`recipe`]).
pub const TEMPLATE_RECIPE: &str = "io.sandboxd.template-recipe";

/// The labels that say what a template volume holds: equal values mean
/// equal content (the job is deterministic given them).
const CONTENT: [&str; 4] = [TEMPLATE_IMAGE, labels::FEATURES, TEMPLATE_RECIPE, TEMPLATE];

/// What to do with a volume that exists under a template's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its labels prove it holds what this deployment would build: mount
    /// it (whichever state database's controller built it).
    Reuse,
    /// This deployment's template of other content (or content its labels
    /// do not prove): remove it and build it again. Refused as
    /// [`Refusal::InUse`] if a container still mounts it.
    Replace,
    /// Not this deployment's template: never removed nor mounted.
    Refuse(Refusal),
}

/// Why a template volume is refused (the `reason` of
/// `sandboxd_templates_refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The volume under the template's name is another deployment's, or
    /// not sandboxd's at all.
    AnotherDeployment,
    /// The volume is this deployment's but not a template (a sandbox's
    /// data, or unlabelled as to what it holds).
    NotATemplate,
    /// The volume must be replaced but a container still mounts it.
    InUse,
}

impl Refusal {
    /// Every refusal.
    pub const ALL: [Refusal; 3] = [
        Refusal::AnotherDeployment,
        Refusal::NotATemplate,
        Refusal::InUse,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::AnotherDeployment => "another_deployment",
            Refusal::NotATemplate => "not_a_template",
            Refusal::InUse => "in_use",
        }
    }

    /// What it means and what the operator does about it.
    pub fn phrase(self) -> &'static str {
        match self {
            Refusal::AnotherDeployment => {
                "a volume of another deployment (or not sandboxd's) holds its name; \
                 sandboxd never touches it: remove or rename that volume"
            }
            Refusal::NotATemplate => {
                "a volume of this deployment that is not a template (it may hold a sandbox's data) \
                 holds its name; sandboxd never touches it: check it, then remove or rename it"
            }
            Refusal::InUse => {
                "the old template under its name must be replaced but a container still mounts it; \
                 it is replaced once that container is gone"
            }
        }
    }
}

/// What to do with a volume that exists with `existing` labels when this
/// deployment wants a template (or binaries) volume of that name with
/// `wanted` labels.
pub(crate) fn judge(
    existing: &HashMap<String, String>,
    wanted: &HashMap<String, String>,
) -> Verdict {
    let get = |m: &HashMap<String, String>, k: &str| m.get(k).cloned();
    if get(existing, labels::MANAGED_BY) != get(wanted, labels::MANAGED_BY)
        || get(existing, labels::DEPLOYMENT).is_none()
        || get(existing, labels::DEPLOYMENT) != get(wanted, labels::DEPLOYMENT)
    {
        return Verdict::Refuse(Refusal::AnotherDeployment);
    }
    let is_template = existing.contains_key(TEMPLATE) || existing.contains_key(TEMPLATE_BINARIES);
    if existing.contains_key(labels::SANDBOX) || !is_template {
        return Verdict::Refuse(Refusal::NotATemplate);
    }
    let same = |k: &str| get(existing, k) == get(wanted, k);
    if CONTENT.iter().all(|k| same(k)) && same(TEMPLATE_BINARIES) {
        Verdict::Reuse
    } else {
        Verdict::Replace
    }
}

/// What sandboxd's template job does besides running its image: bump it
/// when the job changes in a way its environment, arguments, user and
/// mount point do not show, so that every template is built again.
pub(crate) const BUILDER_VERSION: &str = "1";

/// The digest of a template job's recipe: the builder version and
/// `parts` (image id, features, environment, arguments, user, mount
/// point), 12 hex digits. Each part is length-prefixed, so no two lists
/// of parts have the same input.
pub(crate) fn recipe<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut hash = Sha256::new();
    for part in std::iter::once(BUILDER_VERSION).chain(parts) {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    super::hex::short(&hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(state: &str) -> HashMap<String, String> {
        HashMap::from(
            [
                (labels::MANAGED_BY, "sandboxd"),
                (labels::DEPLOYMENT, "prod"),
                (labels::STATE_ID, state),
                (TEMPLATE, "postgres"),
                (TEMPLATE_IMAGE, "sha256:aaa"),
                (labels::FEATURES, "pg_trgm"),
                (TEMPLATE_RECIPE, "0123456789ab"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        )
    }

    fn binaries(state: &str) -> HashMap<String, String> {
        HashMap::from(
            [
                (labels::MANAGED_BY, "sandboxd"),
                (labels::DEPLOYMENT, "prod"),
                (labels::STATE_ID, state),
                (TEMPLATE_BINARIES, "postgres"),
                (TEMPLATE_IMAGE, "sha256:aaa"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        )
    }

    /// A case: its name, the existing labels, the wanted ones, the verdict.
    type Case = (&'static str, Labels, Labels, Verdict);
    type Labels = HashMap<String, String>;

    fn with(mut m: HashMap<String, String>, k: &str, v: Option<&str>) -> HashMap<String, String> {
        match v {
            Some(v) => m.insert(k.to_owned(), v.to_owned()),
            None => m.remove(k),
        };
        m
    }

    #[test]
    fn a_template_is_reused_across_state_databases_replaced_when_unproven_and_refused_when_not_ours(
    ) {
        let wanted = template("new-db");
        let cases: Vec<Case> = vec![
            (
                "same state database",
                template("new-db"),
                wanted.clone(),
                Verdict::Reuse,
            ),
            (
                "another state database, same content",
                template("old-db"),
                wanted.clone(),
                Verdict::Reuse,
            ),
            (
                "built before identities",
                with(template("x"), labels::STATE_ID, None),
                wanted.clone(),
                Verdict::Reuse,
            ),
            (
                "another incarnation label is not read",
                with(template("old-db"), labels::INCARNATION, Some("7")),
                wanted.clone(),
                Verdict::Reuse,
            ),
            (
                "binaries of another state database",
                binaries("old-db"),
                binaries("new-db"),
                Verdict::Reuse,
            ),
            (
                "another image",
                with(template("old-db"), TEMPLATE_IMAGE, Some("sha256:bbb")),
                wanted.clone(),
                Verdict::Replace,
            ),
            (
                "other features",
                with(template("new-db"), labels::FEATURES, Some("citext")),
                wanted.clone(),
                Verdict::Replace,
            ),
            (
                "another recipe",
                with(template("old-db"), TEMPLATE_RECIPE, Some("ffffffffffff")),
                wanted.clone(),
                Verdict::Replace,
            ),
            (
                "no recipe (an older builder)",
                with(template("old-db"), TEMPLATE_RECIPE, None),
                wanted.clone(),
                Verdict::Replace,
            ),
            (
                "no image label",
                with(template("new-db"), TEMPLATE_IMAGE, None),
                wanted.clone(),
                Verdict::Replace,
            ),
            (
                "another engine's template",
                with(template("new-db"), TEMPLATE, Some("mongo")),
                wanted.clone(),
                Verdict::Replace,
            ),
            (
                "binaries where a template is wanted",
                binaries("new-db"),
                wanted.clone(),
                Verdict::Replace,
            ),
            (
                "binaries of another image",
                with(binaries("old-db"), TEMPLATE_IMAGE, Some("sha256:bbb")),
                binaries("new-db"),
                Verdict::Replace,
            ),
            (
                "another deployment",
                with(template("new-db"), labels::DEPLOYMENT, Some("staging")),
                wanted.clone(),
                Verdict::Refuse(Refusal::AnotherDeployment),
            ),
            (
                "no deployment label",
                with(template("new-db"), labels::DEPLOYMENT, None),
                wanted.clone(),
                Verdict::Refuse(Refusal::AnotherDeployment),
            ),
            (
                "not sandboxd's",
                with(template("new-db"), labels::MANAGED_BY, None),
                wanted.clone(),
                Verdict::Refuse(Refusal::AnotherDeployment),
            ),
            (
                "no labels at all (docker run -v made it)",
                HashMap::new(),
                wanted.clone(),
                Verdict::Refuse(Refusal::AnotherDeployment),
            ),
            (
                "a sandbox's data",
                with(template("new-db"), labels::SANDBOX, Some("sbx-1")),
                wanted.clone(),
                Verdict::Refuse(Refusal::NotATemplate),
            ),
            (
                "ours but of no known kind",
                with(
                    with(binaries("new-db"), TEMPLATE_BINARIES, None),
                    TEMPLATE,
                    None,
                ),
                wanted.clone(),
                Verdict::Refuse(Refusal::NotATemplate),
            ),
        ];
        for (case, existing, wanted, expected) in cases {
            assert_eq!(judge(&existing, &wanted), expected, "{case}");
        }
    }

    #[test]
    fn the_recipe_changes_with_any_part_and_not_with_nothing() {
        let base = recipe(["sha256:aaa", "pg_trgm", "PGDATA=/d"]);
        assert_eq!(base.len(), 12);
        assert_eq!(base, recipe(["sha256:aaa", "pg_trgm", "PGDATA=/d"]));
        assert_ne!(base, recipe(["sha256:aab", "pg_trgm", "PGDATA=/d"]));
        assert_ne!(base, recipe(["sha256:aaa", "pg_trgm", "PGDATA=/e"]));
        // Where the parts split matters.
        assert_ne!(recipe(["ab", "c"]), recipe(["a", "bc"]));
    }

    #[test]
    fn every_refusal_has_its_own_label_and_tells_what_to_do() {
        let names: std::collections::HashSet<_> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Refusal::ALL.len());
        for r in Refusal::ALL {
            assert!(r.phrase().len() > 40, "{r:?}");
        }
    }
}
