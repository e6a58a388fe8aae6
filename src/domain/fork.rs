//! Forks: a sandbox whose engines start with a copy of another sandbox's
//! data (`sandbox_fork`). The row names its source by id and incarnation,
//! both fixed at insert, so a source released and requested again under
//! the same id is another sandbox whose data is never copied.
//!
//! The copy is taken by the fork's first container of each engine, into
//! a volume of the fork's own ([`volume_name`]); that copy is the fork's
//! starting point from then on: a heal starts from it again, as a seeded
//! sandbox's heal loads its seed again. A fork's services and features
//! are its source's (the database refuses a change: the copy was made for
//! them); a rotation to a stronger isolation level takes a new copy, as
//! the first container did.

use super::id::{Deployment, EngineName, Incarnation, SandboxId};
use super::network::container_name;

/// The sandbox a fork copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkOf {
    /// The source's id.
    pub sandbox: SandboxId,
    /// The source's incarnation when the fork was made.
    pub incarnation: Incarnation,
}

/// The name of the volume holding the fork `id`'s copy of `engine`'s
/// data: named like its container, with a suffix no sandbox id ends a
/// container name with.
pub(crate) fn volume_name(deployment: &Deployment, id: &SandboxId, engine: EngineName) -> String {
    format!("{}.fork", container_name(deployment, id, engine))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_volume_is_named_after_its_container() {
        let dep = Deployment::parse("sbx").unwrap();
        let id = SandboxId::parse("agent-7").unwrap();
        let name = volume_name(&dep, &id, EngineName::of_engine("postgres"));
        assert_eq!(
            name,
            format!(
                "{}.fork",
                container_name(&dep, &id, EngineName::of_engine("postgres"))
            )
        );
        assert!(name.ends_with(".fork"));
    }
}
