//! A document's header, read before its body: `format_version` (from the opening bytes
//! where it comes first, as every writer puts it) and `kind`; and, in words, bytes that
//! are no document at all (an empty file, a byte-order mark, a JSON array, an object
//! without the header).

use std::path::Path;

use serde::Deserialize;

use super::{LoadError, json_error};
use crate::codec::objects::Objects;
use crate::codec::wording::describe;
use crate::model::format::DocKind;
use crate::model::version::FORMAT_VERSIONS;

#[derive(Deserialize)]
pub(super) struct Header {
    // Absent is `None`; `null` is a value of the wrong type, and said so.
    #[serde(default, deserialize_with = "present")]
    pub(super) format_version: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    pub(super) kind: Option<serde_json::Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// The UTF-8 byte-order mark. JSON text has none (RFC 8259 §8.1), and graphcheck reads
/// none: a document is the same bytes to every JSON reader.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Refuses, in words, bytes that cannot be a document, before serde says it in its own:
/// an empty file, a byte-order mark, and JSON whose top level is not an object.
fn opening(bytes: &[u8], path: &Path) -> Result<(), LoadError> {
    let invalid = |message: &str| LoadError::Invalid {
        path: path.to_path_buf(),
        json_path: ".".into(),
        message: message.into(),
    };
    if bytes.starts_with(BOM) {
        return Err(invalid(
            "the file starts with a UTF-8 byte-order mark, which graphcheck does not read (JSON \
             has none): save it as UTF-8 without one",
        ));
    }
    let Some(first) = bytes.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Err(invalid(if bytes.is_empty() {
            "the file is empty"
        } else {
            "the file holds only white space"
        }));
    };
    if *first == b'{' {
        return Ok(());
    }
    // Not an object: if not JSON either, say where it breaks (serde would say only that it
    // is no struct).
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
        return Err(LoadError::Json {
            path: path.to_path_buf(),
            json_path: ".".into(),
            line: e.line(),
            column: e.column(),
            message: describe(&e, bytes, None, &[]),
        });
    }
    let what = match first {
        b'[' => "a JSON array",
        b'"' => "a JSON string",
        b't' | b'f' => "a JSON boolean",
        b'n' => "JSON null",
        _ => "a JSON number",
    };
    Err(LoadError::NotADocument {
        path: path.to_path_buf(),
        why: format!("it is {what}, not an object"),
    })
}

/// Reads only `format_version` and `kind`, skipping the rest, once [`opening`] passes.
fn read_header(bytes: &[u8], path: &Path) -> Result<Header, LoadError> {
    opening(bytes, path)?;
    json_error(
        path,
        bytes,
        None,
        serde_path_to_error::deserialize(Objects(&mut serde_json::Deserializer::from_slice(bytes))),
    )
}

/// The document's `format_version`, read from its opening bytes where it comes first (as
/// every writer puts it), else from its header.
pub(super) fn version(bytes: &[u8], path: &Path) -> Result<u32, LoadError> {
    match leading_version(bytes) {
        Some(v) if FORMAT_VERSIONS.contains(&v) => Ok(v),
        Some(v) => Err(LoadError::Version {
            path: path.to_path_buf(),
            found: v.to_string(),
        }),
        // Only the version: the body's parse says what is wrong with its `kind`.
        None => {
            let h = read_header(bytes, path)?;
            check_version(h.format_version.as_ref(), path, bytes)
        }
    }
}

/// `format_version` where the document opens with it as a plain integer, without reading
/// further: `{ "format_version": 2,`.
fn leading_version(bytes: &[u8]) -> Option<u32> {
    fn blank(b: &[u8]) -> &[u8] {
        let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
        &b[n..]
    }
    let rest = blank(blank(bytes).strip_prefix(b"{")?);
    let rest = blank(blank(rest.strip_prefix(b"\"format_version\"")?).strip_prefix(b":")?);
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    let after = blank(&rest[digits..]);
    if digits == 0 || digits > 9 || !matches!(after.first(), Some(b',' | b'}')) {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// Reads the header: `format_version` and `kind`. JSON without them (a report, another
/// tool's file) is [`LoadError::NotADocument`]; a header with a bad value is the value's
/// error.
pub(super) fn header(bytes: &[u8], path: &Path) -> Result<(u32, DocKind), LoadError> {
    let h = read_header(bytes, path)?;
    let missing: Vec<&str> = [("`format_version`", &h.format_version), ("`kind`", &h.kind)]
        .into_iter()
        .filter_map(|(key, v)| v.is_none().then_some(key))
        .collect();
    if !missing.is_empty() {
        return Err(LoadError::NotADocument {
            path: path.to_path_buf(),
            why: format!("its top level has no {}", missing.join(" or ")),
        });
    }
    let version = check_version(h.format_version.as_ref(), path, bytes)?;
    match h.kind.as_ref().and_then(|k| k.as_str()) {
        Some("manifest") => Ok((version, DocKind::Manifest)),
        Some("live") => Ok((version, DocKind::Live)),
        _ => Err(LoadError::Invalid {
            path: path.to_path_buf(),
            json_path: "kind".into(),
            message: format!(
                "expected `\"manifest\"` or `\"live\"`, found {}",
                h.kind.map_or("nothing".into(), |k| k.to_string())
            ),
        }),
    }
}

/// The version `v` names, where it is one this build reads. `bytes` are the document's,
/// for a number serde_json read as a float (past 64 bits): it is named as written.
pub(super) fn check_version(
    v: Option<&serde_json::Value>,
    path: &Path,
    bytes: &[u8],
) -> Result<u32, LoadError> {
    match v {
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if FORMAT_VERSIONS.contains(&n) => Ok(n),
            _ => Err(LoadError::Version {
                path: path.to_path_buf(),
                found: v
                    .as_f64()
                    .filter(|_| v.is_f64())
                    .and_then(|f| version_as_written(bytes, f))
                    .unwrap_or_else(|| v.to_string()),
            }),
        },
        None => Err(LoadError::Invalid {
            path: path.to_path_buf(),
            json_path: ".".into(),
            message: "missing field `format_version`: not a graphcheck document".into(),
        }),
    }
}

/// The number literal after a `"format_version":` key in `bytes` that reads as `value`:
/// `18446744073709551617`, not serde_json's `1.8446744073709552e+19`.
fn version_as_written(bytes: &[u8], value: f64) -> Option<String> {
    let key = b"\"format_version\"";
    bytes
        .windows(key.len())
        .enumerate()
        .filter(|(_, w)| *w == key)
        .find_map(|(i, _)| {
            let rest = &bytes[i + key.len()..];
            let rest = rest
                .trim_ascii_start()
                .strip_prefix(b":")?
                .trim_ascii_start();
            let n = rest
                .iter()
                .take_while(|b| b.is_ascii_digit() || b"+-.eE".contains(b))
                .count();
            let text = std::str::from_utf8(&rest[..n]).ok()?;
            (text.parse::<f64>().ok()? == value).then(|| text.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::load::Source;
    use crate::codec::load::tests::err;

    /// Regression: serde's and Rust's words reached the user: "invalid type: sequence,
    /// expected struct Header" for `[]`, "not 1.8446744073709552e+19" for a version past 64
    /// bits, "not valid JSON: expected value" for a byte-order mark, and "ends early, in the
    /// middle of a value" for an empty file.
    #[test]
    fn bytes_that_are_no_document_are_said_in_words() {
        for (bytes, want) in [
            (
                &b"[]\n"[..],
                "m.json: not a graphcheck document: it is a JSON array",
            ),
            (
                b" 7",
                "m.json: not a graphcheck document: it is a JSON number",
            ),
            (
                b"",
                "m.json: invalid document at the top level: the file is empty",
            ),
            (b" \n", "the file holds only white space"),
            (
                b"\xEF\xBB\xBF{\"format_version\": 2}",
                "starts with a UTF-8 byte-order mark",
            ),
            (
                b"{\"kind\": \"manifest\", \"format_version\": 18446744073709551617}",
                "`format_version` is 18446744073709551617, but",
            ),
            (
                b"{\"format_version\": 2.5e0}",
                "must be the number 1 or 2, not 2.5e0",
            ),
        ] {
            let e = err(bytes);
            assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(bytes));
        }
        // A `[` that is no JSON is still a syntax error where it breaks.
        let e = err(b"[1, ");
        assert!(
            e.contains("m.json:1:4: invalid document at the top level: the document ends early"),
            "{e}"
        );
        // Reading either kind: JSON without the header is no document, naming what lacks.
        let doc = |bytes: &[u8]| {
            Source::Text {
                bytes: bytes.to_vec(),
                name: "r.json".into(),
            }
            .document()
            .unwrap_err()
            .to_string()
        };
        let e = doc(b"{\"format_version\": 1, \"ok\": true}");
        assert!(
            e.starts_with("r.json: not a graphcheck document: its top level has no `kind`"),
            "{e}"
        );
        let e = doc(b"{\"format_version\": 1, \"kind\": null}");
        assert!(e.contains("found null"), "{e}");
    }

    #[test]
    fn the_leading_version_is_read_without_parsing() {
        assert_eq!(leading_version(b"{\"format_version\":2,\"kind\""), Some(2));
        assert_eq!(leading_version(b" {\n  \"format_version\" : 1 }"), Some(1));
        assert_eq!(leading_version(b"{\"format_version\": 77,"), Some(77));
        for other in [
            &b"{\"kind\": \"live\", \"format_version\": 2}"[..],
            b"{\"format_version\": \"2\",",
            b"{\"format_version\": 2.0,",
            b"{\"format_version\": -2,",
            b"{\"format_version\": 99999999999,",
            b"[",
            b"",
        ] {
            assert_eq!(
                leading_version(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }
}
