//! A Postgres seed's SQL text on its way to `psql` in the engine's own
//! container, a chunk at a time: what is cut out of it.
//!
//! psql runs a seed in restricted mode (`\restrict KEY` with a key the
//! seed cannot know; since PostgreSQL 17.6 every backslash command but
//! `\unrestrict KEY` then fails), so a seed cannot run a shell (`\!`),
//! read or write files (`\i`, `\o`, `\copy`) or leave the agent's login:
//! it is SQL and the rows of its `COPY … FROM stdin` blocks, nothing else.
//! A plain dump of `pg_dump` 17.6 or later guards itself the same way, with
//! a `\restrict KEY` line at its top and `\unrestrict KEY` at its end;
//! psql refuses those once restricted, so [`GuardFilter`] empties them
//! (their line stays, so psql's line numbers are the seed's).
//!
//! The cut is by lines, as psql's is for these guards: a line that starts
//! with one is dropped, unless it is a row of a `COPY … FROM stdin` block
//! (a line that starts a `COPY` and ends `FROM stdin;`, or the same
//! statement ending in `WITH (…);`, opens one; a line `\.` closes it), which
//! psql hands to the server unread. Only a line's first
//! [`HEAD_BYTES`] are looked at, so the filter holds at most that much
//! beyond the chunk it is given, whatever the seed's size.

/// How much of a line the filter holds to decide what it is: more than any
/// guard line or `COPY` statement `pg_dump` writes (a table of 1,600
/// columns with the longest names is about 110 KB).
pub(crate) const HEAD_BYTES: usize = 256 * 1024;

/// Why a script cannot be run.
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

/// Drops psql's guard lines from a seed's SQL text as it streams through
/// (see the module's comment): [`GuardFilter::push`] each chunk, then
/// [`GuardFilter::finish`].
#[derive(Debug, Default)]
pub(crate) struct GuardFilter {
    /// The current line's first bytes, while it is undecided.
    head: Vec<u8>,
    /// The current line is too long to be a guard or an opening `COPY`:
    /// its rest is passed on as it comes.
    passing: bool,
    /// Lines begun so far.
    lines: usize,
    /// The open `COPY` block, if any: its line and statement.
    copy: Option<(usize, String)>,
}

impl GuardFilter {
    /// Adds to `out` what of `chunk` goes on to psql.
    pub(crate) fn push(&mut self, mut chunk: &[u8], out: &mut Vec<u8>) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|b| *b == b'\n');
            let taken = newline.map_or(chunk.len(), |at| at + 1);
            let (piece, rest) = chunk.split_at(taken);
            chunk = rest;
            if !self.passing && self.head.is_empty() {
                self.lines += 1;
            }
            if self.passing {
                out.extend_from_slice(piece);
            } else if newline.is_none() && piece.len() > HEAD_BYTES - self.head.len() {
                // Too long to be a guard or an opening `COPY`: kept.
                out.extend_from_slice(&self.head);
                out.extend_from_slice(piece);
                self.head.clear();
                self.passing = true;
            } else {
                self.head.extend_from_slice(piece);
                if newline.is_some() {
                    self.decide(out);
                }
            }
            if newline.is_some() {
                self.passing = false;
            }
        }
    }

    /// The end of the text: the last line, unless it is a guard, goes to
    /// `out`; a `COPY` block still open is an error.
    pub(crate) fn finish(mut self, out: &mut Vec<u8>) -> Result<(), ScriptError> {
        if !self.head.is_empty() {
            self.decide(out);
        }
        match self.copy {
            Some((line, statement)) => Err(ScriptError::Unterminated { line, statement }),
            None => Ok(()),
        }
    }

    /// Decides what the whole line in `head` is, and passes it on unless
    /// it is a guard.
    fn decide(&mut self, out: &mut Vec<u8>) {
        let head = std::mem::take(&mut self.head);
        let bare = String::from_utf8_lossy(&head);
        let bare = bare.trim_end_matches(['\n', '\r']);
        if self.copy.is_some() {
            if bare == "\\." {
                self.copy = None;
            }
        } else if is_guard(bare) {
            if head.ends_with(b"\n") {
                out.push(b'\n');
            }
            return;
        } else if opens_copy(bare) {
            self.copy = Some((self.lines, bare.chars().take(80).collect()));
        }
        out.extend_from_slice(&head);
        // The buffer's room is kept for the next line.
        self.head = head;
        self.head.clear();
    }
}

/// `\restrict KEY` or `\unrestrict KEY`: psql's guard against a dump that
/// smuggles meta-commands.
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

    /// Chunk sizes a script is fed in: what comes out never depends on them.
    const CHUNKS: [usize; 5] = [1, 2, 5, 13, 4096];

    /// `script` through the filter, `chunk` bytes at a time.
    fn filtered(script: &str, chunk: usize) -> Result<String, ScriptError> {
        let mut filter = GuardFilter::default();
        let mut out = Vec::new();
        for piece in script.as_bytes().chunks(chunk) {
            filter.push(piece, &mut out);
        }
        filter.finish(&mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn guard_lines_are_dropped_outside_copy_blocks_and_everything_else_is_kept() {
        let dump = "\\restrict abc123\nSET x = 1;\nCREATE TABLE t (a int);\n\
                    COPY public.t (a) FROM stdin;\n1\n\\restrict x\n\\.\n\nSELECT 1;\n\\unrestrict abc123\n";
        let cases: &[(&str, &str, &str)] = &[
            ("plain SQL", "SELECT 1; SELECT 2;", "SELECT 1; SELECT 2;"),
            ("nothing", "", ""),
            (
                "a guard line keeps its newline, so lines keep their numbers",
                "\\restrict k\nSELECT 1/0;\n",
                "\nSELECT 1/0;\n",
            ),
            (
                "a dump: guards dropped, a row that looks like one kept",
                dump,
                "\nSET x = 1;\nCREATE TABLE t (a int);\nCOPY public.t (a) FROM stdin;\n1\n\\restrict x\n\\.\n\nSELECT 1;\n\n",
            ),
            (
                "a guard as the last line without its newline",
                "SELECT 1;\n\\unrestrict k",
                "SELECT 1;\n",
            ),
            (
                "options after stdin, CRLF lines",
                "copy t from stdin with (format csv);\r\n\\restrict\r\n\\.\r\n\\restrict k\r\nSELECT 1;",
                "copy t from stdin with (format csv);\r\n\\restrict\r\n\\.\r\n\nSELECT 1;",
            ),
            (
                "other backslash lines go on (psql refuses them)",
                "\\! sh\n\\copy t to '/tmp/x'\n",
                "\\! sh\n\\copy t to '/tmp/x'\n",
            ),
            (
                "a COPY to a file is SQL",
                "COPY t TO '/tmp/x';\n\\restrict k\n",
                "COPY t TO '/tmp/x';\n\n",
            ),
        ];
        for (what, script, want) in cases {
            for chunk in CHUNKS {
                assert_eq!(
                    &filtered(script, chunk).unwrap(),
                    want,
                    "{what}, in chunks of {chunk}"
                );
            }
        }
    }

    #[test]
    fn a_block_without_its_closing_line_is_refused_with_its_line() {
        for chunk in CHUNKS {
            let err = filtered("SELECT 1;\nCOPY t (a) FROM stdin;\n1\n", chunk).unwrap_err();
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

    #[test]
    fn a_line_longer_than_the_head_passes_through_without_being_held() {
        let long = format!("INSERT INTO t VALUES ('{}');\n", "x".repeat(HEAD_BYTES));
        let script = format!("{long}\\restrict k\nSELECT 1;\n");
        let mut filter = GuardFilter::default();
        let mut out = Vec::new();
        for piece in script.as_bytes().chunks(64 * 1024) {
            filter.push(piece, &mut out);
            assert!(filter.head.len() <= HEAD_BYTES);
        }
        filter.finish(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{long}\nSELECT 1;\n")
        );
    }
}
