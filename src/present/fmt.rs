//! Formatting shared by the presenters: how an address is shown (raw hex, or a symbolic id,
//! see [`crate::present::normalize`]), how a long kernel name is cut, how text from a
//! document is made safe to print, and how wide the terminal is.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::model::format::Addr;

/// Formats an address for display: raw hex, or a symbolic id (see [`crate::present::normalize`]).
pub trait AddrFmt {
    fn addr(&self, a: Addr) -> String;
}

/// Plain `0x…` hex.
pub struct RawAddrs;

impl AddrFmt for RawAddrs {
    fn addr(&self, a: Addr) -> String {
        a.to_string()
    }
}

/// `name`, cut to `max` characters with an ellipsis.
pub fn shorten(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        name.to_string()
    } else {
        let head: String = name.chars().take(max.saturating_sub(1)).collect();
        format!("{head}…")
    }
}

/// Whether printing `c` raw could move the cursor, clear or restyle the terminal, or reorder
/// what is shown: C0 controls (NUL, `\r`, ESC, which starts every ANSI sequence), DEL, C1
/// controls (U+0080–U+009F: 8-bit CSI and friends) and the bidirectional formatting
/// characters (`U+202E` shows text backwards), plus the line and paragraph separators.
fn unsafe_to_print(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `s` safe to print: every control character (see [`unsafe_to_print`]) escaped as Rust
/// writes it (`\r`, `\n`, `\t`, else `\u{1b}`), everything else as it is. Owner paths,
/// kernel and graph names, details and reasons come from documents and allowlists that
/// anyone can write; printed raw, a `\r` overwrites the line before it and an ANSI escape
/// restyles or clears the terminal. Borrowed when there is nothing to escape, which is
/// almost always.
pub fn escape(s: &str) -> Cow<'_, str> {
    // Printable ASCII, checked a byte at a time (vectorized), before decoding characters:
    // a report escapes every owner path and detail of tens of thousands of findings.
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) || !s.chars().any(unsafe_to_print) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if unsafe_to_print(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Multi-line text built from documents, safe to print: each line through [`escape`], the
/// line breaks kept. For text whose fields were not escaped one by one (explain's lines and
/// DOT): a `\r`, an ANSI escape or a NUL in a name cannot reach the terminal raw; a `\n`
/// in a name still starts a new line there.
pub fn escape_lines(text: String) -> String {
    if !text.chars().any(|c| c != '\n' && unsafe_to_print(c)) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&escape(line));
    }
    out
}

/// The width to fit text printed to stdout: when stdout is a terminal, `COLUMNS` if it
/// holds a usable width, else the terminal's own width; `None` when stdout is not a
/// terminal (a pipe, a file, a CI log), where output keeps its fixed layout so that logs
/// and snapshots do not depend on who ran the command.
pub fn terminal_width() -> Option<u16> {
    use std::io::IsTerminal as _;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    columns(std::env::var("COLUMNS").ok().as_deref()).or_else(|| comfy_table::Table::new().width())
}

/// A width from a `COLUMNS` value: a whole number of at least [`MIN_WIDTH`].
fn columns(value: Option<&str>) -> Option<u16> {
    value
        .and_then(|v| v.trim().parse::<u16>().ok())
        .filter(|&w| w >= MIN_WIDTH)
}

/// The narrowest width text is fitted to; below it a table cannot show its columns.
pub const MIN_WIDTH: u16 = 40;

/// `text` broken into lines of at most `first` characters for the first line and `rest`
/// for the others: at spaces where a word fits, inside a word (an owner path, a long kernel
/// name) where it does not. Nothing is dropped: joining the pieces with the spaces taken
/// out gives back the words.
pub fn wrap(text: &str, first: usize, rest: usize) -> Vec<String> {
    let room = |lines: &Vec<String>| if lines.is_empty() { first } else { rest }.max(1);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    let mut len = 0;
    for word in text.split(' ') {
        let wlen = word.chars().count();
        if len > 0 && len + 1 + wlen <= room(&lines) {
            line.push(' ');
            line.push_str(word);
            len += 1 + wlen;
            continue;
        }
        if len > 0 {
            lines.push(std::mem::take(&mut line));
        }
        // A word longer than a line is cut into pieces of a line each.
        let mut word = word;
        while word.chars().count() > room(&lines) {
            let cut = word
                .char_indices()
                .nth(room(&lines))
                .map_or(word.len(), |(i, _)| i);
            lines.push(word[..cut].to_string());
            word = &word[cut..];
        }
        line.push_str(word);
        len = word.chars().count();
    }
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_lines_keeps_the_line_breaks_and_escapes_the_rest() {
        assert_eq!(escape_lines("a\nb\n".into()), "a\nb\n");
        assert_eq!(
            escape_lines("a\rx\n\u{1b}[2J\n".into()),
            "a\\rx\n\\u{1b}[2J\n"
        );
    }

    #[test]
    fn escape_leaves_printable_text_borrowed() {
        // Guards: ordinary text (brackets, quotes, backslashes, non-ASCII) is printed as is.
        let s = r#"model.layers[0].attn["k\\v"].scale · ∑ — …"#;
        assert!(matches!(escape(s), Cow::Borrowed(t) if t == s));
    }

    #[test]
    fn escape_turns_every_control_character_into_text() {
        // Guards: \r, NUL, ESC (ANSI), DEL, C1 and bidi overrides never reach the terminal raw.
        assert_eq!(escape("a\rb\0c"), "a\\rb\\u{0}c");
        assert_eq!(escape("x\x1b[2Jy"), "x\\u{1b}[2Jy");
        assert_eq!(escape("t\ta\nb\x7f"), "t\\ta\\nb\\u{7f}");
        assert_eq!(escape("c1\u{9b}31m"), "c1\\u{9b}31m");
        assert_eq!(escape("evil\u{202e}gnp.exe"), "evil\\u{202e}gnp.exe");
        for c in (0u32..0x20).chain(0x7f..0xa0).filter_map(char::from_u32) {
            let e = escape(&c.to_string()).into_owned();
            assert!(
                e.starts_with('\\') && e.chars().all(|c| !c.is_control()),
                "{e:?}"
            );
        }
    }

    #[test]
    fn columns_accepts_only_a_usable_width() {
        // Guards: a junk or tiny COLUMNS falls back to the terminal's width instead of a
        // one-column table.
        assert_eq!(columns(Some("80")), Some(80));
        assert_eq!(columns(Some(" 120 ")), Some(120));
        assert_eq!(columns(Some("10")), None);
        assert_eq!(columns(Some("wide")), None);
        assert_eq!(columns(Some("")), None);
        assert_eq!(columns(None), None);
    }

    #[test]
    fn wrap_breaks_at_spaces_and_cuts_long_words_without_losing_text() {
        // Guards: wrapped text keeps every character and no line is wider than asked.
        let text =
            "the owner now holds model.layers[10].mlp.experts.quant_method.workspace at 0x7f00";
        for width in [1, 7, 20, 33, 80] {
            let lines = wrap(text, width, width);
            assert!(
                lines.iter().all(|l| l.chars().count() <= width),
                "{lines:?}"
            );
            let joined: String = lines.concat().split(' ').collect();
            let expected: String = text.split(' ').collect();
            assert_eq!(joined, expected, "width {width}");
        }
        assert_eq!(wrap("a bc def", 4, 4), ["a bc", "def"]);
        assert_eq!(wrap("abcdef gh", 4, 2), ["abcd", "ef", "gh"]);
        assert_eq!(wrap("", 10, 10), [""]);
    }
}
