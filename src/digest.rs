//! The content digest graphcheck computes itself, `gc128`: its definition, the CPU
//! implementation (the twin of the GPU kernel in `graphcheck-driver`'s `digest` module,
//! which must give identical digests), and the strided views it reads.
//!
//! # The algorithm
//!
//! The input is a view's elements in row-major order, as bytes (the same bytes `sha256`
//! and `sum64` digest), `L` of them. They are read as `n = ceil(L / 8)` little-endian
//! 64-bit words `w_0 … w_{n-1}`, the last one zero-padded. Each word contributes one term to
//! each of two 64-bit lanes, summed modulo 2^64; the keys of word `i` are derived from its
//! position, `K_i = (i + 1) · KEY_A` and `Q_i = (i + 1) · KEY_B` (mod 2^64):
//!
//! - lane A, an NH term (the hash of UMAC): with `lo`/`hi` the word's 32-bit halves and
//!   additions mod 2^32, `A += (lo + lo32(K_i)) · (hi + hi32(K_i))`, a 32×32→64-bit product;
//! - lane B, a keyed bijection of the word: `B += fmix64(w_i XOR Q_i)`.
//!
//! `fmix64` is MurmurHash3's 64-bit finalizer: `x ^= x >> 33; x *= FMIX_1; x ^= x >> 33;
//! x *= FMIX_2; x ^= x >> 33` (mod 2^64). The digest is `gc128:` and 32 hex digits, `h1`
//! then `h2`: `a = fmix64(A XOR ((L + 1) · KEY_LEN))`, `b = fmix64((B + L) XOR KEY_B)`,
//! `h1 = a + b`, `h2 = b XOR fmix64(h1)`.
//!
//! Sums make it parallel: any split of the words, reduced in any order, gives the same lane
//! sums, and position enters each term, not the order of reduction. Per 8 bytes it costs one
//! 32×32→64-bit multiply-add and two 64-bit multiplies by constants (three 32-bit multiplies
//! each on a GPU), so the GPU kernel stays bound by memory bandwidth.
//!
//! # What it detects, and what it does not
//!
//! It is **not cryptographic**: keys are public constants, the lanes are sums, and colliding
//! inputs can be constructed on purpose (lane B alone by inverting one word's term to cancel
//! another's; both lanes with more work). Use `sha256` where an adversary chooses the data.
//!
//! Proven (tests exercise each):
//!
//! 1. **A change confined to one aligned 8-byte word** of the byte stream, length kept,
//!    always changes the digest: lane B's term is a bijection of the word for a fixed
//!    position (XOR with a key, `x ^= x >> 33` and multiplication by an odd constant are
//!    each invertible mod 2^64), so `B` changes, and the finalization is a bijection of
//!    `(A, B)` for a fixed `L`. This covers one element of at most 8 bytes changed in any
//!    way (a zeroed scalar, any bit flips) and two different elements swapped inside one
//!    word (e.g. bf16 elements 0 and 3).
//! 2. **Equal lane sums and different lengths** always give different digests (`a` and `b`
//!    are injective in `L`, and `(a, b) → (h1, h2)` is a bijection): zero bytes appended
//!    inside the last word change the digest.
//!
//! Not proven: changes that span several words (a swap of elements in different words, a
//! zeroed 16-byte complex128 element, appended whole words). Such a change is missed only
//! when it cancels in both lanes at once, and no bound holds for data chosen against the
//! keys. What is known of each lane:
//!
//! - Lane A (NH) misses a two-word change whenever the two products change by opposite
//!   amounts. NH with uniformly random keys collides with probability at most 2^-32 (Black
//!   et al., UMAC, 1999); gc128's keys are a fixed function of the position, and an example
//!   of the 2^-32 class is the same bit of the low half set in one word and cleared in
//!   another whose key-shifted high halves are equal.
//! - Lane B: for two words changed by the same bit flip, the term's change must cancel the
//!   other's. Measured over 2^22 random words for input bits 0, 1, 15, 31, 32, 33, 47, 62
//!   and 63, no difference `fmix64(x ^ bit) - fmix64(x)` repeated, so the chance that two
//!   cancel is below what that sample can show (5.7e-14). (A first design of this lane, two
//!   32-bit multiply-xor steps, measured 0.15 for bit 32: flipped in two words, lane B
//!   cancelled in one case of seven. That is why lane B is `fmix64`.)
//!
//! Treating the lanes as independent, such changes are missed with probability around
//! 2^-96 or less; modeled, not proven. The tests also check tens of thousands of random
//! multi-word changes (swaps, paired bit flips, zeroed runs) and find no miss, which shows
//! that the structure is not grossly broken, nothing more.

use crate::model::format::Digest;

/// The algorithm's name, the prefix of its digests.
pub const GC128: &str = "gc128";

/// The key multiplier of lane A (the 64-bit golden ratio; odd).
pub const KEY_A: u64 = 0x9E37_79B9_7F4A_7C15;
/// The key multiplier of lane B (odd).
pub const KEY_B: u64 = 0xD6E8_FEB8_6659_FD93;
/// `fmix64`'s first multiplier (MurmurHash3's; odd).
pub const FMIX_1: u64 = 0xff51_afd7_ed55_8ccd;
/// `fmix64`'s second multiplier (MurmurHash3's; odd).
pub const FMIX_2: u64 = 0xc4ce_b9fe_1a85_ec53;
/// The length's multiplier in the finalization (odd).
pub const KEY_LEN: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// The two 64-bit lane sums of a run of words: what the GPU kernel accumulates per tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lanes {
    pub a: u64,
    pub b: u64,
}

impl Lanes {
    /// Adds another part's sums (the parts of a split input, in any order).
    pub fn add(&mut self, other: Lanes) {
        self.a = self.a.wrapping_add(other.a);
        self.b = self.b.wrapping_add(other.b);
    }

    /// Adds word `w` at word position `i`, given its keys `k = (i + 1) · KEY_A` and
    /// `q = (i + 1) · KEY_B` (callers step them along instead of multiplying).
    #[inline(always)]
    fn add_word(&mut self, w: u64, k: u64, q: u64) {
        let (lo, hi) = (w as u32, (w >> 32) as u32);
        let x = lo.wrapping_add(k as u32);
        let y = hi.wrapping_add((k >> 32) as u32);
        self.a = self.a.wrapping_add(u64::from(x) * u64::from(y));
        self.b = self.b.wrapping_add(fmix64(w ^ q));
    }

    /// The lane sums of the words `words`, the first at word position `first`.
    pub fn of_words(first: u64, words: impl IntoIterator<Item = u64>) -> Lanes {
        let mut lanes = Lanes::default();
        let j = first.wrapping_add(1);
        let (mut k, mut q) = (j.wrapping_mul(KEY_A), j.wrapping_mul(KEY_B));
        for w in words {
            lanes.add_word(w, k, q);
            k = k.wrapping_add(KEY_A);
            q = q.wrapping_add(KEY_B);
        }
        lanes
    }

    /// The digest of an input of `len` bytes whose words sum to these lanes.
    pub fn finish(self, len: u64) -> Digest {
        self.text(len).digest()
    }

    /// [`Lanes::finish`] as text, without allocating.
    pub fn text(self, len: u64) -> DigestText {
        DigestText::of(finish(self, len))
    }
}

/// A digest's text, `gc128:` then its halves `h1` and `h2` as 16 hex digits each, held
/// without allocating: the digests of many small views go from here straight into the
/// caller's strings.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DigestText([u8; DigestText::LEN]);

impl DigestText {
    const LEN: usize = GC128.len() + 33;

    fn of(halves: [u64; 2]) -> DigestText {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; Self::LEN];
        text[..GC128.len()].copy_from_slice(GC128.as_bytes());
        text[GC128.len()] = b':';
        for (half, h) in halves.into_iter().enumerate() {
            let at = GC128.len() + 1 + 16 * half;
            for (i, digit) in text[at..at + 16].iter_mut().enumerate() {
                *digit = HEX[(h >> (60 - 4 * i)) as usize & 15];
            }
        }
        DigestText(text)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("a digest's text is ASCII")
    }

    /// The digest as the documents hold it.
    pub fn digest(&self) -> Digest {
        Digest(self.as_str().to_owned())
    }
}

impl std::fmt::Debug for DigestText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// MurmurHash3's 64-bit finalizer (a bijection).
#[inline(always)]
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(FMIX_1);
    x ^= x >> 33;
    x = x.wrapping_mul(FMIX_2);
    x ^ (x >> 33)
}

/// The digest's two 64-bit halves from the lane sums and the length in bytes.
pub fn finish(lanes: Lanes, len: u64) -> [u64; 2] {
    let a = fmix64(lanes.a ^ len.wrapping_add(1).wrapping_mul(KEY_LEN));
    let b = fmix64(lanes.b.wrapping_add(len) ^ KEY_B);
    let h1 = a.wrapping_add(b);
    [h1, b ^ fmix64(h1)]
}

/// The `gc128` digest of bytes fed in pieces: a view's elements, run by run.
#[derive(Clone, Debug)]
pub struct Gc128 {
    lanes: Lanes,
    /// Bytes taken so far.
    len: u64,
    /// The word being filled (its first `len % 8` bytes are set).
    pending: u64,
    /// Keys of the next word to add.
    k: u64,
    q: u64,
}

impl Default for Gc128 {
    fn default() -> Self {
        Gc128::new()
    }
}

impl Gc128 {
    /// A digest of no bytes yet (word 0's keys are `1 · KEY_A` and `1 · KEY_B`).
    pub fn new() -> Gc128 {
        Gc128 {
            lanes: Lanes::default(),
            len: 0,
            pending: 0,
            k: KEY_A,
            q: KEY_B,
        }
    }

    fn push_word(&mut self, w: u64) {
        self.lanes.add_word(w, self.k, self.q);
        self.k = self.k.wrapping_add(KEY_A);
        self.q = self.q.wrapping_add(KEY_B);
    }

    /// Appends `bytes` to the input.
    pub fn update(&mut self, mut bytes: &[u8]) {
        let mut fill = (self.len % 8) as usize;
        self.len += bytes.len() as u64;
        if fill != 0 {
            let take = bytes.len().min(8 - fill);
            for &byte in &bytes[..take] {
                self.pending |= u64::from(byte) << (8 * fill);
                fill += 1;
            }
            bytes = &bytes[take..];
            if fill < 8 {
                return;
            }
            let w = std::mem::take(&mut self.pending);
            self.push_word(w);
        }
        let mut words = bytes.chunks_exact(8);
        for chunk in &mut words {
            let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            self.push_word(w);
        }
        for (n, &byte) in words.remainder().iter().enumerate() {
            self.pending |= u64::from(byte) << (8 * n);
        }
    }

    /// The digest of everything appended.
    pub fn finish(self) -> Digest {
        self.text().digest()
    }

    /// [`Gc128::finish`] as text, without allocating.
    pub fn text(mut self) -> DigestText {
        if self.len % 8 != 0 {
            let w = std::mem::take(&mut self.pending);
            self.push_word(w);
        }
        self.lanes.text(self.len)
    }
}

/// The `gc128` digest of `bytes`.
pub fn gc128(bytes: &[u8]) -> Digest {
    let mut h = Gc128::new();
    h.update(bytes);
    h.finish()
}

/// Why a view cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    #[error("the view has {shape} sizes but {stride} strides")]
    Rank { shape: usize, stride: usize },
    #[error("the view's element size is 0")]
    NoItemsize,
    #[error("the view has a negative stride ({0})")]
    NegativeStride(i64),
    #[error("the view's size overflows 64 bits")]
    Overflow,
    #[error("the view spans {span} bytes but {available} are given")]
    Span { span: u64, available: u64 },
}

/// A strided view of memory, as a tensor has it: sizes, strides in elements, element size.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub shape: &'a [u64],
    pub stride: &'a [i64],
    pub itemsize: u32,
}

/// A view's layout with size-1 dimensions dropped and adjacent dimensions merged where one
/// steps exactly over the other: `(size, stride in bytes)` per dimension, outermost first.
/// A contiguous view has at most one dimension, of stride `itemsize`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub itemsize: u32,
    pub dims: Vec<(u64, u64)>,
}

impl Layout {
    /// The layout of `view`, checked: strides not negative, sizes that fit in 64 bits.
    pub fn of(view: View<'_>) -> Result<Layout, ViewError> {
        if view.shape.len() != view.stride.len() {
            return Err(ViewError::Rank {
                shape: view.shape.len(),
                stride: view.stride.len(),
            });
        }
        if view.itemsize == 0 {
            return Err(ViewError::NoItemsize);
        }
        let isz = u64::from(view.itemsize);
        let mut numel: u64 = 1;
        for &n in view.shape {
            numel = numel.checked_mul(n).ok_or(ViewError::Overflow)?;
        }
        numel.checked_mul(isz).ok_or(ViewError::Overflow)?;
        let mut dims: Vec<(u64, u64)> = Vec::with_capacity(view.shape.len());
        if numel == 0 {
            return Ok(Layout {
                itemsize: view.itemsize,
                dims: vec![(0, isz)],
            });
        }
        for (&n, &s) in view.shape.iter().zip(view.stride) {
            if s < 0 {
                return Err(ViewError::NegativeStride(s));
            }
            if n == 1 {
                continue;
            }
            let bytes = (s as u64).checked_mul(isz).ok_or(ViewError::Overflow)?;
            match dims.last_mut() {
                Some(last) if last.1 == bytes.checked_mul(n).ok_or(ViewError::Overflow)? => {
                    *last = (last.0 * n, bytes);
                }
                _ => dims.push((n, bytes)),
            }
        }
        let layout = Layout {
            itemsize: view.itemsize,
            dims,
        };
        layout.span()?;
        Ok(layout)
    }

    /// Elements in the view.
    pub fn numel(&self) -> u64 {
        self.dims.iter().map(|d| d.0).product()
    }

    /// Bytes of the row-major element stream (the digest's input length).
    pub fn nbytes(&self) -> u64 {
        self.numel() * u64::from(self.itemsize)
    }

    /// Whether the elements lie back to back in row-major order.
    pub fn is_contiguous(&self) -> bool {
        match self.dims.as_slice() {
            [] => true,
            [(_, s)] => *s == u64::from(self.itemsize),
            _ => false,
        }
    }

    /// Bytes from the first element to the end of the last (0 for an empty view).
    pub fn span(&self) -> Result<u64, ViewError> {
        if self.numel() == 0 {
            return Ok(0);
        }
        let mut last: u64 = 0;
        for &(n, s) in &self.dims {
            let step = (n - 1).checked_mul(s).ok_or(ViewError::Overflow)?;
            last = last.checked_add(step).ok_or(ViewError::Overflow)?;
        }
        last.checked_add(u64::from(self.itemsize))
            .ok_or(ViewError::Overflow)
    }
}

/// A view to digest where it lies: the address of its first element, the bytes of its
/// row-major element stream, and its merged layout where it is not contiguous. Most views
/// are contiguous and carry no layout, so that reading many small tensors allocates nothing
/// per view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub addr: u64,
    /// Bytes of the row-major element stream (the digest's input length).
    pub nbytes: u64,
    /// `None` for a contiguous view; else its layout (never a contiguous one).
    pub strided: Option<Layout>,
}

impl Located {
    /// `nbytes` bytes back to back from `addr`.
    pub fn contiguous(addr: u64, nbytes: u64) -> Located {
        Located {
            addr,
            nbytes,
            strided: None,
        }
    }

    /// `view` with its first element at `addr`, checked as [`Layout::of`] checks it: a
    /// row-major view (size-1 dimensions aside) is told without building its layout.
    pub fn of(addr: u64, view: View<'_>) -> Result<Located, ViewError> {
        if let Some(nbytes) = contiguous_bytes(view) {
            return Ok(Located::contiguous(addr, nbytes));
        }
        let layout = Layout::of(view)?;
        let nbytes = layout.nbytes();
        let strided = (!layout.is_contiguous()).then_some(layout);
        Ok(Located {
            addr,
            nbytes,
            strided,
        })
    }

    /// Bytes from the first element to the end of the last (0 for an empty view).
    pub fn span(&self) -> Result<u64, ViewError> {
        match &self.strided {
            None => Ok(self.nbytes),
            Some(layout) => layout.span(),
        }
    }
}

/// The bytes of `view` where it is a valid row-major view (or empty) whose every stride is
/// not negative: then [`Layout::of`] would accept it and merge it into one run. `None`
/// for anything else, which [`Layout::of`] then checks or lays out.
fn contiguous_bytes(view: View<'_>) -> Option<u64> {
    if view.shape.len() != view.stride.len() || view.itemsize == 0 {
        return None;
    }
    // The element count outermost first, as `Layout::of` counts it: innermost first, a
    // trailing 0 would hide an overflow of the sizes before it, which it refuses.
    let mut numel: u64 = 1;
    for &n in view.shape {
        numel = numel.checked_mul(n)?;
    }
    numel.checked_mul(u64::from(view.itemsize))?;
    let mut inner: u64 = 1;
    let mut row_major = true;
    for (&n, &s) in view.shape.iter().zip(view.stride).rev() {
        if s < 0 {
            return None;
        }
        if n != 1 && s as u64 != inner {
            row_major = false;
        }
        // Divides `numel` where that is not 0; an empty view is taken whatever this is.
        inner = inner.saturating_mul(n);
    }
    let nbytes = numel * u64::from(view.itemsize);
    (row_major || numel == 0).then_some(nbytes)
}

/// The `gc128` digest of a located view's elements, as text, read from `memory`, which
/// starts at its first element and must hold its whole span.
pub fn gc128_located(memory: &[u8], view: &Located) -> Result<DigestText, ViewError> {
    match &view.strided {
        Some(layout) => Ok(layout_hasher(memory, layout)?.text()),
        None if view.nbytes > memory.len() as u64 => Err(ViewError::Span {
            span: view.nbytes,
            available: memory.len() as u64,
        }),
        None => {
            let mut h = Gc128::new();
            h.update(&memory[..view.nbytes as usize]);
            Ok(h.text())
        }
    }
}

/// The `gc128` digest of `view`'s elements in row-major order, read from `memory`, which
/// starts at the view's first element and must hold its whole span.
pub fn gc128_view(memory: &[u8], view: View<'_>) -> Result<Digest, ViewError> {
    let layout = Layout::of(view)?;
    gc128_layout(memory, &layout)
}

/// [`gc128_view`] of a checked layout.
pub fn gc128_layout(memory: &[u8], layout: &Layout) -> Result<Digest, ViewError> {
    Ok(layout_hasher(memory, layout)?.finish())
}

/// The digest of a checked layout's elements, to be finished.
fn layout_hasher(memory: &[u8], layout: &Layout) -> Result<Gc128, ViewError> {
    let span = layout.span()?;
    if span > memory.len() as u64 {
        return Err(ViewError::Span {
            span,
            available: memory.len() as u64,
        });
    }
    let mut h = Gc128::new();
    if layout.is_contiguous() {
        h.update(&memory[..span as usize]);
        return Ok(h);
    }
    let isz = layout.itemsize as usize;
    let (inner, outer) = layout
        .dims
        .split_last()
        .expect("a strided view has dimensions");
    // An odometer over the outer dimensions, row-major; each step hashes one inner run.
    let mut index = vec![0u64; outer.len()];
    loop {
        let base: u64 = index.iter().zip(outer).map(|(i, d)| i * d.1).sum();
        let base = base as usize;
        if inner.1 as usize == isz {
            h.update(&memory[base..base + inner.0 as usize * isz]);
        } else {
            for e in 0..inner.0 as usize {
                let at = base + e * inner.1 as usize;
                h.update(&memory[at..at + isz]);
            }
        }
        let mut d = outer.len();
        loop {
            if d == 0 {
                return Ok(h);
            }
            d -= 1;
            index[d] += 1;
            if index[d] < outer[d].0 {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests;
