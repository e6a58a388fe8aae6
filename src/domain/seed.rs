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

    /// The first 12 hex digits, for names (a volume, a log line).
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

/// A seed's content as the state database holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct SeedContent {
    /// Its hash.
    pub hash: SeedHash,
    /// The engine it was registered for.
    pub engine: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl SeedContent {
    /// Whether the content is a data file the engine starts from rather
    /// than statements sent once it is ready: a Redis or Valkey RDB file
    /// (it starts with the format's magic `REDIS` and a four-digit
    /// version; no command is called `REDIS0…`).
    pub(crate) fn is_data_file(&self) -> bool {
        matches!(self.engine.as_str(), "redis" | "valkey") && is_rdb(&self.bytes)
    }
}

/// Whether `bytes` start as an RDB file does.
fn is_rdb(bytes: &[u8]) -> bool {
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

impl fmt::Debug for SeedContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The content may be large: its size is enough for a log.
        f.debug_struct("SeedContent")
            .field("hash", &self.hash)
            .field("engine", &self.engine)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// Why a Redis command list cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandsError {
    /// Not UTF-8 text.
    #[error("the seed is not UTF-8 text: write one command per line")]
    NotText,
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

/// The commands of a Redis or Valkey seed: one per line, words separated
/// by spaces or tabs, a word in double quotes may hold spaces and the
/// escapes `\\ \" \n \r \t` (as `redis-cli` prints them); empty lines and
/// lines starting with `#` are skipped.
pub fn redis_commands(content: &[u8]) -> Result<Vec<Vec<String>>, CommandsError> {
    let text = std::str::from_utf8(content).map_err(|_| CommandsError::NotText)?;
    let mut commands = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        commands.push(words(trimmed, line)?);
    }
    if commands.is_empty() {
        return Err(CommandsError::Empty);
    }
    Ok(commands)
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
    fn an_rdb_file_is_a_data_file_for_redis_and_valkey_only() {
        let seed = |engine: &str, bytes: &[u8]| SeedContent {
            hash: SeedHash::parse(&format!("sha256:{}", "a".repeat(64))).unwrap(),
            engine: engine.to_owned(),
            bytes: bytes.to_vec(),
        };
        let rdb = b"REDIS0012\xfa\x09redis-ver";
        for (engine, bytes, file) in [
            ("redis", &rdb[..], true),
            ("valkey", &rdb[..], true),
            ("postgres", &rdb[..], false),
            ("redis", &b"SET k v\n"[..], false),
            ("redis", &b"REDIS"[..], false),
            ("redis", &b"REDISxxxx and more"[..], false),
            ("postgres", &b"PGDMP\x01\x10\x00\x04\x08\x01\x01"[..], false),
        ] {
            assert_eq!(
                seed(engine, bytes).is_data_file(),
                file,
                "{engine} {bytes:?}"
            );
        }
    }

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
            let got = redis_commands(text.as_bytes()).unwrap();
            let want: Vec<Vec<String>> = want
                .iter()
                .map(|c| c.iter().map(|w| (*w).to_owned()).collect())
                .collect();
            assert_eq!(got, want, "{text:?}");
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
            (b"SET a \xff", CommandsError::NotText),
        ];
        for (text, want) in bad {
            assert_eq!(redis_commands(text).unwrap_err(), *want, "{text:?}");
        }
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
