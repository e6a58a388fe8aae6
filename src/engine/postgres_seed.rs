//! How a Postgres seed reaches the agent's database: streamed, a chunk at
//! a time, into a client that runs next to the engine in its own container
//! (`seed/postgres.sh`), logged in as the agent over TCP: `psql` for SQL
//! text (statements, and `COPY … FROM stdin` blocks with their rows, as a
//! plain `pg_dump` writes), `pg_restore` for a `pg_dump` custom-format
//! archive. The controller never holds a seed whole and never expands an
//! archive: a load holds a chunk of it at a time, whatever its size.
//!
//! SQL text reaches psql framed so that it can be nothing but SQL and so
//! that sandboxd can tell it ran to its end:
//!
//! - first `\restrict KEY`, with a fresh random key: psql's restricted mode
//!   (PostgreSQL 17.6), in which every backslash command but `\unrestrict
//!   KEY` fails, so the seed cannot run a shell, read or write a file or
//!   log in as anyone else; the seed's own guard lines are emptied
//!   ([`crate::domain::pg_script`]);
//! - last, `;` (ending a last statement that has none) and a query that
//!   prints a marker with a fresh random token. The load succeeded only if
//!   psql exits 0 having printed it: a seed that ends inside a quoted
//!   string, a comment or a block's rows swallows the marker, and never
//!   counts as loaded.
//!
//! psql runs it all in one transaction (`--single-transaction`, stopping at
//! the first error), as pg_restore does an archive.

use super::{Credentials, Exec, SeedBytes};
use crate::domain::container::ByteStream;
use crate::domain::pg_script::GuardFilter;
use crate::domain::{entropy, seed};
use bytes::Bytes;
use futures::{stream, StreamExt};

/// The script that runs the client (see its comments).
const SCRIPT: &str = include_str!("seed/postgres.sh");

/// How much of the client's standard output the script prints (its last
/// bytes, where the marker is).
const OUTPUT_BYTES: usize = 256;

/// Loads `seed` into the database of the container `exec` runs in, whose
/// engine listens on `port`, logged in with `credentials`: the engine's
/// words when it fails.
pub(super) async fn load(
    exec: &dyn Exec,
    port: u16,
    credentials: &Credentials,
    seed: SeedBytes<'_>,
) -> Result<(), String> {
    let archive = seed::is_pg_archive(seed.head);
    let kind = if archive { "archive" } else { "sql" };
    let port = port.to_string();
    let timeout = seed::APPLY_TIMEOUT.as_secs().to_string();
    let cmd = [
        "bash",
        "-c",
        SCRIPT,
        "sandboxd-seed",
        kind,
        &port,
        &credentials.user,
        &credentials.database,
        &timeout,
    ];
    // The password reaches the script on its input, ahead of the seed.
    let password = Bytes::from(format!("{}\n", credentials.password.expose()));
    let login = stream::once(async move { Ok(password) });
    if archive {
        let out = exec
            .filter(&cmd, Vec::new(), login.chain(seed.chunks).boxed(), 0)
            .await?;
        return match out.exit_code {
            0 => Ok(()),
            code => Err(format!(
                "pg_restore could not restore the archive (exit {code}): {}",
                out.stderr.trim()
            )),
        };
    }
    let key = entropy::alphanumeric(32);
    let marker = format!("sandboxd-seed-{}", entropy::alphanumeric(32));
    let restrict = Bytes::from(format!("\\restrict {key}\n"));
    // `;` and the query on one line: psql 17.12 skips what follows a line
    // holding only `;` right after a block's rows.
    let end = Bytes::from(format!("\n;SELECT '{marker}';\n"));
    let input = login
        .chain(stream::once(async move { Ok(restrict) }))
        .chain(guarded(seed.chunks))
        .chain(stream::once(async move { Ok(end) }))
        .boxed();
    let out = exec.filter(&cmd, Vec::new(), input, OUTPUT_BYTES).await?;
    if out.exit_code != 0 {
        return Err(seed_lines(&out.stderr));
    }
    let printed = String::from_utf8_lossy(&out.stdout);
    if !printed.trim_end().ends_with(&marker) {
        return Err(
            "the seed ends inside a quoted string, a comment or a COPY block's rows, so psql never reached its end: close what is open (a COPY block ends with a line \\.)"
                .to_owned(),
        );
    }
    Ok(())
}

/// The seed's chunks with psql's guard lines emptied; a `COPY` block left
/// open at the end ends the input early, saying so.
fn guarded(chunks: ByteStream<'_>) -> ByteStream<'_> {
    stream::try_unfold(
        (chunks, Some(GuardFilter::default())),
        |(mut chunks, filter)| async move {
            let Some(mut filter) = filter else {
                return Ok(None);
            };
            let mut out = Vec::new();
            match chunks.next().await {
                Some(chunk) => filter.push(&chunk?, &mut out),
                None => {
                    filter.finish(&mut out).map_err(|e| e.to_string())?;
                    return Ok(Some((Bytes::from(out), (chunks, None))));
                }
            }
            Ok(Some((Bytes::from(out), (chunks, Some(filter)))))
        },
    )
    .boxed()
}

/// psql's error output with its line numbers turned into the seed's: psql
/// counts the `\restrict` line sandboxd puts first (`psql:<stdin>:N:`
/// becomes `line N-1:`).
fn seed_lines(stderr: &str) -> String {
    stderr
        .trim()
        .lines()
        .map(|line| {
            let Some(rest) = line.strip_prefix("psql:<stdin>:") else {
                return line.to_owned();
            };
            match rest.split_once(':') {
                Some((n, said)) => match n.parse::<u64>() {
                    Ok(n) => format!("line {}:{said}", n.saturating_sub(1)),
                    Err(_) => line.to_owned(),
                },
                None => line.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::seed_lines;

    #[test]
    fn psql_s_line_numbers_become_the_seed_s() {
        for (stderr, want) in [
            (
                "psql:<stdin>:4: ERROR:  division by zero\n",
                "line 3: ERROR:  division by zero",
            ),
            (
                "psql:<stdin>:2: error: backslash commands are restricted; only \\unrestrict is allowed",
                "line 1: error: backslash commands are restricted; only \\unrestrict is allowed",
            ),
            ("could not connect", "could not connect"),
            ("psql:<stdin>:x: odd", "psql:<stdin>:x: odd"),
        ] {
            assert_eq!(seed_lines(stderr), want, "{stderr}");
        }
    }
}
