//! Isolation levels: how far a sandbox's engines are kept from the host's
//! kernel.
//!
//! Every sandbox container is hardened the same way (read-only root, a
//! non-root user, no capabilities, caps, its own network); what differs is
//! who answers its system calls:
//!
//! - `container`: the host's kernel, under Docker's default runtime
//!   (runc). A kernel bug reachable through a system call is a way out.
//! - `gvisor`: gVisor's user-space kernel, under the OCI runtime `runsc`.
//!   The engine talks to gVisor's Sentry, which itself uses a small,
//!   filtered set of the host's system calls; a kernel bug the engine can
//!   reach is a bug in gVisor, not in the host.
//!
//! A row may ask for a level (`sandbox_desired.isolation`, NULL: none);
//! the controller's `--runtime` is the least every sandbox gets. The
//! stronger of the two wins ([`Isolation::effective`]): a tenant can raise
//! its own sandbox's level, never lower the operator's.

use std::fmt;

/// The OCI runtime name gVisor is registered under with dockerd.
pub const RUNSC: &str = "runsc";

/// An isolation level, weakest first (the order is the strength).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isolation {
    /// Docker's default runtime: namespaces and cgroups on the host's kernel.
    #[default]
    Container,
    /// gVisor (`runsc`): a user-space kernel between the engine and the host's.
    Gvisor,
}

impl Isolation {
    /// Every level, weakest first.
    pub const ALL: [Isolation; 2] = [Isolation::Container, Isolation::Gvisor];

    /// The text stored in the database and in the container label.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Container => "container",
            Isolation::Gvisor => "gvisor",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|i| i.as_str() == s)
    }

    /// The OCI runtime dockerd runs the container under: `None` for
    /// Docker's default.
    pub fn runtime(self) -> Option<&'static str> {
        match self {
            Isolation::Container => None,
            Isolation::Gvisor => Some(RUNSC),
        }
    }

    /// The level a sandbox gets: what its row asks for (`None`: nothing),
    /// but never less than the controller's `floor`.
    pub fn effective(row: Option<Isolation>, floor: Isolation) -> Isolation {
        row.map_or(floor, |asked| asked.max(floor))
    }

    /// The level a container's label records: none (made before levels
    /// existed) is `container`, and so is one this binary does not know
    /// (a row that asks for more gets a new container).
    pub fn of_label(label: Option<&str>) -> Isolation {
        label.and_then(Isolation::parse).unwrap_or_default()
    }

    /// Whether the daemon can run this level, given the runtimes it has
    /// registered (`None`: it did not say, and the create will tell).
    /// Returns the runtime it lacks.
    pub fn missing_runtime(self, registered: Option<&[String]>) -> Option<&'static str> {
        let needed = self.runtime()?;
        let registered = registered?;
        (!registered.iter().any(|r| r == needed)).then_some(needed)
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Isolation::{Container, Gvisor};
    use super::*;

    #[test]
    fn the_stronger_of_the_row_and_the_controller_wins() {
        // (row, controller floor, effective)
        let cases = [
            (None, Container, Container),
            (None, Gvisor, Gvisor),
            (Some(Container), Container, Container),
            (Some(Gvisor), Container, Gvisor),
            // A row cannot lower the operator's level.
            (Some(Container), Gvisor, Gvisor),
            (Some(Gvisor), Gvisor, Gvisor),
        ];
        for (row, floor, want) in cases {
            assert_eq!(Isolation::effective(row, floor), want, "{row:?} {floor:?}");
        }
    }

    #[test]
    fn levels_read_back_from_text_and_labels() {
        for i in Isolation::ALL {
            assert_eq!(Isolation::parse(i.as_str()), Some(i));
            assert_eq!(Isolation::of_label(Some(i.as_str())), i);
        }
        assert_eq!(Isolation::parse("kata"), None);
        assert_eq!(Isolation::of_label(None), Container);
        assert_eq!(Isolation::of_label(Some("microvm")), Container);
    }

    #[test]
    fn a_level_is_unavailable_only_when_the_daemon_says_it_lacks_the_runtime() {
        let runc = vec!["runc".to_owned(), "io.containerd.runc.v2".to_owned()];
        let both = vec!["runc".to_owned(), "runsc".to_owned()];
        // (level, registered runtimes, the one missing)
        type Case<'a> = (Isolation, Option<&'a [String]>, Option<&'a str>);
        let cases: [Case; 5] = [
            (Container, Some(&[]), None),
            (Container, Some(&runc), None),
            (Gvisor, Some(&runc), Some("runsc")),
            (Gvisor, Some(&both), None),
            (Gvisor, None, None),
        ];
        for (level, registered, want) in cases {
            assert_eq!(
                level.missing_runtime(registered),
                want,
                "{level} {registered:?}"
            );
        }
        assert_eq!(Container.runtime(), None);
        assert_eq!(Gvisor.runtime(), Some(RUNSC));
    }
}
