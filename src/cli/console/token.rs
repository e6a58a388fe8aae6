//! The operator page's action token: read once from the file
//! `--operator-token-file` names, and compared in constant time with what
//! each action sends (its form's `token` field or an `Authorization:
//! Bearer` header). Without the file the page has no actions at all.

use std::path::{Path, PathBuf};
use subtle::ConstantTimeEq;

/// The shortest token accepted: long enough that guessing it over HTTP is
/// hopeless (`openssl rand -hex 32` gives 64 characters).
pub(crate) const MIN_LEN: usize = 16;

/// Why the token file cannot be used; `sandboxd run` stops at start.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the operator token file {path} ({source}); write a token into it (`openssl rand -hex 32 > {path}; chmod 600 {path}`) or leave --operator-token-file out for a read-only page")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The token is too short (or the file is empty).
    #[error("the operator token in {path} has {len} characters; it needs at least {MIN_LEN} (`openssl rand -hex 32 > {path}`)")]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its token's length, without surrounding whitespace.
        len: usize,
    },
    /// Others than its owner may read the file.
    #[error("the operator token file {path} may be read by others than its owner (mode {mode:o}); `chmod 600 {path}`")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// The secret every action must present. Never printed: its `Debug` says
/// only that it is there.
#[derive(Clone)]
pub(crate) struct ActionToken(Vec<u8>);

impl std::fmt::Debug for ActionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ActionToken(***)")
    }
}

impl ActionToken {
    /// Reads the token from `path`: its content without surrounding
    /// whitespace, at least [`MIN_LEN`] characters, in a file no one but
    /// its owner may read.
    pub(crate) fn read(path: &Path) -> Result<Self, TokenError> {
        let read = |source| TokenError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(TokenError::Exposed {
                    path: path.to_owned(),
                    mode,
                });
            }
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        Self::new(text.trim()).map_err(|len| TokenError::TooShort {
            path: path.to_owned(),
            len,
        })
    }

    /// `token` when it is long enough, else its length.
    pub(crate) fn new(token: &str) -> Result<Self, usize> {
        let len = token.chars().count();
        if len < MIN_LEN {
            return Err(len);
        }
        Ok(Self(token.as_bytes().to_vec()))
    }

    /// Whether `presented` is the token, in time that does not depend on
    /// where the two differ.
    pub(crate) fn admits(&self, presented: &str) -> bool {
        bool::from(self.0.as_slice().ct_eq(presented.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_the_exact_token_is_admitted() {
        let token = ActionToken::new("0123456789abcdef-op").unwrap();
        for (presented, admitted) in [
            ("0123456789abcdef-op", true),
            ("0123456789abcdef-oq", false),
            ("0123456789abcdef-o", false),
            ("0123456789abcdef-op ", false),
            ("", false),
        ] {
            assert_eq!(token.admits(presented), admitted, "{presented:?}");
        }
        assert_eq!(format!("{token:?}"), "ActionToken(***)");
    }

    fn file(name: &str, content: &str, mode: u32) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sandboxd-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_token_file_must_be_private_and_hold_a_long_token() {
        let ok = file("ok", "  0123456789abcdef0123\n", 0o600);
        assert!(ActionToken::read(&ok)
            .unwrap()
            .admits("0123456789abcdef0123"));

        let short = file("short", "hunter2\n", 0o600);
        let e = ActionToken::read(&short).unwrap_err().to_string();
        assert!(
            e.contains("has 7 characters") && e.contains("openssl rand"),
            "{e}"
        );

        let empty = file("empty", "\n", 0o400);
        assert!(matches!(
            ActionToken::read(&empty),
            Err(TokenError::TooShort { len: 0, .. })
        ));

        let exposed = file("exposed", "0123456789abcdef0123", 0o644);
        let e = ActionToken::read(&exposed).unwrap_err().to_string();
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");

        let missing = exposed.with_file_name("missing");
        let e = ActionToken::read(&missing).unwrap_err().to_string();
        assert!(e.contains("cannot read the operator token file"), "{e}");
    }
}
