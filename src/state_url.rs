//! Which state database a command talks to: `--database-url`, else
//! `DATABASE_URL`, else the URL `scripts/run.sh` recorded for the state
//! database it started (`$SANDBOXD_HOME/database-url`, by default
//! `~/.local/state/sandboxd/database-url`, mode 0600 beside the password).

use std::path::{Path, PathBuf};

/// The file, under [`home`], that holds the URL `scripts/run.sh` recorded.
pub const URL_FILE: &str = "database-url";

/// Why no state database URL could be had.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateUrlError {
    /// Nothing given and nothing recorded.
    #[error("no state database: set DATABASE_URL, pass --database-url, or start one with scripts/run.sh (it records its URL in {0})")]
    Missing(PathBuf),
    /// The recorded file could not be read.
    #[error("cannot read the state database URL in {path} ({reason}); pass --database-url or set DATABASE_URL instead")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The recorded file is readable by others: its URL holds a password.
    #[error("{path} holds a password and is readable by others (mode {mode:o}): chmod 600 {path}")]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The recorded file is empty.
    #[error(
        "{0} is empty: start the controller with scripts/run.sh again, or pass --database-url"
    )]
    Empty(PathBuf),
}

/// Where a command's state database URL came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--database-url`.
    Flag,
    /// The `DATABASE_URL` variable.
    Env,
    /// The file `scripts/run.sh` wrote.
    File(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag => f.write_str("--database-url"),
            Source::Env => f.write_str("DATABASE_URL"),
            Source::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// sandboxd's state directory on this machine: `SANDBOXD_HOME`, else
/// `$HOME/.local/state/sandboxd` (the one `scripts/run.sh` uses).
pub fn home() -> PathBuf {
    match std::env::var_os("SANDBOXD_HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".local/state/sandboxd"),
    }
}

/// The URL to use and where it came from: `given` (clap's merge of
/// `--database-url` and `DATABASE_URL`, told apart by `env`, the variable's
/// value), else the file under `home`.
pub fn resolve(
    given: Option<String>,
    env: Option<&str>,
    home: &Path,
) -> Result<(String, Source), StateUrlError> {
    if let Some(url) = given.filter(|u| !u.is_empty()) {
        let source = if env == Some(url.as_str()) {
            Source::Env
        } else {
            Source::Flag
        };
        return Ok((url, source));
    }
    let path = home.join(URL_FILE);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StateUrlError::Missing(path))
        }
        Err(e) => {
            return Err(StateUrlError::Unreadable {
                path,
                reason: e.to_string(),
            })
        }
    };
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(StateUrlError::TooOpen { path, mode });
    }
    let url = std::fs::read_to_string(&path).map_err(|e| StateUrlError::Unreadable {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let url = url.trim().to_owned();
    if url.is_empty() {
        return Err(StateUrlError::Empty(path));
    }
    Ok((url, Source::File(path)))
}

/// `url` without its password, for messages.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(unparsable URL)".into();
    };
    // The last '@' ends the user information, whatever the password holds.
    match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("sandboxd-state-url-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(d: &Path, text: &str, mode: u32) {
        let p = d.join(URL_FILE);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_flag_or_variable_wins_over_the_recorded_file_and_says_which_it_was() {
        let d = dir("given");
        write(&d, "postgres://file", 0o600);
        assert_eq!(
            resolve(Some("postgres://a".into()), Some("postgres://a"), &d).unwrap(),
            ("postgres://a".to_owned(), Source::Env)
        );
        assert_eq!(
            resolve(Some("postgres://b".into()), Some("postgres://a"), &d).unwrap(),
            ("postgres://b".to_owned(), Source::Flag)
        );
    }

    #[test]
    fn without_either_the_url_run_sh_recorded_is_used() {
        let d = dir("file");
        write(&d, "postgres://sandboxd:pw@127.0.0.1:5/sandboxd\n", 0o600);
        assert_eq!(
            resolve(None, None, &d).unwrap(),
            (
                "postgres://sandboxd:pw@127.0.0.1:5/sandboxd".to_owned(),
                Source::File(d.join(URL_FILE))
            )
        );
    }

    #[test]
    fn a_missing_empty_or_world_readable_file_is_refused_with_what_to_do() {
        let d = dir("refused");
        let e = resolve(None, None, &d).unwrap_err();
        assert!(e.to_string().contains("set DATABASE_URL"), "{e}");
        assert!(e.to_string().contains("scripts/run.sh"), "{e}");
        write(&d, "postgres://x", 0o644);
        let e = resolve(None, None, &d).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        write(&d, " \n", 0o600);
        assert!(matches!(
            resolve(None, None, &d),
            Err(StateUrlError::Empty(_))
        ));
    }

    #[test]
    fn messages_show_the_url_without_its_password() {
        assert_eq!(
            redacted("postgres://sandboxd:secret@127.0.0.1:5432/sandboxd"),
            "postgres://sandboxd:***@127.0.0.1:5432/sandboxd"
        );
        assert_eq!(
            redacted("postgres://127.0.0.1/sandboxd"),
            "postgres://127.0.0.1/sandboxd"
        );
        assert!(!redacted("postgres://u:p@w@h/d").contains("p@w"));
    }
}
