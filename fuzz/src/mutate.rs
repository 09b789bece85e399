//! Structure-aware mutation: JSON documents are changed as trees (numbers pushed to their
//! edges, strings bent the ways parsers get wrong, keys dropped or added, nodes of one
//! document spliced into another), text as characters drawn from the grammar it should
//! follow, and sometimes bytes, so that the loaders see near-valid input, not only noise.

use rand::Rng;
use rand::rngs::SmallRng;
use serde_json::{Map, Number, Value};

/// Characters that parsers of owner paths, addresses, globs and TOML treat specially.
pub const SPECIAL: &[&str] = &[
    ".",
    "[",
    "]",
    "\"",
    "\\",
    "*",
    "**",
    "-",
    "+",
    "0",
    "9",
    "0x",
    "0X",
    "x",
    "f",
    "ff",
    "\r",
    "\n",
    "\t",
    "\u{0}",
    "\u{1b}[31m",
    "\u{7f}",
    "\u{85}",
    "é",
    "\u{200b}",
    "💥",
    " ",
    "'",
    "=",
    "#",
    "{",
    "}",
    ",",
    ":",
    "<",
    ">",
    "(",
    ")",
    "::",
    "&",
    "*const ",
];

/// Numbers at the edges of the types documents use.
fn edge_number(rng: &mut SmallRng) -> Value {
    let n: Number = match rng.random_range(0..12) {
        0 => 0.into(),
        1 => (-1).into(),
        2 => 1.into(),
        3 => u32::MAX.into(),
        4 => (u64::from(u32::MAX) + 1).into(),
        5 => u64::MAX.into(),
        6 => i64::MIN.into(),
        7 => Number::from_f64(1.5).expect("finite"),
        8 => Number::from_f64(1e30).expect("finite"),
        9 => Number::from_f64(18446744073709551616.0).expect("finite"),
        10 => rng.random_range(0..64u64).into(),
        _ => rng.random::<u64>().into(),
    };
    Value::Number(n)
}

/// A string changed at one place, with characters from [`SPECIAL`] or from `dict`.
pub fn mutate_text(rng: &mut SmallRng, s: &str, dict: &[String]) -> String {
    let chars: Vec<char> = s.chars().collect();
    let at = if chars.is_empty() {
        0
    } else {
        rng.random_range(0..=chars.len())
    };
    let piece = if !dict.is_empty() && rng.random_bool(0.3) {
        dict[rng.random_range(0..dict.len())].clone()
    } else {
        SPECIAL[rng.random_range(0..SPECIAL.len())].to_string()
    };
    let piece = || piece.clone();
    let head: String = chars[..at].iter().collect();
    let tail_from = |n: usize| -> String { chars[(at + n).min(chars.len())..].iter().collect() };
    match rng.random_range(0..8) {
        0 => format!("{head}{}{}", piece(), tail_from(0)),
        1 => format!("{head}{}", tail_from(1)),
        2 => format!("{head}{}{}", piece(), tail_from(1)),
        3 => head,
        4 => String::new(),
        5 => format!("{s}{s}"),
        6 => s.to_uppercase(),
        _ => {
            // An address-shaped string bent: a sign, a 17th digit, a missing prefix.
            match rng.random_range(0..5) {
                0 => s.replacen("0x", "0x+", 1),
                1 => format!("{s}0"),
                2 => s.trim_start_matches("0x").to_string(),
                3 => s.replacen("0x", "0X", 1),
                _ => s.replacen("0x", "0x-", 1),
            }
        }
    }
}

/// Every node of a tree, as paths of steps.
fn paths(v: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(here.clone());
    match v {
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                here.push(Step::Index(i));
                paths(x, here, out);
                here.pop();
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                here.push(Step::Key(k.clone()));
                paths(x, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum Step {
    Index(usize),
    Key(String),
}

fn at<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    let mut v = v;
    for s in path {
        v = match s {
            Step::Index(i) => v.get_mut(*i)?,
            Step::Key(k) => v.get_mut(k.as_str())?,
        };
    }
    Some(v)
}

fn get<'a>(v: &'a Value, path: &[Step]) -> Option<&'a Value> {
    let mut v = v;
    for s in path {
        v = match s {
            Step::Index(i) => v.get(*i)?,
            Step::Key(k) => v.get(k.as_str())?,
        };
    }
    Some(v)
}

/// One to four structural mutations of `doc`; `donors` are other documents whose nodes
/// may be spliced in, `dict` strings seen in the corpus.
pub fn mutate_json(rng: &mut SmallRng, doc: &mut Value, donors: &[Value], dict: &[String]) {
    for _ in 0..rng.random_range(1..=4) {
        let mut all = Vec::new();
        paths(doc, &mut Vec::new(), &mut all);
        // Leaves are most of a document; bias toward them but reach containers too.
        let path = all[rng.random_range(0..all.len())].clone();
        // The same path in a donor, where it has one: a plausible replacement.
        let donor_node = if donors.is_empty() {
            None
        } else {
            get(&donors[rng.random_range(0..donors.len())], &path).cloned()
        };
        let donor_node = || donor_node.clone();
        let Some(node) = at(doc, &path) else { continue };
        match rng.random_range(0..14) {
            0 | 1 => {
                if let Value::String(s) = node {
                    *s = mutate_text(rng, s, dict);
                } else if node.is_number() {
                    *node = edge_number(rng);
                }
            }
            2 => *node = edge_number(rng),
            3 => {
                *node = match rng.random_range(0..6) {
                    0 => Value::Null,
                    1 => Value::Bool(rng.random()),
                    2 => Value::String(String::new()),
                    3 => Value::Array(vec![]),
                    4 => Value::Object(Map::new()),
                    _ => Value::String(
                        dict.get(rng.random_range(0..dict.len().max(1)))
                            .cloned()
                            .unwrap_or_default(),
                    ),
                }
            }
            4 => match node {
                Value::Array(a) if !a.is_empty() => {
                    let i = rng.random_range(0..a.len());
                    a.remove(i);
                }
                Value::Object(o) if !o.is_empty() => {
                    let k = o.keys().nth(rng.random_range(0..o.len())).cloned();
                    if let Some(k) = k {
                        o.remove(&k);
                    }
                }
                _ => {}
            },
            5 => match node {
                Value::Array(a) if !a.is_empty() => {
                    let i = rng.random_range(0..a.len());
                    let x = a[i].clone();
                    a.insert(rng.random_range(0..=a.len()), x);
                }
                Value::Object(o) => {
                    o.insert("unknown_field".into(), Value::from(1));
                }
                _ => {}
            },
            6 => {
                if let Value::Array(a) = node
                    && a.len() > 1
                {
                    let i = rng.random_range(0..a.len());
                    let j = rng.random_range(0..a.len());
                    a.swap(i, j);
                }
            }
            7 => {
                if let Some(d) = donor_node() {
                    *node = d;
                }
            }
            8 => {
                if let Value::String(s) = node {
                    *s = dict
                        .get(rng.random_range(0..dict.len().max(1)))
                        .cloned()
                        .unwrap_or_default();
                }
            }
            9 => {
                if let Value::Number(n) = node
                    && let Some(u) = n.as_u64()
                {
                    // Off by one: ids that point one past the end, or at a neighbour.
                    *node = Value::from(if rng.random() {
                        u.wrapping_add(1)
                    } else {
                        u.saturating_sub(1)
                    });
                }
            }
            10 => {
                if let Value::Array(a) = node {
                    a.truncate(rng.random_range(0..=a.len()));
                }
            }
            11 => {
                if let Value::String(s) = node {
                    // A long string: 64 KiB of one character.
                    s.extend(std::iter::repeat_n('a', 1 << 16));
                }
            }
            _ => {
                // Two of a document's own nodes exchanged (ids, addresses, names).
                let other = all[rng.random_range(0..all.len())].clone();
                let (a, b) = (get(doc, &path).cloned(), get(doc, &other).cloned());
                if let (Some(a), Some(b)) = (a, b)
                    && let Some(x) = at(doc, &path)
                {
                    *x = b;
                    if let Some(y) = at(doc, &other) {
                        *y = a;
                    }
                }
            }
        }
    }
}

/// Byte-level damage to serialized text: a cut, a flipped byte, a byte inserted.
pub fn mutate_bytes(rng: &mut SmallRng, bytes: &mut Vec<u8>) {
    if bytes.is_empty() {
        bytes.push(b'{');
        return;
    }
    let i = rng.random_range(0..bytes.len());
    match rng.random_range(0..4) {
        0 => bytes.truncate(i),
        1 => bytes[i] ^= 1 << rng.random_range(0..8),
        2 => bytes.insert(
            i,
            [b'"', b'{', b'}', b'[', b']', b',', b'\\', 0, 0xff][rng.random_range(0..9)],
        ),
        _ => {
            bytes.remove(i);
        }
    }
}
