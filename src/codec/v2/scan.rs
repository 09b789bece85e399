//! The fast reader of a format 2 manifest: the same parse, except that each graph's
//! `touches` column, most of a big manifest's bytes (a million touches are five million
//! numbers), is read by a scanner of its own instead of serde's visitors, on the threads
//! that convert the graphs.
//!
//! The scanner takes only a subset of JSON: the column's arrays, unsigned integers in
//! their plain form, `null` and `"0x…"` strings without escapes, with any whitespace
//! between them. Whatever else it meets, valid JSON or not, it declines, and the loader
//! parses the whole document again the usual way, which reads everything JSON allows and
//! words every error. So this reader never decides what a document means or what is wrong
//! with it; it only makes the common case cheaper.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{ManifestV2, TouchList};
use crate::codec::objects::Objects;
use crate::index::refs::Invalid;
use crate::model::format::{Addr, DocKind, Manifest, Touch};

/// How a graph's `touches` column is held between the parse and the conversion.
pub trait TouchColumn: Sized {
    /// The column as one [`TouchList`] per node. An error from [`RawTouches`] only means
    /// that the fast reader declines the column.
    fn lists(self) -> Result<Vec<TouchList>, Invalid>;
}

impl TouchColumn for Vec<TouchList> {
    fn lists(self) -> Result<Vec<TouchList>, Invalid> {
        Ok(self)
    }
}

/// A `touches` column's JSON text, borrowed from the document and scanned when the graph
/// is converted.
pub type RawTouches<'a> = &'a RawValue;

impl TouchColumn for &RawValue {
    fn lists(self) -> Result<Vec<TouchList>, Invalid> {
        touch_column(self.get().as_bytes()).ok_or_else(|| {
            Invalid::at(
                "touches".to_string(),
                "declined by the fast reader".to_string(),
            )
        })
    }
}

/// A format 2 manifest read by the fast reader, or `None` where it declines or the
/// document is not a valid manifest of `version`: then the caller parses it the usual way.
pub fn fast_manifest(bytes: &[u8], version: u32) -> Option<Manifest> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let doc = ManifestV2::<RawTouches<'_>>::deserialize(Objects(&mut de)).ok()?;
    de.end().ok()?;
    if doc.format_version != version || doc.kind != DocKind::Manifest {
        return None;
    }
    doc.into_model().ok()
}

/// A position in the column's bytes.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    /// The next byte that is not JSON whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        match self.b.get(self.i) {
            Some(&c) if !is_space(c) => Some(c),
            _ => self.peek_past_space(),
        }
    }

    #[cold]
    fn peek_past_space(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.i) {
            if !is_space(c) {
                return Some(c);
            }
            self.i += 1;
        }
        None
    }

    /// Consumes `c` where it comes next.
    #[inline]
    fn eat(&mut self, c: u8) -> bool {
        let found = self.peek() == Some(c);
        self.i += usize::from(found);
        found
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        self.eat(c).then_some(())
    }

    /// An unsigned integer as serde_json reads one: digits, no leading zero, no fraction
    /// or exponent (those make it a float), within `u64`.
    fn uint(&mut self) -> Option<u64> {
        self.peek()?;
        // Locals, so that the loop keeps them in registers; 19 digits cannot overflow, so
        // only a 20th is checked.
        let (b, start) = (self.b, self.i);
        let mut i = start;
        let mut v: u64 = 0;
        while i - start < 19
            && let Some(&c) = b.get(i)
            && c.is_ascii_digit()
        {
            v = v * 10 + u64::from(c - b'0');
            i += 1;
        }
        if let Some(&c) = b.get(i)
            && c.is_ascii_digit()
        {
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            i += 1;
        }
        let digits = i - start;
        if digits == 0
            || (digits > 1 && b[start] == b'0')
            || matches!(b.get(i), Some(b'0'..=b'9' | b'.' | b'e' | b'E'))
        {
            return None;
        }
        self.i = i;
        Some(v)
    }

    fn u32(&mut self) -> Option<u32> {
        self.uint()?.try_into().ok()
    }

    /// `null` as `Some(None)`, an id as `Some(Some(id))`.
    fn opt_u32(&mut self) -> Option<Option<u32>> {
        if self.peek()? == b'n' {
            let rest = self.b.get(self.i..self.i + 4)?;
            (rest == b"null").then(|| {
                self.i += 4;
                None
            })
        } else {
            self.u32().map(Some)
        }
    }

    /// A touch's `addr`: an offset, or an address string (then `true`).
    fn addr(&mut self) -> Option<(Addr, bool)> {
        if self.peek()? != b'"' {
            return self.uint().map(|o| (Addr(o), false));
        }
        let start = self.i + 1;
        let len = self.b.get(start..)?.iter().position(|&c| c == b'"')?;
        let text = &self.b[start..start + len];
        if text.iter().any(|&c| c == b'\\' || c < 0x20) {
            return None;
        }
        self.i = start + len + 1;
        let addr = Addr::parse_strict(std::str::from_utf8(text).ok()?)?;
        Some((addr, true))
    }

    /// One touch array, `[param, offset, addr, tensor, allocation]`.
    fn touch(&mut self) -> Option<(Touch, bool)> {
        self.expect(b'[')?;
        let param = self.u32()?;
        self.expect(b',')?;
        let offset = self.u32()?;
        self.expect(b',')?;
        let (addr, absolute) = self.addr()?;
        self.expect(b',')?;
        let tensor = self.opt_u32()?.map(crate::model::format::TensorId);
        self.expect(b',')?;
        let allocation = self.opt_u32()?.map(crate::model::format::AllocationId);
        self.expect(b']')?;
        let touch = Touch {
            param,
            offset,
            addr,
            tensor,
            allocation,
        };
        Some((touch, absolute))
    }

    /// One node's touches, gathered in `scratch` and copied once at their count.
    fn node(&mut self, scratch: &mut Vec<Touch>) -> Option<TouchList> {
        self.expect(b'[')?;
        scratch.clear();
        let mut absolute = Vec::new();
        if !self.eat(b']') {
            loop {
                let (touch, at) = self.touch()?;
                if at {
                    absolute.push(u32::try_from(scratch.len()).ok()?);
                }
                scratch.push(touch);
                if !self.eat(b',') {
                    self.expect(b']')?;
                    break;
                }
            }
        }
        Some(TouchList {
            touches: scratch.to_vec(),
            absolute,
        })
    }
}

/// JSON's whitespace.
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\n' | b'\r' | b'\t')
}

/// A whole `touches` column, or `None` where the scanner declines it.
pub(super) fn touch_column(b: &[u8]) -> Option<Vec<TouchList>> {
    let mut c = Cursor { b, i: 0 };
    let mut scratch = Vec::new();
    let mut lists = Vec::new();
    c.expect(b'[')?;
    if !c.eat(b']') {
        loop {
            lists.push(c.node(&mut scratch)?);
            if !c.eat(b',') {
                c.expect(b']')?;
                break;
            }
        }
    }
    (c.peek().is_none()).then_some(lists)
}

#[cfg(test)]
mod tests;
