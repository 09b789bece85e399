//! The format versions this build reads and writes, and what a document of another
//! version is told. A version changes on any change a reader of the previous version would
//! misread; adding an optional field does not change it.

/// The format version this build writes unless asked for another: 2, the compact layout
/// ([`crate::codec::v2`]).
pub const FORMAT_VERSION: u32 = 2;

/// Every format version this build reads, and writes when asked.
pub const FORMAT_VERSIONS: [u32; 2] = [1, 2];

/// What a `format_version` this build does not read is told (`found` as JSON text): a
/// number names the versions this build reads; anything else is not a version at all.
pub fn version_message(found: &str) -> String {
    let integer = found.strip_prefix('-').unwrap_or(found);
    if !integer.is_empty() && integer.bytes().all(|b| b.is_ascii_digit()) {
        format!(
            "`format_version` is {found}, but this graphcheck reads versions {} \
             (re-record it, or use a graphcheck of that version)",
            versions_in_words("and")
        )
    } else if found.starts_with('"') {
        let versions = versions_in_words("or");
        format!("`format_version` must be the number {versions}, not the string {found}")
    } else {
        let versions = versions_in_words("or");
        format!("`format_version` must be the number {versions}, not {found}")
    }
}

/// The versions this build reads, in words: `1 and 2`, or `1 or 2` with `or`.
fn versions_in_words(conjunction: &str) -> String {
    let v: Vec<String> = FORMAT_VERSIONS.iter().map(u32::to_string).collect();
    match v.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            format!("{} {conjunction} {last}", rest.join(", "))
        }
        _ => v.join(""),
    }
}
