//! Owner paths (`model.layers[3].attn["k"]`) and the globs an allowlist matches them with.
//!
//! Grammar of a path: a root name, then any number of hops:
//! - `.name` — an attribute (`name` is any run of characters but `.`, `[`, `]`, `"`),
//! - `[3]` or `[-1]` — a list or tuple index (or an integer dict key),
//! - `["key"]` — a dict key, with `\"` and `\\` escaped inside the quotes.
//!
//! Grammar of a glob: a path in which `*` matches any run of characters except `.` (one
//! attribute, or any run of brackets: `[*]` matches `[0][1]`), and `**` matches any run at
//! all. An owner-path glob must be a path once each `*` is read as a name or index
//! character ([`Glob::owner_path`]).
//! Brackets are literal, which is why this is not `globset`: there `[3]` is a class.

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

/// An allowlist glob over owner paths (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    tokens: Vec<Token>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Lit(u8),
    /// `*`: any run without `.`.
    Star,
    /// `**`: any run.
    StarStar,
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Glob, PathError> {
        if pattern.is_empty() {
            return Err(PathError {
                path: pattern.into(),
                at: 0,
                why: "a glob is not empty",
            });
        }
        let b = pattern.as_bytes();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'*' {
                if b.get(i + 1) == Some(&b'*') {
                    tokens.push(Token::StarStar);
                    i += 2;
                } else {
                    tokens.push(Token::Star);
                    i += 1;
                }
            } else {
                tokens.push(Token::Lit(b[i]));
                i += 1;
            }
        }
        Ok(Glob {
            pattern: pattern.to_string(),
            tokens,
        })
    }

    /// A glob over owner paths: [`Glob::new`], once the pattern, with each `*` read as one
    /// character of a name or index, is an owner path (`model.[[` and `model..x` match
    /// nothing, and are errors). Kernel-name patterns have no grammar: [`Glob::new`].
    pub fn owner_path(pattern: &str) -> Result<Glob, PathError> {
        // `*` → `1` keeps every byte offset, and is a name or an index wherever `*` may be.
        parse_hops(&pattern.replace('*', "1"), false).map_err(|e| PathError {
            path: pattern.to_string(),
            ..e
        })?;
        Glob::new(pattern)
    }

    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the whole of `path` matches.
    pub fn is_match(&self, path: &str) -> bool {
        // Dynamic programming over (token, byte): linear in both, no backtracking blow-up.
        let p = path.as_bytes();
        let mut cur = vec![false; p.len() + 1];
        cur[0] = true;
        for tok in &self.tokens {
            let mut next = vec![false; p.len() + 1];
            match tok {
                Token::Lit(c) => {
                    for j in 0..p.len() {
                        if cur[j] && p[j] == *c {
                            next[j + 1] = true;
                        }
                    }
                }
                Token::Star | Token::StarStar => {
                    let crosses = matches!(tok, Token::StarStar);
                    for j in 0..=p.len() {
                        if cur[j] || (j > 0 && next[j - 1] && (crosses || p[j - 1] != b'.')) {
                            next[j] = true;
                        }
                    }
                }
            }
            cur = next;
        }
        cur[p.len()]
    }
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
        // `*` stops only at `.`: it runs across brackets, as the README says.
        assert!(Glob::new("a.l[*]").unwrap().is_match("a.l[0][1]"));
    }
}
