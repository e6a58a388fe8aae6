//! A Postgres script as `pg_dump` and `pg_restore -f -` write it, cut into
//! what a client sends over the wire: SQL, sent as simple queries, and
//! `COPY … FROM stdin;` blocks, whose rows follow the statement up to a
//! line `\.` and go over the copy protocol. psql does this cut when it
//! runs such a script; a seed is run by sandboxd, so it does it here.
//!
//! The cut is by lines, as psql's is for these blocks: a line that starts
//! a `COPY` and ends `FROM stdin;` opens a block, and so does the same
//! statement ending in `WITH (…);` (what `pg_dump` never writes, but a
//! person might). The only psql meta-commands a dump holds since
//! PostgreSQL 17.6, `\restrict KEY` and `\unrestrict KEY`, guard psql
//! itself and are dropped; any other backslash line goes to the server as
//! it is (and fails there, saying so).

/// One piece of a script, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part<'a> {
    /// Statements, sent as one simple query.
    Sql(&'a str),
    /// A `COPY … FROM stdin` statement and its rows (each line ending in
    /// `\n`, without the closing `\.`).
    Copy {
        /// The statement.
        statement: &'a str,
        /// The rows.
        rows: &'a str,
    },
}

/// Why a script cannot be cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ScriptError {
    /// A copy block has no closing `\.` line.
    #[error("line {line}: the rows of `{statement}` have no closing line \\. (a dump cut short?)")]
    Unterminated {
        /// 1-based line of the `COPY`.
        line: usize,
        /// The statement, cut to 80 characters.
        statement: String,
    },
}

/// The parts of `script`; SQL that is only whitespace and comments between
/// two blocks is still a part (the server skips it at no cost).
pub(crate) fn parts(script: &str) -> Result<Vec<Part<'_>>, ScriptError> {
    let mut parts = Vec::new();
    // Where the SQL not yet emitted starts.
    let mut sql_from = 0;
    // Each line with its `\n`, its byte offset and its 0-based number.
    let mut lines = script
        .split_inclusive('\n')
        .scan(0, |next, line| {
            let at = *next;
            *next += line.len();
            Some((at, line))
        })
        .enumerate();
    while let Some((n, (at, line))) = lines.next() {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_guard(bare) {
            push_sql(&mut parts, &script[sql_from..at]);
            sql_from = at + line.len();
            continue;
        }
        if !opens_copy(bare) {
            continue;
        }
        push_sql(&mut parts, &script[sql_from..at]);
        let rows_from = at + line.len();
        let mut rows_to = None;
        for (_, (row_at, row)) in lines.by_ref() {
            if row.trim_end_matches(['\n', '\r']) == "\\." {
                rows_to = Some((row_at, row_at + row.len()));
                break;
            }
        }
        let Some((rows_end, next)) = rows_to else {
            return Err(ScriptError::Unterminated {
                line: n + 1,
                statement: bare.chars().take(80).collect(),
            });
        };
        parts.push(Part::Copy {
            statement: bare,
            rows: &script[rows_from..rows_end],
        });
        sql_from = next;
    }
    push_sql(&mut parts, &script[sql_from..]);
    Ok(parts)
}

/// Adds `sql` unless it is only whitespace.
fn push_sql<'a>(parts: &mut Vec<Part<'a>>, sql: &'a str) {
    if !sql.trim().is_empty() {
        parts.push(Part::Sql(sql));
    }
}

/// `\restrict KEY` or `\unrestrict KEY`: psql's guard against a dump that
/// smuggles meta-commands, meaningless to a server.
fn is_guard(line: &str) -> bool {
    let word = line.split_whitespace().next().unwrap_or("");
    word == "\\restrict" || word == "\\unrestrict"
}

/// Whether `line` is a whole `COPY … FROM stdin` statement.
fn opens_copy(line: &str) -> bool {
    let upper = line.trim().to_ascii_uppercase();
    upper.starts_with("COPY ")
        && upper.ends_with(';')
        && (upper.ends_with("FROM STDIN;") || upper.contains(" FROM STDIN WITH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_is_cut_into_sql_and_copy_blocks() {
        let dump = "SET x = 1;\n\\restrict abc123\nCREATE TABLE t (a int);\n\
                    COPY public.t (a) FROM stdin;\n1\n2\n\\.\n\nSELECT 1;\n\\unrestrict abc123\n";
        let cases: &[(&str, &str, Vec<Part>)] = &[
            (
                "plain SQL is one part",
                "SELECT 1; SELECT 2;",
                vec![Part::Sql("SELECT 1; SELECT 2;")],
            ),
            ("nothing is nothing", " \n\n", vec![]),
            (
                "a dump: guards dropped, rows apart",
                dump,
                vec![
                    Part::Sql("SET x = 1;\n"),
                    Part::Sql("CREATE TABLE t (a int);\n"),
                    Part::Copy {
                        statement: "COPY public.t (a) FROM stdin;",
                        rows: "1\n2\n",
                    },
                    Part::Sql("\nSELECT 1;\n"),
                ],
            ),
            (
                "an empty table's block has no rows",
                "COPY t FROM stdin;\n\\.\n",
                vec![Part::Copy {
                    statement: "COPY t FROM stdin;",
                    rows: "",
                }],
            ),
            (
                "options after stdin",
                "copy t from stdin with (format csv);\na\n\\.",
                vec![Part::Copy {
                    statement: "copy t from stdin with (format csv);",
                    rows: "a\n",
                }],
            ),
            (
                "CRLF lines",
                "COPY t FROM stdin;\r\n1\r\n\\.\r\nSELECT 1;",
                vec![
                    Part::Copy {
                        statement: "COPY t FROM stdin;",
                        rows: "1\r\n",
                    },
                    Part::Sql("SELECT 1;"),
                ],
            ),
            (
                "a COPY to a file is SQL (the server refuses it as the agent)",
                "COPY t TO '/tmp/x';\n",
                vec![Part::Sql("COPY t TO '/tmp/x';\n")],
            ),
            (
                "a backslash row inside a block is a row",
                "COPY t FROM stdin;\n\\N\n\\restrict x\n\\.\n",
                vec![Part::Copy {
                    statement: "COPY t FROM stdin;",
                    rows: "\\N\n\\restrict x\n",
                }],
            ),
        ];
        for (what, script, want) in cases {
            assert_eq!(&parts(script).unwrap(), want, "{what}");
        }
    }

    #[test]
    fn a_block_without_its_closing_line_is_refused_with_its_line() {
        let err = parts("SELECT 1;\nCOPY t (a) FROM stdin;\n1\n").unwrap_err();
        assert_eq!(
            err,
            ScriptError::Unterminated {
                line: 2,
                statement: "COPY t (a) FROM stdin;".into()
            }
        );
        assert!(err.to_string().contains("no closing line \\."), "{err}");
    }
}
