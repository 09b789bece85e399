//! serde_json's errors in words for a person: what is wrong with a value, in the schema's
//! terms, never Rust's, and never a value printed whole.

use std::fmt::Write as _;

use crate::codec::schema;
use crate::model::format::DocKind;

/// serde_json's error in words for a person: whether the text is not JSON at all, cut
/// short, or JSON with a value of the wrong type or size at `at` (what the schema of an
/// `expected` document, of its kind and format version, wants there).
pub(super) fn describe(
    e: &serde_json::Error,
    bytes: &[u8],
    expected: Option<(DocKind, u32)>,
    at: &[schema::Step],
) -> String {
    use serde_json::error::Category;
    // Long values are shortened where the error is shown (`LoadError`'s Display).
    let m = strip_position(e.to_string());
    match e.classify() {
        Category::Eof => match m.strip_prefix("EOF while parsing ") {
            Some(what) => format!("the document ends early, in the middle of {what}"),
            None => format!("the document ends early ({m})"),
        },
        // serde_json reports a number or a list where a name is due (an enum) as a syntax
        // error; in text that is JSON, it is a value of the wrong type.
        Category::Syntax if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() => {
            wrong_type(bytes, expected, at, (e.line(), e.column()))
                .unwrap_or_else(|| format!("a value of the wrong type: {m}"))
        }
        Category::Syntax => format!("not valid JSON: {m}"),
        // serde's "invalid type: sequence, expected struct Pool" names Rust types; the
        // schema's words name JSON ones.
        Category::Data => out_of_range(&m, bytes, e.line(), e.column())
            .or_else(|| {
                m.starts_with("invalid type: ")
                    .then(|| wrong_type(bytes, expected, at, (e.line(), e.column())))
                    .flatten()
            })
            .unwrap_or(m),
        Category::Io => m,
    }
}

/// "expected X, found Y" for a value of the wrong type at `at`, where the schema says
/// what belongs there.
fn wrong_type(
    bytes: &[u8],
    expected: Option<(DocKind, u32)>,
    at: &[schema::Step],
    (line, column): (usize, usize),
) -> Option<String> {
    let (kind, version) = expected?;
    let want = schema::expected_at(kind, version, at)?;
    let found = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| {
            let found = schema::value_at(&v, at)?;
            // A number as written (`1e3`), not as serde_json reread it (`1000.0`).
            let written = found.as_f64().and_then(|n| {
                number_ending_at(bytes, line, column)
                    .filter(|w| w.parse::<f64>().ok() == Some(n))
                    .map(|w| format!("the number {w}"))
            });
            Some(written.unwrap_or_else(|| schema::describe_value(found)))
        });
    Some(match found {
        Some(found) => format!("expected {want}, found {found}"),
        None => format!("expected {want}"),
    })
}

/// serde_json reads an integer too large for 64 bits as a float, and then says "invalid
/// type: floating point `1.8446744073709552e+19`, expected u64": say the number is out of
/// range, as written.
fn out_of_range(message: &str, bytes: &[u8], line: usize, column: usize) -> Option<String> {
    // An integer that fits 64 bits but not the field: "invalid value: integer
    // `4294967296`, expected u32".
    if let Some(rest) = message.strip_prefix("invalid value: integer `") {
        let (number, expected) = rest.split_once("`, expected ")?;
        let (what, max) = match expected {
            "u8" => ("an unsigned 8-bit", u64::from(u8::MAX)),
            "u16" => ("an unsigned 16-bit", u64::from(u16::MAX)),
            "u32" => ("an unsigned 32-bit", u64::from(u32::MAX)),
            "u64" => ("an unsigned 64-bit", u64::MAX),
            "i64" => ("a signed 64-bit", i64::MAX.unsigned_abs()),
            _ => return None,
        };
        return Some(format!(
            "the number {number} is out of range for {what} value (at most {max})"
        ));
    }
    let rest = message.strip_prefix("invalid type: floating point `")?;
    let (number, expected) = rest.split_once("`, expected ")?;
    let v: f64 = number.parse().ok()?;
    let (what, range) = match expected {
        "u64" => ("an unsigned 64-bit", 0.0..18_446_744_073_709_551_616.0),
        "u32" => ("an unsigned 32-bit", 0.0..4_294_967_296.0),
        "i64" => (
            "a signed 64-bit",
            -9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0,
        ),
        _ => return None,
    };
    if range.contains(&v) {
        return None;
    }
    let written = number_ending_at(bytes, line, column)
        .filter(|w| w.parse::<f64>().ok() == Some(v))
        .unwrap_or(number);
    Some(format!(
        "the number {written} is out of range for {what} value"
    ))
}

/// The number literal that ends at serde_json's 1-based (line, column), as written.
fn number_ending_at(bytes: &[u8], line: usize, column: usize) -> Option<&str> {
    let line_start = if line <= 1 {
        0
    } else {
        bytes
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(line - 2)?
            .0
            + 1
    };
    let end = (line_start + column).min(bytes.len());
    let start = bytes[..end]
        .iter()
        .rposition(|b| !(b.is_ascii_digit() || b"+-.eE".contains(b)))
        .map_or(0, |i| i + 1);
    std::str::from_utf8(&bytes[start..end])
        .ok()
        .filter(|s| !s.is_empty())
}

/// `value` as an error repeats it: whole up to [`QUOTE_LIMIT`] characters, else its first
/// ones and a count of the rest.
pub(super) fn shorten(value: &str) -> std::borrow::Cow<'_, str> {
    let n = value.chars().count();
    if n <= QUOTE_LIMIT {
        return value.into();
    }
    let mut out: String = value.chars().take(QUOTE_LIMIT).collect();
    let _ = write!(out, "… ({} more characters)", n - QUOTE_LIMIT);
    out.into()
}

/// The longest message an error repeats in full, in characters.
const MESSAGE_LIMIT: usize = 400;

/// The longest quoted value an error repeats in full, in characters.
const QUOTE_LIMIT: usize = 80;

/// `message` with every value quoted in it (`"…"` or `` `…` ``, as serde quotes what it
/// read) cut to its first [`QUOTE_LIMIT`] characters and a count of the rest: a 70,000-
/// character string in the wrong place is named, not printed.
pub(super) fn shorten_quoted(message: &str) -> String {
    let out = shorten_each_quote(message);
    // A value can hold the quote character itself, and then what follows it is not
    // seen as quoted: the message as a whole is held to a few lines too.
    match out.char_indices().nth(MESSAGE_LIMIT) {
        Some((cut, _)) => {
            let rest = out[cut..].chars().count();
            format!("{}… ({rest} more characters)", &out[..cut])
        }
        None => out,
    }
}

fn shorten_each_quote(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(1024));
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let q = rest.as_bytes()[open] as char;
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        let Some(close) = rest.find(q) else { break };
        out.push_str(&shorten(&rest[..close]));
        out.push(q);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// serde_json appends " at line L column C"; our errors lead with the position.
fn strip_position(mut message: String) -> String {
    if let Some(cut) = message.rfind(" at line ") {
        message.truncate(cut);
    }
    message
}
