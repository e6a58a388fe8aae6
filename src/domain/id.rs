//! Identifiers: validated sandbox ids and deployment names (the only values
//! from rows that reach container names, labels or SQL), engine names that
//! only the engine registry can mint, and container ids.

use std::fmt;

/// Why an identifier was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    /// The text does not match the allowed shape.
    #[error("invalid {kind} {value:?}: use 1 to 63 characters from a-z, 0-9, '-' and '_', starting with a letter or digit")]
    Invalid {
        /// What was being parsed ("sandbox id", "deployment").
        kind: &'static str,
        /// The offending value, cut to 80 characters.
        value: String,
    },
}

fn valid(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
}

fn parse(kind: &'static str, s: &str) -> Result<String, IdError> {
    if valid(s) {
        Ok(s.to_owned())
    } else {
        Err(IdError::Invalid {
            kind,
            value: s.chars().take(80).collect(),
        })
    }
}

/// The key of one sandbox, as the orchestrator named it in `sandbox_desired.id`.
///
/// Same rule as the database check: `^[a-z0-9][a-z0-9_-]{0,62}$`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

impl SandboxId {
    /// Validates `s` as a sandbox id.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        parse("sandbox id", s).map(Self)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl std::str::FromStr for SandboxId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The name of one sandboxd deployment: the label that scopes which
/// containers this controller may touch.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Deployment(String);

impl Deployment {
    /// Validates `s` as a deployment name.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        parse("deployment", s).map(Self)
    }

    /// The deployment as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Deployment {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The name of an engine in the registry (`postgres`, `redis`, ...).
///
/// Only the engine registry creates these (see `crate::engine`), so
/// holding one means the engine exists in this binary: a row naming an
/// unknown engine is resolved once, where it is read, and never reaches a
/// lookup that could fail later.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineName(&'static str);

impl EngineName {
    /// The name an engine type declares for itself. Only engine types call
    /// this, each with its own constant name.
    pub(crate) const fn of_engine(name: &'static str) -> Self {
        Self(name)
    }

    /// The name as text (as in `services`, labels and metrics).
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for EngineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for EngineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl PartialEq<str> for EngineName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

/// A container's id as the runtime reports it.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(String);

impl ContainerId {
    /// Wraps an id the runtime returned.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 characters, as `docker ps` shows them.
    pub fn short(&self) -> &str {
        self.0.get(..12).unwrap_or(&self.0)
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short())
    }
}

impl fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

// ---------------------------------------------------------------------------
// Uuids the state database hands out: its identity and a row's incarnation
// (what they scope is `domain::identity`'s).
// ---------------------------------------------------------------------------

/// Why a state database identity or an incarnation was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// Not a uuid in its canonical text form.
    #[error("invalid {kind} {value:?}: expected a uuid such as 5f0c7e3a-9b1d-4c2e-8f00-1a2b3c4d5e6f (is the state database migrated? run `sandboxd migrate`)")]
    NotAUuid {
        /// What was being parsed ("state database identity", "incarnation").
        kind: &'static str,
        /// The offending value, cut to 80 characters.
        value: String,
    },
}

/// Whether `s` is a uuid as Postgres prints one: 8-4-4-4-12 lowercase hex.
fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

fn parse_uuid(kind: &'static str, s: &str) -> Result<String, IdentityError> {
    if is_uuid(s) {
        Ok(s.to_owned())
    } else {
        Err(IdentityError::NotAUuid {
            kind,
            value: s.chars().take(80).collect(),
        })
    }
}

/// The identity of a state database (`sandbox_identity.state_id`): a
/// random uuid its migration created. A restored dump keeps it; a new
/// database has another.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct StateId(String);

impl StateId {
    /// Validates `s` as a state database identity.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        parse_uuid("state database identity", s).map(Self)
    }

    /// The identity as text (as in the label).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One incarnation of a desired row (`sandbox_desired.incarnation`): a
/// random uuid the database sets when the row is inserted and keeps while
/// it exists, so a row deleted and inserted again under the same id is
/// another incarnation.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Incarnation(String);

impl Incarnation {
    /// Validates `s` as an incarnation.
    pub fn parse(s: &str) -> Result<Self, IdentityError> {
        parse_uuid("incarnation", s).map(Self)
    }

    /// The incarnation as text (as in the label and the status).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `a` and `b` (as text: a label, a row's) may be one
    /// incarnation: the same, or either side from before incarnations.
    pub(crate) fn may_match(a: Option<&str>, b: Option<&str>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_with_digits_dashes_and_underscores_are_accepted() {
        for ok in ["a", "agent-7", "0abc", "x_y-z", &"a".repeat(63)] {
            assert!(SandboxId::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn empty_oversized_uppercase_and_punctuated_ids_are_refused() {
        for bad in [
            "",
            &"a".repeat(64),
            "Agent",
            "-lead",
            "_lead",
            "a b",
            "a/b",
            "a;drop",
            "é",
        ] {
            let err = SandboxId::parse(bad).unwrap_err();
            assert!(err.to_string().contains("use 1 to 63 characters"), "{bad}");
        }
    }

    #[test]
    fn container_ids_display_in_their_short_form() {
        let id = ContainerId::new("0123456789abcdef0123");
        assert_eq!(id.to_string(), "0123456789ab");
        assert_eq!(ContainerId::new("abc").to_string(), "abc");
    }
}
