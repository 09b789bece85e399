//! Owner paths (`model.layers[3].attn["k"]`) and the globs an allowlist matches them with.
//!
//! Grammar of a path: a root name, then any number of hops:
//! - `.name` — an attribute (`name` is any run of characters but `.`, `[`, `]`, `"`),
//! - `[3]` or `[-1]` — a list or tuple index (or an integer dict key),
//! - `["key"]` — a dict key, with `\"` and `\\` escaped inside the quotes.
//!
//! Grammar of a glob: a path in which `*` matches any run of characters except `.` (one
//! attribute, or the inside of one pair of brackets), and `**` matches any run at all.
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
    let err = |at: usize, why: &'static str| PathError {
        path: path.to_string(),
        at,
        why,
    };
    let bytes = path.as_bytes();
    let mut segs = Vec::new();
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
    segs.push(Segment::Attr(path[..end].to_string()));
    i = i.max(end);
    while i < bytes.len() {
        match bytes[i] {
            b'.' => {
                let end = name_end(i + 1);
                if end == i + 1 {
                    return Err(err(i + 1, "expected an attribute name after '.'"));
                }
                segs.push(Segment::Attr(path[i + 1..end].to_string()));
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
                            Some((_, c @ ('"' | '\\'))) => key.push(c),
                            _ => return Err(err(j + k, "only \\\" and \\\\ are escapes")),
                        },
                        Some((k, '"')) => break j + k,
                        Some((_, c)) => key.push(c),
                    }
                };
                if bytes.get(close + 1) != Some(&b']') {
                    return Err(err(close + 1, "expected ']' after the closing quote"));
                }
                segs.push(Segment::Key(key));
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
                segs.push(Segment::Index(idx));
                i = close + 1;
            }
            _ => return Err(err(i, "expected '.', '[' or the end of the path")),
        }
    }
    Ok(segs)
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
    }
}
