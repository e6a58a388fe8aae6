//! How a Postgres seed reaches the agent's database: SQL text, as psql
//! would run it (statements, and `COPY … FROM stdin` blocks with their
//! rows, as a plain `pg_dump` writes), or a `pg_dump` custom-format
//! archive, turned into that text by the container's own `pg_restore`
//! (which only reads the archive: it connects to nothing), then run the
//! same way. Everything runs over the agent's own login, in one
//! transaction: the seed can do what the agent can, nothing more.

use super::Exec;
use crate::domain::pg_script::{self, Part};
use crate::domain::seed;
use sqlx::PgConnection;
use std::borrow::Cow;

/// `pg_restore` writing an archive's script to its standard output, with
/// what would need another role left out: owners (the agent owns what it
/// makes), grants, tablespaces, security labels, publications and
/// subscriptions.
const RESTORE: &[&str] = &[
    "pg_restore",
    "--file=-",
    "--no-owner",
    "--no-privileges",
    "--no-tablespaces",
    "--no-security-labels",
    "--no-publications",
    "--no-subscriptions",
];

/// The largest script an archive may turn into (its rows are compressed
/// in the archive, at most 16 MiB of it).
const SCRIPT_BYTES: usize = 256 * 1024 * 1024;

/// The SQL text of seed `content`: an archive's script, or the content.
pub(super) async fn script<'a>(exec: &dyn Exec, content: &'a [u8]) -> Result<Cow<'a, str>, String> {
    if !seed::is_pg_archive(content) {
        return std::str::from_utf8(content).map(Cow::Borrowed).map_err(|_| {
            "the seed is neither UTF-8 SQL text nor a pg_dump custom-format archive (pg_dump -Fc)"
                .to_owned()
        });
    }
    let out = exec.filter(RESTORE, content, SCRIPT_BYTES).await?;
    if out.exit_code != 0 {
        return Err(format!(
            "pg_restore could not read the archive (exit {}): {}",
            out.exit_code,
            out.stderr.trim()
        ));
    }
    String::from_utf8(out.stdout).map(Cow::Owned).map_err(|_| {
        "the archive's script is not UTF-8: dump a database whose encoding is UTF8".to_owned()
    })
}

/// Runs `sql` on `conn` (the agent's login), each statement under
/// [`seed::APPLY_TIMEOUT`] unless the script sets its own: plain text as
/// one simple query (one implicit transaction unless it says otherwise),
/// a script in parts (rows, or psql's guard lines between statements) in
/// one explicit transaction.
pub(super) async fn run(conn: &mut PgConnection, sql: &str) -> Result<(), String> {
    let parts = pg_script::parts(sql).map_err(|e| e.to_string())?;
    let timeout = format!(
        "SET statement_timeout = '{}s'",
        seed::APPLY_TIMEOUT.as_secs()
    );
    execute(conn, &timeout).await?;
    let in_parts = parts.len() > 1;
    if in_parts {
        execute(conn, "BEGIN").await?;
    }
    for part in &parts {
        match part {
            Part::Sql(sql) => execute(conn, sql).await?,
            Part::Copy { statement, rows } => copy(conn, statement, rows).await?,
        }
    }
    if in_parts {
        execute(conn, "COMMIT").await?;
    }
    Ok(())
}

/// `sql` as one simple query (a text without arguments goes so).
async fn execute(conn: &mut PgConnection, sql: &str) -> Result<(), String> {
    sqlx::Executor::execute(&mut *conn, sql)
        .await
        .map(|_| ())
        .map_err(reason)
}

/// A `COPY … FROM stdin` and its rows, over the copy protocol.
async fn copy(conn: &mut PgConnection, statement: &str, rows: &str) -> Result<(), String> {
    let mut into = conn.copy_in_raw(statement).await.map_err(reason)?;
    let sent = into.send(rows.as_bytes()).await.map(|_| ());
    if let Err(e) = sent {
        let _ = into.abort("the seed's rows could not be sent").await;
        return Err(reason(e));
    }
    into.finish().await.map(|_| ()).map_err(reason)
}

/// The server's words for `e`, or the client's.
fn reason(e: sqlx::Error) -> String {
    match &e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}
