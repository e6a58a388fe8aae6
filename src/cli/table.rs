//! Aligned text tables and ages, as `kubectl get` prints them.

use chrono::{DateTime, Utc};
use std::fmt::Write as _;

/// Rows of cells printed in aligned columns (the last one unpadded).
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose first row is `header`.
    pub fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    /// Adds a row. Control characters in cells are shown as spaces, so that
    /// no cell can move the cursor or break the alignment.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| {
                    c.chars()
                        .map(|ch| if ch.is_control() { ' ' } else { ch })
                        .collect()
                })
                .collect(),
        );
    }

    /// The table as lines, columns separated by at least three spaces.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let _ = write!(line, "{cell:<width$}   ", width = widths[i]);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// How long ago `then` was, as `kubectl` shows ages: `45s`, `3m12s`,
/// `25m`, `4h10m`, `30h`, `3d4h`, `12d`.
pub fn age(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - then).num_seconds().max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    match secs {
        s if s < 120 => format!("{s}s"),
        _ if m < 10 => format!("{m}m{}s", secs % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if d < 8 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

/// `text` with every control character but a newline shown as a space, so
/// that a message (which may quote an engine's log) cannot move the cursor
/// or recolour the terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\n' { ' ' } else { c })
        .collect()
}

/// The first line of `text`, cut to `max` characters (with `…`).
pub fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() <= max {
        line.to_owned()
    } else {
        let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_whatever_the_cells_hold_and_control_characters_are_blanked() {
        let mut t = Table::new(&["ID", "PHASE", "MESSAGE"]);
        t.row(vec!["agent-7".into(), "ready".into(), String::new()]);
        t.row(vec![
            "a".into(),
            "provisioning".into(),
            "x\x1b[2Jy\nz".into(),
        ]);
        assert_eq!(
            t.render(),
            "ID        PHASE          MESSAGE\n\
             agent-7   ready\n\
             a         provisioning   x [2Jy z\n"
        );
    }

    #[test]
    fn ages_read_like_kubectls() {
        let now = Utc::now();
        let ago = |s: i64| age(now - chrono::Duration::seconds(s), now);
        assert_eq!(ago(-5), "0s");
        assert_eq!(ago(45), "45s");
        assert_eq!(ago(192), "3m12s");
        assert_eq!(ago(25 * 60), "25m");
        assert_eq!(ago(4 * 3600 + 600), "4h10m");
        assert_eq!(ago(30 * 3600), "30h");
        assert_eq!(ago(3 * 86_400 + 4 * 3600), "3d4h");
        assert_eq!(ago(12 * 86_400), "12d");
    }

    #[test]
    fn a_long_message_is_cut_to_its_first_line_and_width() {
        assert_eq!(first_line("one\ntwo", 10), "one");
        assert_eq!(first_line("abcdefghij", 5), "abcd…");
        assert_eq!(first_line("", 5), "");
        assert_eq!(printable("a\x1b[31mb\nc\td"), "a [31mb\nc d");
    }
}
