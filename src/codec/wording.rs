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
    describe_facts(&Facts::of(e), bytes, expected, at)
}

/// What graphcheck reads of a serde_json error: its category and position, from which every
/// message of its own is made (from the document's bytes and the schema), and serde's
/// message, shown only where no rule here says more. A serde_json release that rewords its
/// messages cannot change graphcheck's.
pub(super) struct Facts {
    category: serde_json::error::Category,
    line: usize,
    column: usize,
    message: String,
}

impl Facts {
    fn of(e: &serde_json::Error) -> Facts {
        // The position is told apart by graphcheck's errors, which lead with it.
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = text
            .strip_suffix(&suffix)
            .map_or(text.clone(), str::to_owned);
        Facts {
            category: e.classify(),
            line: e.line(),
            column: e.column(),
            message,
        }
    }
}

fn describe_facts(
    f: &Facts,
    bytes: &[u8],
    expected: Option<(DocKind, u32)>,
    at: &[schema::Step],
) -> String {
    use serde_json::error::Category;
    // Long values are shortened where the error is shown (`LoadError`'s Display).
    let m = &f.message;
    let position = (f.line, f.column);
    // The document parsed once, where a rule needs the value at `at`.
    let doc = Parsed::new(bytes);
    match f.category {
        Category::Eof => format!(
            "the document ends early, in the middle of {}",
            open_at_end(bytes)
        ),
        // serde_json reports a number or a list where a name is due (an enum) as a syntax
        // error; in text that is JSON, it is a value of the wrong type.
        Category::Syntax if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() => {
            wrong_type(&doc, expected, at, position)
                .unwrap_or_else(|| format!("a value of the wrong type: {m}"))
        }
        Category::Syntax => format!("not valid JSON: {m}"),
        // A value of the wrong JSON type or out of its integer's range, found by reading the
        // value and the schema (serde's words name Rust types: "expected struct Pool").
        Category::Data => {
            let allowed = expected.and_then(|(k, v)| schema::allowed_at(k, v, at));
            match out_of_range(bytes, allowed.as_ref(), position) {
                Some(Range::Only(words)) => Some(words),
                // Out of the integer's range where other types are allowed too (an address
                // as a number or a string): a value none of them takes.
                Some(Range::OneOf) => wrong_type(&doc, expected, at, position),
                None => mismatched(&doc, allowed.as_ref(), at)
                    .then(|| wrong_type(&doc, expected, at, position))
                    .flatten(),
            }
            .unwrap_or_else(|| m.clone())
        }
        Category::Io => m.clone(),
    }
}

/// What the document was in the middle of where its bytes end, as the loader's typed read
/// meets the end: a string, an object, a list, or a value (where one is due: before
/// anything, after `:` or `,`, inside `tru`). Right after a `[` it is a list: serde_json
/// says a list or a value there, by the type it reads.
fn open_at_end(bytes: &[u8]) -> &'static str {
    let (mut open, mut in_string, mut escaped) = (Vec::new(), false, false);
    // The last byte outside strings that is not white space, and the bare word (a number
    // or `true`, `false`, `null`) it ends, if any.
    let (mut last, mut word) = (None, Vec::new());
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    in_string = false;
                    last = Some(b);
                }
                _ => {}
            }
            continue;
        }
        if b.is_ascii_alphanumeric() || b"+-.".contains(&b) {
            if !last.is_some_and(|l: u8| l.is_ascii_alphanumeric() || b"+-.".contains(&l)) {
                word.clear();
            }
            word.push(b);
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => open.push(b),
            b'}' | b']' => {
                open.pop();
            }
            _ => {}
        }
        if !b.is_ascii_whitespace() && b != b'"' {
            last = Some(b);
        }
    }
    if in_string {
        return "a string";
    }
    let partial_literal = last.is_some_and(|l| l.is_ascii_alphabetic())
        && ["true", "false", "null"]
            .iter()
            .any(|w| w.as_bytes().starts_with(&word) && w.len() > word.len());
    match (open.last(), last) {
        _ if partial_literal => "a value",
        (_, None | Some(b':' | b',')) | (None, _) => "a value",
        (Some(b'{'), _) => "an object",
        _ => "a list",
    }
}

/// A document's bytes and, when first asked, their JSON value.
struct Parsed<'a> {
    bytes: &'a [u8],
    value: std::cell::OnceCell<Option<serde_json::Value>>,
}

impl<'a> Parsed<'a> {
    fn new(bytes: &'a [u8]) -> Parsed<'a> {
        Parsed {
            bytes,
            value: std::cell::OnceCell::new(),
        }
    }

    /// The value at `at`, where the bytes are JSON and hold one there.
    fn at(&self, at: &[schema::Step]) -> Option<&serde_json::Value> {
        let doc = self
            .value
            .get_or_init(|| serde_json::from_slice(self.bytes).ok())
            .as_ref()?;
        schema::value_at(doc, at)
    }
}

/// Whether the value at `at` is of a JSON type the schema (`allowed` there) does not allow.
fn mismatched(doc: &Parsed<'_>, allowed: Option<&schema::Allowed>, at: &[schema::Step]) -> bool {
    let (Some(allowed), Some(found)) = (allowed, doc.at(at)) else {
        return false;
    };
    let t = schema::json_type(found);
    let ok = |name: &str| allowed.types.iter().any(|a| a == name);
    !(ok(t) || (t == "integer" && ok("number")))
}

/// "expected X, found Y" for a value of the wrong type at `at`, where the schema says
/// what belongs there.
fn wrong_type(
    doc: &Parsed<'_>,
    expected: Option<(DocKind, u32)>,
    at: &[schema::Step],
    (line, column): (usize, usize),
) -> Option<String> {
    let (kind, version) = expected?;
    let want = schema::expected_at(kind, version, at)?;
    let found = doc.at(at).map(|found| {
        // A number as written (`1e3`), not as serde_json reread it (`1000.0`).
        let written = found.as_f64().and_then(|n| {
            number_ending_at(doc.bytes, line, column)
                .filter(|w| w.parse::<f64>().ok() == Some(n))
                .map(|w| format!("the number {w}"))
        });
        written.unwrap_or_else(|| schema::describe_value(found))
    });
    Some(match found {
        Some(found) => format!("expected {want}, found {found}"),
        None => format!("expected {want}"),
    })
}

/// An integer literal outside the range of its field's integer type (the schema's
/// `format`), as written: serde_json reads one too large for 64 bits as a float, and one that
/// fits 64 bits but not the field as a number of the wrong size.
fn out_of_range(
    bytes: &[u8],
    allowed: Option<&schema::Allowed>,
    (line, column): (usize, usize),
) -> Option<Range> {
    let allowed = allowed?;
    let format = allowed.integer_format.as_deref()?;
    let only = allowed.types.iter().all(|t| t == "integer" || t == "null");
    let (what, min, max): (&str, i128, i128) = match format {
        "uint8" => ("an unsigned 8-bit", 0, u8::MAX.into()),
        "uint16" => ("an unsigned 16-bit", 0, u16::MAX.into()),
        "uint32" => ("an unsigned 32-bit", 0, u32::MAX.into()),
        "uint64" => ("an unsigned 64-bit", 0, u64::MAX.into()),
        "int64" => ("a signed 64-bit", i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    };
    let written = number_ending_at(bytes, line, column)?;
    let digits = written.strip_prefix('-').unwrap_or(written);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None; // 1.5, 1e3: a number of the wrong type, not of the wrong size
    }
    let words = match written.parse::<i128>() {
        Ok(v) if (min..=max).contains(&v) => return None,
        // Within 64 bits: the field's own bound is worth saying.
        Ok(v) if i64::try_from(v).is_ok() || u64::try_from(v).is_ok() => {
            format!("the number {written} is out of range for {what} value (at most {max})")
        }
        _ => format!("the number {written} is out of range for {what} value"),
    };
    Some(if only {
        Range::Only(words)
    } else {
        Range::OneOf
    })
}

/// An integer out of its field's range: in words where the field takes integers only.
enum Range {
    Only(String),
    OneOf,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::error::Category;

    fn manifest_bytes() -> Vec<u8> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/gpu/corpus_marlin_manifest.json");
        std::fs::read(p).unwrap()
    }

    #[test]
    fn where_a_document_ends_early_is_read_from_its_bytes() {
        // Every cut of a real format 1 document, and a few by hand: what serde_json's typed
        // read (the loader's) says it was in the middle of, said from the bytes alone.
        let doc = manifest_bytes();
        let mut cuts: Vec<&[u8]> = (1..doc.len()).map(|n| &doc[..n]).collect();
        let by_hand: [&[u8]; 6] = [
            b"",
            b"  ",
            b"{",
            b"{\"pools\": [{}, ",
            b"{\"pools\": [{\"id\": n",
            b"{\"kind\": \"ma",
        ];
        cuts.extend(by_hand);
        for cut in cuts {
            let Err(e) = serde_json::from_slice::<crate::model::format::Manifest>(cut) else {
                continue;
            };
            if cut.trim_ascii_end().ends_with(b"[") {
                continue; // a list, where serde_json says a list or a value by type
            }
            if e.classify() != Category::Eof {
                continue;
            }
            let serde_says = Facts::of(&e).message;
            assert_eq!(
                format!("EOF while parsing {}", open_at_end(cut)),
                serde_says,
                "{:?}",
                String::from_utf8_lossy(&cut[cut.len().saturating_sub(40)..])
            );
        }
    }

    #[test]
    fn a_reworded_serde_message_does_not_change_graphcheck_s() {
        // The same errors as serde_json gives them, their message replaced: graphcheck's
        // words come from the category, the position, the bytes and the schema.
        let expected = Some((DocKind::Manifest, 1));
        let cases: Vec<(&[u8], Vec<schema::Step>, &str)> = vec![
            (b"{\"format_version\": 1, \"kind\": \"manifest\", \"pools\": [{\"id\": 0,", vec![], "the document ends early, in the middle of a value"),
            (
                b"{\"allocations\": [{\"id\": 0, \"base\": \"0x1000\", \"size\": 18446744073709551616, \"pool\": 0}]}",
                vec![schema::Step::Key("allocations".into()), schema::Step::Index(0), schema::Step::Key("size".into())],
                "the number 18446744073709551616 is out of range for an unsigned 64-bit value",
            ),
            (
                b"{\"allocations\": [{\"id\": 0, \"base\": \"0x1000\", \"size\": \"big\", \"pool\": 0}]}",
                vec![schema::Step::Key("allocations".into()), schema::Step::Index(0), schema::Step::Key("size".into())],
                "expected an unsigned 64-bit integer, found the string \"big\"",
            ),
        ];
        for (bytes, at, want) in cases {
            let real = serde_json::from_slice::<crate::model::format::Manifest>(bytes).unwrap_err();
            let facts = |message: &str| Facts {
                category: real.classify(),
                line: real.line(),
                column: real.column(),
                message: message.into(),
            };
            let as_serde_says = describe(&real, bytes, expected, &at);
            let reworded =
                describe_facts(&facts("zzz: eine andere Nachricht"), bytes, expected, &at);
            assert_eq!(as_serde_says, want);
            assert_eq!(reworded, want);
        }
    }
}
