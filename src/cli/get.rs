//! `sandboxd get`: a sandbox's status as JSON (with its credentials) or as
//! `export` lines; the status printer the waiting verbs share.

use super::args::{GetArgs, GetOutput};
use super::CliError;
use crate::client::Client;
use crate::domain::sandbox::SandboxStatus;
use std::collections::BTreeMap;

/// Prints the status of `args.id`, as JSON or as `export` lines.
pub(super) async fn get(url: &str, args: GetArgs) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    let status = client
        .status(&args.id)
        .await?
        .ok_or_else(|| CliError::NotFound(args.id.clone()))?;
    if args.env || args.output == GetOutput::Env {
        for line in export_lines(&status)? {
            say!("{line}");
        }
    } else {
        print_status(&status);
    }
    Ok(())
}

/// Prints a status as pretty JSON (credentials included).
pub(super) fn print_status(s: &SandboxStatus) {
    let services: BTreeMap<_, _> = s
        .services
        .iter()
        .map(|(k, v)| (k, serde_json::to_value(v).expect("status is JSON")))
        .collect();
    let doc = serde_json::json!({
        "id": s.id.as_str(),
        "phase": s.phase,
        "observed_generation": s.observed_generation,
        "incarnation": s.incarnation.as_ref().map(|i| i.as_str()),
        "message": s.message,
        "services": services,
        "network": s.network,
        "updated_at": s.updated_at,
    });
    say!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
}

/// `export NAME='value'`, safe for `eval` in a POSIX shell: the value is
/// single-quoted (a `'` becomes `'\''`), so nothing in it is expanded.
/// `None` when `name` is not a shell variable name.
pub fn export_line(name: &str, value: &str) -> Option<String> {
    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then(|| format!("export {name}='{}'", value.replace('\'', r"'\''")))
}

/// [`export_line`]s for every engine's `env`; a name that is not a shell
/// variable name is refused rather than printed.
pub fn export_lines(status: &SandboxStatus) -> Result<Vec<String>, CliError> {
    let mut lines = Vec::new();
    for svc in status.services.values() {
        for (name, value) in &svc.env {
            lines.push(
                export_line(name, value).ok_or_else(|| CliError::UnsafeVariable {
                    id: status.id.clone(),
                    name: name.chars().filter(|c| !c.is_control()).take(80).collect(),
                })?,
            );
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_lines_evaluate_to_exactly_the_values_whatever_they_hold() {
        let values = [
            "plain",
            "it's",
            "''",
            "$(echo pwned) `id` $HOME \\ \"",
            "two\nlines",
            "",
        ];
        let mut script = String::new();
        for (i, value) in values.iter().enumerate() {
            script.push_str(&export_line(&format!("V{i}"), value).unwrap());
            script.push('\n');
            script.push_str(&format!("printf '%s\\0' \"$V{i}\"\n"));
        }
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: Vec<&str> = std::str::from_utf8(&out.stdout)
            .unwrap()
            .split_terminator('\0')
            .collect();
        assert_eq!(printed, values);
    }
    #[test]
    fn export_lines_refuse_names_a_shell_would_misread() {
        assert!(export_line("SANDBOX_DB_HOST", "x").is_some());
        assert!(export_line("_X1", "x").is_some());
        for name in ["", "1X", "A-B", "A B", "X;rm", "X=Y", "A$B", "Ä"] {
            assert!(export_line(name, "x").is_none(), "{name:?}");
        }
    }
}
