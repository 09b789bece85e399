//! Owner paths (`model.layers[3].attn["k"]`) and the globs an allowlist matches them with.
//!
//! Grammar of a path: a root name, then any number of hops:
//! - `.name` — an attribute (`name` is any run of characters but `.`, `[`, `]`, `"`),
//! - `[3]` or `[-1]` — a list or tuple index (or an integer dict key),
//! - `["key"]` — a dict key, with `\"` and `\\` escaped inside the quotes.
//!
//! Grammar of a glob: a path in which `*` matches any run of characters but a `.` that
//! starts an attribute (one name, or any run of brackets: `[*]` matches `[0][1]`), and `**`
//! matches any run at all. An owner-path glob must be a path of at most 64 hops once each
//! `*` is read as a name or index character ([`Glob::owner_path`]).
//! Brackets are literal, which is why this is not `globset`: there `[3]` is a class.
//!
//! A `.` in a quoted key starts no attribute, in a glob or a path: `[*]` matches any index
//! or key (`[3]`, `["lora.v1"]`), `["*"]` a key only (`["lora.v1"]`, not `[3]`), and either
//! a run of brackets too, as `*` spans them. A kernel-name pattern ([`Glob::new`]) has no
//! keys: every `.` there counts.

use std::fmt;

/// One hop of an owner path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Segment {
    /// The root, or `.name`.
    Attr(String),
    /// `[3]`.
    Index(i64),
    /// `["key"]`.
    Key(String),
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Attr(a) => f.write_str(a),
            Segment::Index(i) => write!(f, "[{i}]"),
            Segment::Key(k) => {
                f.write_str("[\"")?;
                for c in k.chars() {
                    if c == '"' || c == '\\' {
                        f.write_str("\\")?;
                    }
                    write!(f, "{c}")?;
                }
                f.write_str("\"]")
            }
        }
    }
}

/// Why a string is not an owner path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid owner path {path:?} at byte {at}: {why}")]
pub struct PathError {
    pub path: String,
    pub at: usize,
    pub why: &'static str,
}

/// Splits an owner path into its hops.
pub fn parse(path: &str) -> Result<Vec<Segment>, PathError> {
    parse_hops(path, true).map(|(segs, _)| segs)
}

/// The byte offset where each hop of `path` ends, and, with `keep`, the hops. Without it
/// nothing is allocated but the offsets: a document's 100,000 owner paths are checked
/// against the grammar at load, and their hops' strings would be as many allocations,
/// freed at once.
fn parse_hops(path: &str, keep: bool) -> Result<(Vec<Segment>, Vec<u32>), PathError> {
    let err = |at: usize, why: &'static str| PathError {
        path: path.to_string(),
        at,
        why,
    };
    let bytes = path.as_bytes();
    let mut segs = Vec::new();
    // At most one hop per `.` or `[`, and the root.
    let mut ends: Vec<u32> =
        Vec::with_capacity(1 + bytes.iter().filter(|&&b| b == b'.' || b == b'[').count());
    let mut i = 0;
    let name_end = |from: usize| {
        bytes[from..]
            .iter()
            .position(|b| matches!(b, b'.' | b'[' | b']' | b'"'))
            .map_or(bytes.len(), |p| from + p)
    };
    let end = name_end(0);
    if end == 0 {
        return Err(err(0, "a path starts with a root name"));
    }
    if keep {
        segs.push(Segment::Attr(path[..end].to_string()));
    }
    i = i.max(end);
    ends.push(i as u32);
    while i < bytes.len() {
        match bytes[i] {
            b'.' => {
                let end = name_end(i + 1);
                if end == i + 1 {
                    return Err(err(i + 1, "expected an attribute name after '.'"));
                }
                if keep {
                    segs.push(Segment::Attr(path[i + 1..end].to_string()));
                }
                i = end;
            }
            b'[' if bytes.get(i + 1) == Some(&b'"') => {
                let mut key = String::new();
                let mut j = i + 2;
                let mut chars = path[j..].char_indices();
                let close = loop {
                    match chars.next() {
                        None => return Err(err(i, "unterminated key: expected '\"]'")),
                        Some((k, '\\')) => match chars.next() {
                            Some((_, c @ ('"' | '\\'))) if keep => key.push(c),
                            Some((_, '"' | '\\')) => {}
                            _ => return Err(err(j + k, "only \\\" and \\\\ are escapes")),
                        },
                        Some((k, '"')) => break j + k,
                        Some((_, c)) if keep => key.push(c),
                        Some(_) => {}
                    }
                };
                if bytes.get(close + 1) != Some(&b']') {
                    return Err(err(close + 1, "expected ']' after the closing quote"));
                }
                if keep {
                    segs.push(Segment::Key(key));
                }
                j = close + 2;
                i = j;
            }
            b'[' => {
                let close = bytes[i..]
                    .iter()
                    .position(|&b| b == b']')
                    .map(|p| i + p)
                    .ok_or_else(|| err(i, "unterminated index: expected ']'"))?;
                let idx: i64 = path[i + 1..close]
                    .parse()
                    .map_err(|_| err(i + 1, "an index is an integer, a key is quoted"))?;
                if keep {
                    segs.push(Segment::Index(idx));
                }
                i = close + 1;
            }
            _ => return Err(err(i, "expected '.', '[' or the end of the path")),
        }
        ends.push(i as u32);
    }
    Ok((segs, ends))
}

/// Joins hops back into the canonical spelling of a path.
pub fn join(segments: &[Segment]) -> String {
    let mut out = String::new();
    for (n, s) in segments.iter().enumerate() {
        if n > 0 && matches!(s, Segment::Attr(_)) {
            out.push('.');
        }
        out.push_str(&s.to_string());
    }
    out
}

/// An owner path, checked against the grammar once (when a document is loaded or a
/// builder is handed it): its text as written, and where each hop ends, so that prefixes
/// (`model.layers[3]` of `model.layers[3].w`) and hops are slices, never parsed again.
///
/// Equality, order and hashing are the text's, so a `HashMap<OwnerPath, _>` is looked up
/// with a `&str`.
#[derive(Clone, Debug)]
pub struct OwnerPath {
    text: String,
    /// Byte offset in `text` where hop `k` ends; the last is `text.len()`.
    ends: Box<[u32]>,
}

impl OwnerPath {
    pub fn parse(path: &str) -> Result<OwnerPath, PathError> {
        if u32::try_from(path.len()).is_err() {
            return Err(PathError {
                path: path.chars().take(64).collect(),
                at: 0,
                why: "an owner path is shorter than 4 GiB",
            });
        }
        let (_, ends) = parse_hops(path, false)?;
        Ok(OwnerPath {
            text: path.to_string(),
            ends: ends.into_boxed_slice(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Hops, the root included (`model.w` has 2).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Never true: a path has at least its root.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The path of the first `hops` hops (`prefix(1)` is the root); the whole path past
    /// the last.
    pub fn prefix(&self, hops: usize) -> &str {
        match hops.checked_sub(1) {
            None => "",
            Some(k) => &self.text[..self.ends.get(k).map_or(self.text.len(), |&e| e as usize)],
        }
    }

    /// Hop `k` as written: `model`, `.layers`, `[3]`, `["k"]`.
    fn hop_text(&self, k: usize) -> &str {
        let start = k.checked_sub(1).map_or(0, |p| self.ends[p] as usize);
        &self.text[start..self.ends[k] as usize]
    }

    /// Hop `k` (0 is the root).
    pub fn segment(&self, k: usize) -> Segment {
        let hop = self.hop_text(k);
        match hop.strip_prefix('.') {
            Some(name) => Segment::Attr(name.to_string()),
            None if k == 0 => Segment::Attr(hop.to_string()),
            // A bracketed hop of a checked path parses alone behind a stand-in root.
            None => parse_hops(&format!("_{hop}"), true)
                .ok()
                .and_then(|(mut segs, _)| segs.pop())
                .unwrap_or_else(|| Segment::Attr(hop.to_string())),
        }
    }

    /// The last hop, as a label (`w`, `[3]`, `["k"]`).
    pub fn last(&self) -> Segment {
        self.segment(self.len() - 1)
    }

    /// Where `other` differs from this path in exactly one list index: `other`'s index
    /// minus this one's (`ys[1]` → `ys[2]` is 1).
    pub fn index_shift(&self, other: &OwnerPath) -> Option<i64> {
        if self.len() != other.len() {
            return None;
        }
        let mut differ = (0..self.len()).filter(|&k| self.hop_text(k) != other.hop_text(k));
        let (Some(k), None) = (differ.next(), differ.next()) else {
            return None;
        };
        match (self.segment(k), other.segment(k)) {
            (Segment::Index(i), Segment::Index(j)) => j.checked_sub(i),
            _ => None,
        }
    }
}

impl std::ops::Deref for OwnerPath {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl std::borrow::Borrow<str> for OwnerPath {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl AsRef<str> for OwnerPath {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl PartialEq for OwnerPath {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for OwnerPath {}

impl PartialEq<str> for OwnerPath {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for OwnerPath {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

impl PartialEq<String> for OwnerPath {
    fn eq(&self, other: &String) -> bool {
        &self.text == other
    }
}

impl std::hash::Hash for OwnerPath {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state)
    }
}

impl PartialOrd for OwnerPath {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OwnerPath {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl fmt::Display for OwnerPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for OwnerPath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<OwnerPath, PathError> {
        OwnerPath::parse(s)
    }
}

impl serde::Serialize for OwnerPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for OwnerPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OwnerPath, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
        OwnerPath::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The most hops an owner-path glob may have, and one more than the `.` of any glob. Between
/// two `**` every part of the glob is tried against each of the path's in one pass, a bit
/// each in a `u64`: matching costs at most 64 times the path's length.
const MAX_GLOB_HOPS: usize = 64;

/// An allowlist glob over owner paths (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    /// Whether a `.` in a quoted key is a character rather than the start of an attribute,
    /// in the pattern and in the paths it is matched against (owner-path globs).
    keys: bool,
    /// The pattern cut at each `**`: one chunk more than there are `**`.
    chunks: Vec<Chunk>,
}

/// A run of the pattern with no `**`, cut into parts at each `.` that starts an attribute;
/// a part is the literal pieces between its `*`s (one more than there are `*`s, the first or
/// last of them empty where a `*` opens or closes the part).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Chunk {
    parts: Vec<Vec<String>>,
    /// For each part, a bit for it and every other part matched the same way (the same
    /// pieces, against a whole part of the path), so that between two `**` each is tried
    /// once per part of the path however often the glob repeats it (`**.*.*.*.b**`).
    alike: Vec<u64>,
}

impl Chunk {
    fn new(parts: Vec<Vec<String>>) -> Chunk {
        let last = parts.len() - 1;
        // The first part is matched against the end of a part of the path, the last against
        // the start of one: each is alike only itself.
        let inner = |i: usize| 0 < i && i < last;
        let alike = (0..parts.len())
            .map(|j| {
                (0..parts.len())
                    .filter(|&i| i == j || (inner(i) && inner(j) && parts[i] == parts[j]))
                    .fold(0, |bits, i| bits | 1 << i)
            })
            .collect();
        Chunk { parts, alike }
    }

    /// For a chunk between two `**`: where its earliest match in the path's parts, from
    /// part `k`'s byte `at` on, ends (the part, and the byte in it). One pass over the
    /// path's parts (Shift-And): bit `j` of `live` says that the chunk's first `j + 1` parts
    /// match up to the path's part at hand.
    fn find(&self, parts: &[&str], k: usize, at: usize) -> Option<(usize, usize)> {
        let r = self.parts.len() - 1;
        let (first, last) = (&self.parts[0], &self.parts[r]);
        if r == 0 {
            return (k..parts.len()).find_map(|h| {
                let from = if h == k { at } else { 0 };
                inside(first, &parts[h][from..]).map(|e| (h, from + e))
            });
        }
        let mut live: u64 = 0;
        for (h, &part) in parts.iter().enumerate().skip(k) {
            let text = if h == k { &part[at..] } else { part };
            let mut tried = ((live << 1) | 1) & (u64::MAX >> (63 - r));
            live = 0;
            while tried != 0 {
                let j = tried.trailing_zeros() as usize;
                let hit = match j {
                    0 => ends(first, text),
                    _ if j == r => prefix(last, text).is_some(),
                    _ => whole(&self.parts[j], text),
                };
                if hit {
                    live |= self.alike[j] & tried;
                }
                tried &= !self.alike[j];
            }
            if (live >> r) & 1 == 1 {
                return prefix(last, text).map(|e| (h, e));
            }
        }
        None
    }
}

/// Where each `.` that starts an attribute is in `text`: every `.`, or with `keys` every
/// `.` outside a quoted key (`["…"]`, `\` escaping the next character). Lenient, so that
/// any string has an answer; on an owner path it agrees with [`parse`].
fn separators(text: &str, keys: bool) -> impl Iterator<Item = usize> + '_ {
    let b = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() {
            let at = i;
            i += 1;
            match b[at] {
                b'.' => return Some(at),
                b'[' if keys && b.get(at + 1) == Some(&b'"') => {
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    i += 1;
                }
                _ => {}
            }
        }
        None
    })
}

impl Glob {
    /// A glob with no keys, in which every `.` counts (kernel-name patterns), at most 63
    /// of them.
    pub fn new(pattern: &str) -> Result<Glob, PathError> {
        Glob::compile(pattern, false)
    }

    fn compile(pattern: &str, keys: bool) -> Result<Glob, PathError> {
        let err = |at: usize, why: &'static str| PathError {
            path: pattern.into(),
            at,
            why,
        };
        if pattern.is_empty() {
            return Err(err(0, "a glob is not empty"));
        }
        if let Some(at) = separators(pattern, keys).nth(MAX_GLOB_HOPS - 1) {
            return Err(err(at, "a glob has at most 63 `.`"));
        }
        let b = pattern.as_bytes();
        let mut seps = separators(pattern, keys).peekable();
        let mut chunks: Vec<Vec<Vec<String>>> = vec![vec![Vec::new()]];
        let mut start = 0;
        // Ends the piece at `i`; the next starts after the `len` bytes there.
        let mut cut = |chunks: &mut Vec<Vec<Vec<String>>>, i: usize, len: usize| {
            let parts = chunks.last_mut().expect("one chunk at least");
            let part = parts.last_mut().expect("one part at least");
            part.push(pattern[start..i].to_string());
            start = i + len;
        };
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'*' && b.get(i + 1) == Some(&b'*') {
                cut(&mut chunks, i, 2);
                chunks.push(vec![Vec::new()]);
                i += 2;
            } else if b[i] == b'*' {
                cut(&mut chunks, i, 1);
                i += 1;
            } else if seps.next_if_eq(&i).is_some() {
                cut(&mut chunks, i, 1);
                chunks.last_mut().expect("one chunk").push(Vec::new());
                i += 1;
            } else {
                i += 1;
            }
        }
        cut(&mut chunks, b.len(), 0);
        Ok(Glob {
            pattern: pattern.to_string(),
            keys,
            chunks: chunks.into_iter().map(Chunk::new).collect(),
        })
    }

    /// A glob over owner paths: [`Glob::new`], once the pattern, with each `*` read as one
    /// character of a name or index, is an owner path of at most 64 hops (`model.[[` and
    /// `model..x` match nothing, and are errors); a `.` in a quoted key, there and in the
    /// paths matched, starts no attribute. Kernel-name patterns have no grammar:
    /// [`Glob::new`].
    pub fn owner_path(pattern: &str) -> Result<Glob, PathError> {
        // `*` → `1` keeps every byte offset, and is a name or an index wherever `*` may be.
        let (_, ends) = parse_hops(&pattern.replace('*', "1"), false).map_err(|e| PathError {
            path: pattern.to_string(),
            ..e
        })?;
        if let Some(&at) = ends
            .get(MAX_GLOB_HOPS - 1)
            .filter(|_| ends.len() > MAX_GLOB_HOPS)
        {
            return Err(PathError {
                path: pattern.to_string(),
                at: at as usize,
                why: "a glob has at most 64 hops",
            });
        }
        Glob::compile(pattern, true)
    }

    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the whole of `path` matches: part by part (the runs between the `.` that
    /// start attributes), each part's pieces found leftmost, never backtracking; in time
    /// linear in the pattern and the path (the path's length times the parts of a chunk
    /// between two `**` at worst).
    pub fn is_match(&self, path: &str) -> bool {
        let mut parts = Vec::new();
        let mut start = 0;
        for sep in separators(path, self.keys) {
            parts.push(&path[start..sep]);
            start = sep + 1;
        }
        parts.push(&path[start..]);
        let (first, rest) = self.chunks.split_first().expect("one chunk at least");
        let Some((last, middle)) = rest.split_last() else {
            return parts.len() == first.parts.len()
                && first.parts.iter().zip(&parts).all(|(g, p)| whole(g, p));
        };
        // Where the match has got to: part `k`, and its bytes left (`parts[k][at..]`). Each
        // chunk's earliest end is taken: a later one leaves the next `**` only less.
        let r = first.parts.len() - 1;
        if parts.len() <= r
            || !first.parts[..r]
                .iter()
                .zip(&parts)
                .all(|(g, p)| whole(g, p))
        {
            return false;
        }
        let Some(mut at) = prefix(&first.parts[r], parts[r]) else {
            return false;
        };
        let mut k = r;
        for chunk in middle {
            let Some(next) = chunk.find(&parts, k, at) else {
                return false;
            };
            (k, at) = next;
        }
        let r = last.parts.len() - 1;
        let Some(base) = parts.len().checked_sub(r + 1).filter(|&b| b >= k) else {
            return false;
        };
        let from = if base == k { at } else { 0 };
        ends(&last.parts[0], &parts[base][from..])
            && last.parts[1..]
                .iter()
                .zip(&parts[base + 1..])
                .all(|(g, p)| whole(g, p))
    }
}

// A part of a glob (its literal pieces, a `*` between each two) against a part of a path,
// which holds no `.` that starts an attribute, so that `*` there matches anything: leftmost
// matching is exact and linear. A piece longer than the text left is not searched for.

/// The end of the pieces found one after another, each leftmost.
fn leftmost(pieces: &[String], text: &str) -> Option<usize> {
    let mut at = 0;
    for p in pieces {
        if p.len() > text.len() - at {
            return None;
        }
        at += text[at..].find(p.as_str())? + p.len();
    }
    Some(at)
}

/// Whether the glob's part matches all of `text`.
fn whole(pieces: &[String], text: &str) -> bool {
    match pieces {
        [only] => text == only,
        [first, inner @ .., last] => {
            first.len() + last.len() <= text.len()
                && text.starts_with(first.as_str())
                && text.ends_with(last.as_str())
                && leftmost(inner, &text[first.len()..text.len() - last.len()]).is_some()
        }
        [] => text.is_empty(),
    }
}

/// Whether the glob's part matches an end of `text` (after a `**`).
fn ends(pieces: &[String], text: &str) -> bool {
    match pieces {
        [init @ .., last] => {
            text.ends_with(last.as_str())
                && leftmost(init, &text[..text.len() - last.len()]).is_some()
        }
        [] => true,
    }
}

/// Where the earliest match of the glob's part from the start of `text` ends (before a `**`).
fn prefix(pieces: &[String], text: &str) -> Option<usize> {
    match pieces {
        [first, rest @ ..] => {
            if !text.starts_with(first.as_str()) {
                return None;
            }
            leftmost(rest, &text[first.len()..]).map(|e| first.len() + e)
        }
        [] => Some(0),
    }
}

/// Where the earliest match of the glob's part anywhere in `text` ends (between two `**`).
fn inside(pieces: &[String], text: &str) -> Option<usize> {
    leftmost(pieces, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_hop_kinds_and_round_trips() {
        let p = r#"model.layers[3].experts["w\"1"][-1].scale"#;
        let segs = parse(p).unwrap();
        assert_eq!(
            segs,
            vec![
                Segment::Attr("model".into()),
                Segment::Attr("layers".into()),
                Segment::Index(3),
                Segment::Attr("experts".into()),
                Segment::Key("w\"1".into()),
                Segment::Index(-1),
                Segment::Attr("scale".into()),
            ]
        );
        assert_eq!(join(&segs), p);
    }

    #[test]
    fn rejects_malformed_paths_with_position() {
        let cases = [
            ("", 0),
            (".a", 0),
            ("a..b", 2),
            ("a[", 1),
            ("a[x]", 2),
            ("a[\"k]", 1),
            ("a[\"k\"x", 5),
            ("a]b", 1),
        ];
        for (p, at) in cases {
            let e = parse(p).expect_err(p);
            assert_eq!(e.at, at, "{p}: {e}");
        }
    }

    #[test]
    fn owner_paths_slice_prefixes_and_hops_without_parsing_again() {
        let p = OwnerPath::parse(r#"model.layers[3].experts["w\"1"][-1].scale"#).unwrap();
        assert_eq!(p.len(), 7);
        assert_eq!(p.prefix(1), "model");
        assert_eq!(p.prefix(3), "model.layers[3]");
        assert_eq!(p.prefix(7), p.as_str());
        assert_eq!(p.segment(4), Segment::Key("w\"1".into()));
        assert_eq!(p.segment(5), Segment::Index(-1));
        assert_eq!(p.last(), Segment::Attr("scale".into()));
        assert_eq!(
            OwnerPath::parse("model").unwrap().last().to_string(),
            "model"
        );
        let a = OwnerPath::parse("m.experts[3].w").unwrap();
        let b = OwnerPath::parse("m.experts[1].w").unwrap();
        assert_eq!(a.index_shift(&b), Some(-2));
        assert_eq!(a.index_shift(&a), None);
        let c = OwnerPath::parse("m.experts[1].v").unwrap();
        assert_eq!(a.index_shift(&c), None);
        assert_eq!(
            OwnerPath::parse("a..b").unwrap_err(),
            parse("a..b").unwrap_err()
        );
        let json: OwnerPath = serde_json::from_str(r#""model.w[0]""#).unwrap();
        assert_eq!(json, "model.w[0]");
        assert!(serde_json::from_str::<OwnerPath>(r#""model..w""#).is_err());
    }

    #[test]
    fn glob_star_stays_in_one_hop() {
        let g = Glob::new("model.layers[*].attn.*").unwrap();
        assert!(g.is_match("model.layers[12].attn.W_UV"));
        assert!(!g.is_match("model.layers[12].attn.impl.W_UV"));
        assert!(!g.is_match("model.layers[1].mlp.w"));
        let gg = Glob::new("**.workspace").unwrap();
        assert!(gg.is_match("model.layers[0].quant_method.kernel.workspace"));
        assert!(!gg.is_match("model.layers[0].workspace2"));
        assert!(Glob::new("a.b").unwrap().is_match("a.b"));
        assert!(!Glob::new("a.b").unwrap().is_match("a.bc"));
        assert!(Glob::new("**").unwrap().is_match(""));
        // `*` stops only at `.`: it runs across brackets, as docs/guide/findings.md says.
        assert!(Glob::new("a.l[*]").unwrap().is_match("a.l[0][1]"));
        // What a `**` leaves is matched once: pieces on either side never share a byte.
        for (g, p, want) in [
            ("ab**b", "ab", false),
            ("ab**b", "abb", true),
            ("ab**ba", "aba", false),
            ("a**b**a", "aba", true),
            ("a**b**a", "ab", false),
            ("x.ab**.b", "x.ab.b", true),
            ("x.ab**b.c", "x.ab.c", false),
        ] {
            assert_eq!(Glob::new(g).unwrap().is_match(p), want, "{g} on {p}");
        }
    }

    /// Regression (issue 25): a `.` in a quoted key ended a hop, so neither
    /// `runner.adapters[*].scale` nor `runner.adapters["*"].scale` matched
    /// `runner.adapters["lora.v1"].scale`.
    #[test]
    fn a_dot_in_a_quoted_key_is_no_hop_to_a_glob() {
        let path = r#"runner.adapters["lora.v1"].scale"#;
        let glob = |g: &str| Glob::owner_path(g).unwrap_or_else(|e| panic!("{g}: {e}"));
        for g in [
            "runner.adapters[*].scale",
            r#"runner.adapters["*"].scale"#,
            r#"runner.adapters["lora.*"].scale"#,
            r#"runner.adapters["*.v1"].*"#,
            "runner.adapters*.scale",
            "**.scale",
            r#"**["lora.v1"].*"#,
        ] {
            assert!(glob(g).is_match(path), "{g}");
        }
        // A glob's own `.` between hops is one of the path's, never a key's.
        for g in ["**.v1**", "runner.*.scale.*", "runner.adapters[*].*.scale"] {
            assert!(!glob(g).is_match(path), "{g}");
        }
        // `[*]` matches an index or a key, `["*"]` a key only.
        assert!(glob("m.l[*].w").is_match("m.l[3].w"));
        assert!(glob("m.l[*].w").is_match("m.l[-1].w"));
        assert!(!glob(r#"m.l["*"].w"#).is_match("m.l[3].w"));
        assert!(glob(r#"m.l["*"].w"#).is_match(r#"m.l["a\"."].w"#));
        // Kernel-name patterns have no keys: every `.` ends a hop there, as before.
        assert!(
            !Glob::new("runner.adapters[*].scale")
                .unwrap()
                .is_match(path)
        );
    }

    /// Regression (issue 25): matching was quadratic, `*a` ten thousand times then `b`
    /// against a 10⁶-character path took 25.7 s; the answers must stay the same.
    #[test]
    fn pathological_globs_answer_as_before() {
        let name = "a".repeat(1_000_000);
        let star_a = Glob::owner_path(&format!("{}b", "*a".repeat(10_000))).unwrap();
        assert!(!star_a.is_match(&name));
        assert!(star_a.is_match(&format!("{name}b")));
        assert!(!star_a.is_match(&format!("{}b", "a".repeat(9_999))));
        assert!(!star_a.is_match(&format!("{name}.b")));
        // An even run of `*` is all `**`: it crosses hops; an odd one ends in one `*` more.
        let stars = Glob::owner_path(&"*".repeat(10_000)).unwrap();
        assert!(stars.is_match(&name));
        assert!(stars.is_match("a.b[0]"));
        assert!(
            Glob::owner_path(&"*".repeat(10_001))
                .unwrap()
                .is_match("a.b")
        );
        let hops = vec!["a"; 20_000].join(".");
        let most = Glob::owner_path(&format!("**.{}.b**", vec!["*"; 62].join("."))).unwrap();
        assert!(!most.is_match(&hops));
        assert!(most.is_match(&format!("{hops}.b.a")));
        assert!(!most.is_match(&format!("a.{}b", "a.".repeat(61))));
        assert!(most.is_match(&format!("a.{}b", "a.".repeat(62))));
    }

    /// A glob's hops are bounded, so that matching between two `**` is at most 64 times
    /// the path's length.
    #[test]
    fn a_glob_of_more_than_64_hops_is_refused_where_its_65th_starts() {
        let g = vec!["*"; 65].join(".");
        let e = Glob::owner_path(&g).unwrap_err();
        assert_eq!(e.at, 127, "{e}");
        assert_eq!(
            e.to_string(),
            format!("invalid owner path {g:?} at byte 127: a glob has at most 64 hops")
        );
        assert!(Glob::new(&vec!["k"; 65].join(".")).is_err());
        assert!(Glob::owner_path(&vec!["*"; 64].join(".")).is_ok());
        // A quoted key's `.` is no hop.
        let keyed = format!("m[\"{}\"]", ".".repeat(100));
        assert!(Glob::owner_path(&keyed).unwrap().is_match(&keyed));
    }

    /// The hop separators of a path, found by the parser: where each hop written `.name`
    /// starts. With `keys` off, every `.`.
    fn separators(text: &str, keys: bool) -> Vec<bool> {
        let mut sep = vec![false; text.len()];
        if !keys {
            for (i, b) in text.bytes().enumerate() {
                sep[i] = b == b'.';
            }
            return sep;
        }
        let p = OwnerPath::parse(text).unwrap();
        for k in 1..p.len() {
            let start = p.prefix(k).len();
            sep[start] = text.as_bytes()[start] == b'.';
        }
        sep
    }

    /// The matcher this module once had, quadratic: dynamic programming over (token, byte),
    /// with a `.` that separates hops told apart from a `.` in a key.
    fn reference(pattern: &str, keys: bool, path: &str) -> bool {
        let psep = separators(&pattern.replace('*', "1"), keys);
        let tsep = separators(path, keys);
        let (pb, tb) = (pattern.as_bytes(), path.as_bytes());
        let mut cur = vec![false; tb.len() + 1];
        cur[0] = true;
        let mut i = 0;
        while i < pb.len() {
            let mut next = vec![false; tb.len() + 1];
            if pb[i] == b'*' {
                let crosses = pb.get(i + 1) == Some(&b'*');
                for j in 0..=tb.len() {
                    next[j] = cur[j] || (j > 0 && next[j - 1] && (crosses || !tsep[j - 1]));
                }
                i += 1 + usize::from(crosses);
            } else {
                for j in 0..tb.len() {
                    next[j + 1] = cur[j] && tb[j] == pb[i] && tsep[j] == psep[i];
                }
                i += 1;
            }
            cur = next;
        }
        cur[tb.len()]
    }

    /// The linear matcher answers as the quadratic one on random owner paths and globs, with
    /// keys holding `.` and brackets in every position.
    #[test]
    fn glob_matches_answer_as_the_quadratic_reference() {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        const HOPS: [&str; 10] = [
            ".a",
            ".b",
            ".ab",
            "[0]",
            "[1]",
            "[\"a\"]",
            "[\"a.b\"]",
            "[\".\"]",
            "[\"b.\"]",
            ".a1",
        ];
        let mut rng = SmallRng::seed_from_u64(25);
        let path = |rng: &mut SmallRng| {
            let mut p = ["a", "b", "ab", "aba"][rng.random_range(0..4)].to_string();
            for _ in 0..rng.random_range(0..7) {
                p.push_str(HOPS[rng.random_range(0..HOPS.len())]);
            }
            p
        };
        let (mut tried, mut matched) = (0, 0);
        while tried < 4_000 {
            let source = path(&mut rng);
            let mut g = source.clone();
            for _ in 0..rng.random_range(0..4) {
                let at = rng.random_range(0..=g.len());
                let to = (at + rng.random_range(0..4)).min(g.len());
                let stars = ["*", "**", "***"][rng.random_range(0..3)];
                if g.is_char_boundary(at) && g.is_char_boundary(to) {
                    g.replace_range(at..to, stars);
                }
            }
            // Also between two `**`, where the path's hops are tried against all the glob's.
            let inner = format!("**.{g}.**");
            let mut paths: Vec<String> = (0..30).map(|_| path(&mut rng)).collect();
            paths.push(source.clone());
            let framed: Vec<String> = paths.iter().map(|p| format!("b.a.{p}.a.b")).collect();
            for (g, paths) in [(&g, &paths), (&inner, &framed)] {
                for (keys, glob) in [(true, Glob::owner_path(g)), (false, Glob::new(g))] {
                    let Ok(glob) = glob else { continue };
                    tried += 1;
                    for p in paths.iter() {
                        let want = reference(g, keys, p);
                        assert_eq!(glob.is_match(p), want, "glob {g:?} (keys {keys}) on {p:?}");
                        matched += usize::from(want);
                    }
                }
            }
        }
        assert!(
            matched > 3_000,
            "only {matched} matches: the test exercises too little"
        );
    }
}
