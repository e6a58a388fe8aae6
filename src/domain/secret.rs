//! Credentials: random, and never printed by `Debug` or `Display`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Length of generated passwords. 32 characters from a 62-symbol alphabet
/// carry about 190 bits of entropy (the floor is 128).
pub(crate) const PASSWORD_LEN: usize = 32;

/// A password. `Debug` prints `Secret(***)` so it cannot leak through logs
/// or error messages by accident; read it with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A fresh random password from the operating system's CSPRNG.
    pub fn generate() -> Self {
        Self(super::entropy::alphanumeric(PASSWORD_LEN))
    }

    /// Wraps a known value (read back from `sandbox_status`).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The password itself: only for building connections and the status row.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_passwords_are_long_distinct_and_url_safe() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), PASSWORD_LEN);
        assert!(a.expose().chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn debug_output_hides_the_password() {
        let s = Secret::new("hunter2hunter2");
        assert_eq!(format!("{s:?}"), "Secret(***)");
    }
}
