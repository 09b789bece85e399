//! The output formats, and the commands other than verify: explain, diff, schema,
//! convert.

use std::path::Path;

use crate::codec::load::{LoadError, Source};
use crate::model::format::{Document, Manifest};
use crate::present::explain::{Query, explain};
use crate::present::fmt::{AddrFmt, RawAddrs};
use crate::present::normalize::Symbolizer;
use crate::present::text::diff_text_fit;

/// How a report or diff is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A table for terminals and CI logs.
    Table,
    /// The report as JSON (versioned: `format_version`).
    Json,
    /// Markdown for a CI step summary (`>> $GITHUB_STEP_SUMMARY`).
    Markdown,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "table" => Ok(Format::Table),
            "json" => Ok(Format::Json),
            "markdown" => Ok(Format::Markdown),
            other => Err(format!("format is table, json or markdown, not {other:?}")),
        }
    }
}

/// `dot`).
pub fn explain_text(m: &Manifest, query: &Query, dot: bool, normalized: bool) -> (bool, String) {
    let sym = normalized.then(|| Symbolizer::for_manifest(m));
    let fmt: &dyn AddrFmt = match &sym {
        Some(s) => s,
        None => &RawAddrs,
    };
    let e = explain(m, query, fmt);
    let text = if dot { e.dot } else { e.text };
    let text = match &sym {
        Some(s) => s.redact(&text),
        None => text,
    };
    (e.found, text)
}

/// Compares two documents by owner path; returns whether they are the same and the text.
pub fn diff(a: &Source, b: &Source, format: Format) -> Result<(bool, String), LoadError> {
    diff_fit(a, b, format, None)
}

/// [`diff`] with the table fitted to `width` columns.
pub fn diff_fit(
    a: &Source,
    b: &Source,
    format: Format,
    width: Option<u16>,
) -> Result<(bool, String), LoadError> {
    let (da, db) = (a.document()?, b.document()?);
    let r = crate::check::diff::diff(&da, &db);
    let text = match format {
        Format::Json => json_text(&r),
        Format::Table | Format::Markdown => diff_text_fit(
            &r,
            a.name(),
            b.name(),
            matches!(format, Format::Markdown),
            width,
        ),
    };
    Ok((r.same, text))
}

/// The JSON Schema of format `version` (1 or 2), as `graphcheck schema` prints it.
pub fn schema_text(version: u32) -> String {
    json_text(&crate::codec::schema::json_schema_of(version))
}

/// The JSON Schema of the retarget plan, as `graphcheck schema --plan` prints it.
pub fn plan_schema_text() -> String {
    json_text(&crate::plan::schema())
}

/// A document of either version, rewritten in format `version` (1 or 2): compact JSON with
/// a final newline, as graphcheck writes documents.
pub fn convert(doc: &Source, version: u32) -> Result<Vec<u8>, LoadError> {
    let mut bytes = match doc.document()? {
        Document::Manifest(m) => serde_json::to_vec(&m.in_version(version)),
        Document::Live(l) => serde_json::to_vec(&l.in_version(version)),
    }
    .expect("a checked document of a version this build writes serializes");
    bytes.push(b'\n');
    Ok(bytes)
}

/// Pretty JSON with a final newline.
fn json_text(v: &impl serde::Serialize) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("a report serializes");
    s.push('\n');
    s
}

/// A path as the loaders take it.
pub fn source(path: &Path) -> Source {
    Source::Path(path.to_path_buf())
}
