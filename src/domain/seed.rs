//! Seeds: content an engine starts with (Postgres: SQL text or a
//! `pg_dump` custom-format archive; Redis and Valkey: commands or an RDB
//! file), registered once in the state database under its
//! content hash (`sandbox_seed_put`) and named per engine by a desired
//! row's `seeds`.
//!
//! What is pure about them lives here: the hash as a type (validated once,
//! where it is read, so it can go into a label and a pool key), the
//! limits a seed is applied under, and the parser of the Redis command
//! list. Applying one is the engine's ([`crate::engine::Engine::seed`]).

use std::fmt;
use std::time::Duration;

/// The label naming the seed a container was made with (its hash: no
/// content, no credential).
pub const SEED: &str = "io.sandboxd.seed";

/// How long one seed may run in an engine: Postgres's `statement_timeout`
/// for each statement, and the deadline of the whole application.
pub(crate) const APPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// How many lines of an engine's error a failed seed's message keeps.
pub(crate) const ERROR_LINES: usize = 5;

/// A seed's content hash, as `sandbox_seed_put` returns it: `sha256:` and
/// 64 lowercase hex digits.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct SeedHash(String);

impl TryFrom<String> for SeedHash {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        Self::parse(&text).ok_or_else(|| "a seed hash is sha256: and 64 hex digits".to_owned())
    }
}

impl From<SeedHash> for String {
    fn from(hash: SeedHash) -> Self {
        hash.0
    }
}

impl SeedHash {
    /// `text` if it is a well-formed hash.
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| Self(text.to_owned()))
    }

    /// The hash as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits, for names that must never be shared by two
    /// seeds (a volume, a container).
    pub(crate) fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The first 12 hex digits, for what a person reads (a pool's name, a
    /// log line); never for a name two seeds must not share.
    pub(crate) fn short(&self) -> &str {
        let start = "sha256:".len();
        &self.0[start..start + 12]
    }
}

impl fmt::Display for SeedHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the state database says of a seed before any of its content is
/// read: enough to tell its kind and to read it a chunk at a time (a seed
/// is never held whole in the controller's memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedInfo {
    /// Its hash.
    pub hash: SeedHash,
    /// The engine it was registered for.
    pub engine: String,
    /// Its length in bytes.
    pub size: u64,
    /// Its first bytes (at most [`HEAD_BYTES`]): the magic of an archive
    /// or a data file.
    pub head: Vec<u8>,
}

/// How many of a seed's first bytes [`SeedInfo::head`] holds: enough for
/// every magic below.
pub(crate) const HEAD_BYTES: usize = 16;

/// Whether `bytes` start as an RDB file does: the format's magic `REDIS`
/// and a four-digit version (no command is called `REDIS0…`). Redis and
/// Valkey start from such a seed
/// ([`Engine::is_data_file`](crate::engine::Engine::is_data_file)).
pub(crate) fn is_rdb(bytes: &[u8]) -> bool {
    bytes.len() > 9 && bytes.starts_with(b"REDIS") && bytes[5..9].iter().all(u8::is_ascii_digit)
}

/// Whether `bytes` start as a `pg_dump` custom-format archive does (its
/// magic `PGDMP`; no SQL statement starts so).
pub(crate) fn is_pg_archive(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PGDMP")
}

/// The file name an RDB seed has in its volume (what the images load at
/// start with `SANDBOXD_TEMPLATE=use`).
pub(crate) const RDB_FILE: &str = "dump.rdb";

/// The longest line of a Redis or Valkey command seed. Commands are read
/// a line at a time as the seed streams in, so this (not the seed's
/// size) bounds what one load holds in memory; a larger value belongs in
/// an RDB file seed.
pub(crate) const COMMAND_LINE_BYTES: usize = 1024 * 1024;

/// Why a Redis command list cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandsError {
    /// A line is not UTF-8 text.
    #[error("line {line}: not UTF-8 text: write one command per line")]
    NotText {
        /// 1-based line number.
        line: usize,
    },
    /// A line is longer than [`COMMAND_LINE_BYTES`].
    #[error("line {line}: longer than {max} bytes: put large values in an RDB file seed (SAVE on a server that holds them)", max = COMMAND_LINE_BYTES)]
    TooLong {
        /// 1-based line number.
        line: usize,
    },
    /// A quoted word is not closed on its line.
    #[error("line {line}: a quoted word is not closed: end it with \" on the same line")]
    Unclosed {
        /// 1-based line number.
        line: usize,
    },
    /// An escape that is not one of `\\ \" \n \r \t`.
    #[error(
        "line {line}: unknown escape \\{escape} in a quoted word: use \\\\, \\\", \\n, \\r or \\t"
    )]
    Escape {
        /// 1-based line number.
        line: usize,
        /// The character after the backslash.
        escape: char,
    },
    /// A closing quote followed by something else than a space.
    #[error("line {line}: a quoted word must be followed by a space or the end of the line")]
    AfterQuote {
        /// 1-based line number.
        line: usize,
    },
    /// No command at all.
    #[error("the seed holds no command: write one command per line, e.g. SET greeting hello")]
    Empty,
}

/// One command of a Redis or Valkey seed: the line it is on and its words
/// (the first is the command's name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Command {
    /// 1-based line number.
    pub line: usize,
    /// The words, unquoted.
    pub words: Vec<String>,
}

/// Reads the commands of a Redis or Valkey seed as its bytes arrive, a
/// chunk at a time: one command per line, words separated by spaces or
/// tabs, a word in double quotes may hold spaces and the escapes
/// `\\ \" \n \r \t` (as `redis-cli` prints them); empty lines and lines
/// starting with `#` are skipped.
///
/// It holds at most the unread rest of the chunks fed and one line
/// ([`COMMAND_LINE_BYTES`]), whatever the seed's size: feed a chunk
/// ([`CommandReader::feed`]), take commands ([`CommandReader::next`])
/// until there is none, feed the next; after the last,
/// [`CommandReader::finish`] and take the rest.
#[derive(Debug, Default)]
pub(crate) struct CommandReader {
    /// Bytes fed and not yet read: `buf[read..]`.
    buf: Vec<u8>,
    read: usize,
    /// Lines read so far.
    lines: usize,
    /// Commands read so far.
    commands: usize,
    /// No more bytes come: an unterminated last line is a line.
    finished: bool,
}

impl CommandReader {
    /// Adds the seed's next `chunk`.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), CommandsError> {
        // What was read goes before more is added, so the buffer never
        // holds more than a line and a chunk.
        self.buf.drain(..self.read);
        self.read = 0;
        self.buf.extend_from_slice(chunk);
        // A line that has not ended within the bound will not be read.
        let ended = self
            .buf
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |at| at + 1);
        if self.buf.len() - ended > COMMAND_LINE_BYTES {
            let lines = self.buf[..ended].iter().filter(|b| **b == b'\n').count();
            return Err(CommandsError::TooLong {
                line: self.lines + lines + 1,
            });
        }
        Ok(())
    }

    /// Says that no more bytes come.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
    }

    /// Whether [`CommandReader::finish`] was called.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// The next command of the lines fed so far: `None` when the next line
    /// has not ended yet, or after [`CommandReader::finish`] at the end
    /// (an error if the seed held no command at all).
    pub(crate) fn next(&mut self) -> Result<Option<Command>, CommandsError> {
        loop {
            let rest = &self.buf[self.read..];
            let (raw, used) = match rest.iter().position(|b| *b == b'\n') {
                Some(at) => (&rest[..at], at + 1),
                None if self.finished && !rest.is_empty() => (rest, rest.len()),
                None if self.finished && self.commands == 0 => return Err(CommandsError::Empty),
                None => return Ok(None),
            };
            self.lines += 1;
            let line = self.lines;
            if raw.len() > COMMAND_LINE_BYTES {
                return Err(CommandsError::TooLong { line });
            }
            let text = std::str::from_utf8(raw).map_err(|_| CommandsError::NotText { line })?;
            let trimmed = text.trim();
            let words = if trimmed.is_empty() || trimmed.starts_with('#') {
                None
            } else {
                Some(words(trimmed, line)?)
            };
            self.read += used;
            if let Some(words) = words {
                self.commands += 1;
                return Ok(Some(Command { line, words }));
            }
        }
    }
}

/// The words of one command line.
fn words(line_text: &str, line: usize) -> Result<Vec<String>, CommandsError> {
    let mut words = Vec::new();
    let mut chars = line_text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        let Some(&first) = chars.peek() else {
            return Ok(words);
        };
        let mut word = String::new();
        if first == '"' {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(CommandsError::Unclosed { line }),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('\\') => word.push('\\'),
                        Some('"') => word.push('"'),
                        Some('n') => word.push('\n'),
                        Some('r') => word.push('\r'),
                        Some('t') => word.push('\t'),
                        Some(escape) => return Err(CommandsError::Escape { line, escape }),
                        None => return Err(CommandsError::Unclosed { line }),
                    },
                    Some(c) => word.push(c),
                }
            }
            if chars.peek().is_some_and(|c| *c != ' ' && *c != '\t') {
                return Err(CommandsError::AfterQuote { line });
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ' ' || c == '\t' {
                    break;
                }
                word.push(c);
                chars.next();
            }
        }
        words.push(word);
    }
}

/// The first [`ERROR_LINES`] lines of an engine's error, for a status
/// message (the rest is cut, saying how many lines were).
pub(crate) fn first_lines(error: &str) -> String {
    let lines: Vec<&str> = error.lines().collect();
    if lines.len() <= ERROR_LINES {
        return lines.join(" / ");
    }
    format!(
        "{} / … ({} more lines)",
        lines[..ERROR_LINES].join(" / "),
        lines.len() - ERROR_LINES
    )
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_pg_dump_archive_is_told_by_its_magic() {
        for (bytes, archive) in [
            (&b"PGDMP\x01\x10\x00"[..], true),
            (&b"CREATE TABLE t (a int);"[..], false),
            (&b"-- PGDMP in a comment\n"[..], false),
            (&b"PGDM"[..], false),
        ] {
            assert_eq!(is_pg_archive(bytes), archive, "{bytes:?}");
        }
    }

    use super::*;

    #[test]
    fn a_hash_is_sha256_and_64_lowercase_hex_digits() {
        let good = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let cases = [
            (good.as_str(), true),
            ("sha256:", false),
            ("md5:0123", false),
            (&good[..good.len() - 1], false),
            (
                "SHA256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                false,
            ),
            (
                "sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                false,
            ),
        ];
        for (text, ok) in cases {
            assert_eq!(SeedHash::parse(text).is_some(), ok, "{text}");
        }
        assert_eq!(SeedHash::parse(&good).unwrap().short(), "0123456789ab");
        assert_eq!(SeedHash::parse(&good).unwrap().hex(), &good[7..]);
    }

    #[test]
    fn redis_commands_are_lines_of_words_with_quoted_words_and_escapes() {
        let ok: &[(&str, &[&[&str]])] = &[
            ("SET a 1", &[&["SET", "a", "1"]]),
            (
                "  SET\ta   1  \n\n# comment\nINCR a\n",
                &[&["SET", "a", "1"], &["INCR", "a"]],
            ),
            (
                r#"SET greeting "hello world""#,
                &[&["SET", "greeting", "hello world"]],
            ),
            (
                r#"SET q "say \"hi\"\n\\""#,
                &[&["SET", "q", "say \"hi\"\n\\"]],
            ),
            (r#"SET e """#, &[&["SET", "e", ""]]),
            (
                "HSET user:1 name Ada\r\nSADD s x",
                &[&["HSET", "user:1", "name", "Ada"], &["SADD", "s", "x"]],
            ),
        ];
        for (text, want) in ok {
            let want: Vec<Vec<String>> = want
                .iter()
                .map(|c| c.iter().map(|w| (*w).to_owned()).collect())
                .collect();
            for chunk in CHUNKS {
                let got: Vec<Vec<String>> = read_all(text.as_bytes(), chunk)
                    .unwrap()
                    .into_iter()
                    .map(|c| c.words)
                    .collect();
                assert_eq!(got, want, "{text:?} in chunks of {chunk}");
            }
        }
        let bad: &[(&[u8], CommandsError)] = &[
            (b"", CommandsError::Empty),
            (b"# only a comment\n", CommandsError::Empty),
            (b"SET a \"open", CommandsError::Unclosed { line: 1 }),
            (
                b"SET a 1\nSET b \"x\\q\"",
                CommandsError::Escape {
                    line: 2,
                    escape: 'q',
                },
            ),
            (b"SET a \"x\"y", CommandsError::AfterQuote { line: 1 }),
            (b"SET a 1\nSET a \xff", CommandsError::NotText { line: 2 }),
        ];
        for (text, want) in bad {
            for chunk in CHUNKS {
                assert_eq!(
                    read_all(text, chunk).unwrap_err(),
                    *want,
                    "{text:?} in chunks of {chunk}"
                );
            }
        }
    }

    /// Chunk sizes the reader is fed in: its commands never depend on them.
    const CHUNKS: [usize; 5] = [1, 2, 3, 7, 4096];

    /// Every command of `bytes`, fed `chunk` bytes at a time.
    fn read_all(bytes: &[u8], chunk: usize) -> Result<Vec<Command>, CommandsError> {
        let mut reader = CommandReader::default();
        let mut commands = Vec::new();
        for piece in bytes.chunks(chunk) {
            reader.feed(piece)?;
            while let Some(command) = reader.next()? {
                commands.push(command);
            }
        }
        reader.finish();
        while let Some(command) = reader.next()? {
            commands.push(command);
        }
        Ok(commands)
    }

    #[test]
    fn commands_keep_their_line_numbers_past_comments_and_empty_lines() {
        let lines: Vec<usize> = read_all(b"# c\n\nSET a 1\n  \nINCR a", 3)
            .unwrap()
            .iter()
            .map(|c| c.line)
            .collect();
        assert_eq!(lines, [3, 5]);
    }

    #[test]
    fn a_line_longer_than_the_bound_is_refused_before_it_is_held_whole() {
        let long = format!(
            "SET a 1\nSET big {}\nSET b 2\n",
            "x".repeat(COMMAND_LINE_BYTES)
        );
        for chunk in [64 * 1024, long.len()] {
            assert_eq!(
                read_all(long.as_bytes(), chunk).unwrap_err(),
                CommandsError::TooLong { line: 2 },
                "in chunks of {chunk}"
            );
        }
        // Fed a chunk at a time, the reader never holds much more than
        // the bound: the error comes as soon as the line passes it.
        let mut reader = CommandReader::default();
        let mut fed = 0;
        let piece = vec![b'x'; 64 * 1024];
        reader.feed(b"SET big ").unwrap();
        let err = loop {
            match reader.feed(&piece) {
                Ok(()) => fed += piece.len(),
                Err(e) => break e,
            }
            assert!(reader.next().unwrap().is_none());
        };
        assert_eq!(err, CommandsError::TooLong { line: 1 });
        assert!(fed <= COMMAND_LINE_BYTES, "{fed}");
        let exactly = format!("SET big {}", "x".repeat(COMMAND_LINE_BYTES - 8));
        assert_eq!(read_all(exactly.as_bytes(), 4096).unwrap().len(), 1);
    }

    #[test]
    fn an_error_keeps_its_first_lines() {
        assert_eq!(first_lines("one"), "one");
        assert_eq!(first_lines("a\nb"), "a / b");
        assert_eq!(
            first_lines("1\n2\n3\n4\n5\n6\n7"),
            "1 / 2 / 3 / 4 / 5 / … (2 more lines)"
        );
    }
}
