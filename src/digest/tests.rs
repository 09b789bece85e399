//! Tests of `gc128`: against a reference written from the definition, fixed vectors, the
//! proven detections, random multi-word changes, and strided views.

use super::*;

/// A small deterministic generator (SplitMix64), so that every failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The definition in the module's docs, written out word by word with 128-bit arithmetic
/// and fresh key products (the implementation steps keys along and splits words).
fn reference(bytes: &[u8]) -> String {
    let (mut a, mut b) = (0u128, 0u128);
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let j = i as u128 + 1;
        let k = (j * u128::from(KEY_A)) % (1 << 64);
        let q = (j * u128::from(KEY_B)) % (1 << 64);
        let lo = u128::from(w) % (1 << 32);
        let hi = u128::from(w) >> 32;
        let x = (lo + k % (1 << 32)) % (1 << 32);
        let y = (hi + (k >> 32)) % (1 << 32);
        a = (a + x * y) % (1 << 64);
        let mut z = u128::from(w) ^ q;
        for m in [FMIX_1, FMIX_2] {
            z ^= z >> 33;
            z = (z * u128::from(m)) % (1 << 64);
        }
        z ^= z >> 33;
        b = (b + z) % (1 << 64);
    }
    let lanes = Lanes {
        a: a as u64,
        b: b as u64,
    };
    let [h1, h2] = finish(lanes, bytes.len() as u64);
    format!("gc128:{h1:016x}{h2:016x}")
}

fn d(bytes: &[u8]) -> String {
    gc128(bytes).0
}

#[test]
fn matches_the_definition_for_every_length_up_to_100() {
    let mut rng = Rng(1);
    for n in 0..=100 {
        let bytes = rng.bytes(n);
        assert_eq!(d(&bytes), reference(&bytes), "{n} bytes");
    }
}

#[test]
fn fixed_vectors() {
    // Frozen outputs, also computed by an independent Python transcription of the
    // definition (tests/python/test_digest.py has the same vectors): a change here changes
    // every digest ever written, and a new algorithm name is then due.
    let counting: Vec<u8> = (0..=255u8).collect();
    let cases: [(&[u8], &str); 5] = [
        (b"", "gc128:f507e3d23ed59d2b2adfdbd3f5af067e"),
        (b"a", "gc128:d8176c6070bf755d306ba4f96a5dbe2e"),
        (b"graphcheck", "gc128:bd6a24c16fd5111765fc215f776e4c55"),
        (&[0u8; 64], "gc128:44c2a7d8c4093d581190d33add6dbe58"),
        (&counting, "gc128:8e313adb15acb3327d03c6e7111bbbb5"),
    ];
    for (bytes, want) in cases {
        assert_eq!(d(bytes), want, "{} bytes", bytes.len());
        assert_eq!(reference(bytes), want);
    }
}

#[test]
fn pieces_of_any_size_give_the_digest_of_the_whole() {
    let mut rng = Rng(2);
    for n in [0, 1, 7, 8, 9, 63, 64, 65, 1000] {
        let bytes = rng.bytes(n);
        let whole = d(&bytes);
        for _ in 0..20 {
            let mut h = Gc128::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let take = 1 + rng.below(rest.len().min(20));
                h.update(&rest[..take]);
                rest = &rest[take..];
            }
            assert_eq!(h.finish().0, whole);
        }
    }
    // Regression: a derived `Default` started with zero keys.
    let mut h = Gc128::default();
    h.update(b"graphcheck");
    assert_eq!(h.finish(), gc128(b"graphcheck"));
}

#[test]
fn lane_sums_of_parts_add_up_in_any_order() {
    // What the GPU relies on: blocks sum parts and add them atomically in any order.
    let mut rng = Rng(3);
    let words: Vec<u64> = (0..1000).map(|_| rng.next()).collect();
    let whole = Lanes::of_words(0, words.iter().copied());
    let mut parts = vec![(0, 137), (137, 500), (500, 501), (501, 1000)];
    parts.reverse();
    let mut sum = Lanes::default();
    for (from, to) in parts {
        sum.add(Lanes::of_words(
            from as u64,
            words[from..to].iter().copied(),
        ));
    }
    assert_eq!(sum, whole);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(whole.finish(8000).0, d(&bytes));
}

/// Lane B's term undone step by step: that the inverse exists is the proof that a change
/// inside one word always changes lane B.
fn lane_b(i: u64, w: u64) -> u64 {
    Lanes::of_words(i, [w]).b
}

fn inverse_mul(m: u64) -> u64 {
    // Newton's iteration for the inverse of an odd number modulo 2^64.
    let mut x = m;
    for _ in 0..6 {
        x = x.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(x)));
    }
    x
}

/// The inverse of `x ^= x >> 33` (two steps recover the 64 bits).
fn unshift(y: u64) -> u64 {
    y ^ (y >> 33)
}

fn lane_b_inverse(i: u64, t: u64) -> u64 {
    let mut x = unshift(t);
    x = unshift(x.wrapping_mul(inverse_mul(FMIX_2)));
    x = unshift(x.wrapping_mul(inverse_mul(FMIX_1)));
    x ^ (i + 1).wrapping_mul(KEY_B)
}

#[test]
fn lane_b_is_a_bijection_of_the_word() {
    let mut rng = Rng(4);
    for _ in 0..100_000 {
        let (i, w) = (rng.next() >> 20, rng.next());
        assert_eq!(lane_b_inverse(i, lane_b(i, w)), w);
    }
}

#[test]
fn the_same_bit_flipped_in_two_words_changes_lane_b() {
    // Regression: lane B's first design (two 32-bit multiply-xor steps) cancelled for bit 32
    // flipped in two words in about one case of seven.
    let mut rng = Rng(11);
    for bit in 0..64 {
        for _ in 0..2000 {
            let (i, j) = (rng.next() % 100_000, 100_000 + rng.next() % 100_000);
            let (wi, wj) = (rng.next(), rng.next());
            let before = lane_b(i, wi).wrapping_add(lane_b(j, wj));
            let after = lane_b(i, wi ^ (1 << bit)).wrapping_add(lane_b(j, wj ^ (1 << bit)));
            assert_ne!(before, after, "bit {bit}, words {i} and {j}");
        }
    }
}

#[test]
fn every_single_bit_flip_changes_the_digest() {
    let mut rng = Rng(5);
    for n in [1, 5, 8, 13, 64, 77] {
        let bytes = rng.bytes(n);
        let base = d(&bytes);
        for bit in 0..8 * n {
            let mut x = bytes.clone();
            x[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(d(&x), base, "{n} bytes, bit {bit}");
        }
    }
}

#[test]
fn a_zeroed_scalar_changes_the_digest() {
    let mut rng = Rng(6);
    for itemsize in [1usize, 2, 4, 8] {
        for count in [1usize, 3, 100] {
            let bytes: Vec<u8> = (0..itemsize * count)
                .map(|_| rng.next() as u8 | 1)
                .collect();
            let base = d(&bytes);
            for e in 0..count {
                let mut x = bytes.clone();
                x[e * itemsize..(e + 1) * itemsize].fill(0);
                assert_ne!(d(&x), base, "itemsize {itemsize}, element {e} of {count}");
            }
        }
    }
}

#[test]
fn swapped_elements_change_the_digest() {
    // Inside one word this is proven; across words it is the probabilistic case.
    let mut rng = Rng(7);
    let mut tried = 0;
    for itemsize in [1usize, 2, 4, 8, 16] {
        for _ in 0..12_000 {
            let count = 2 + rng.below(300);
            let bytes = rng.bytes(itemsize * count);
            let (p, q) = (rng.below(count), rng.below(count));
            let (ep, eq) = (
                &bytes[p * itemsize..(p + 1) * itemsize],
                &bytes[q * itemsize..(q + 1) * itemsize],
            );
            if ep == eq {
                continue;
            }
            let mut x = bytes.clone();
            for k in 0..itemsize {
                x.swap(p * itemsize + k, q * itemsize + k);
            }
            assert_ne!(d(&x), d(&bytes), "itemsize {itemsize}, swap {p} and {q}");
            tried += 1;
        }
    }
    assert!(tried > 55_000, "{tried}");
}

#[test]
fn random_multi_word_changes_change_the_digest() {
    let mut rng = Rng(8);
    for _ in 0..20_000 {
        let n = 16 + rng.below(500);
        let bytes = rng.bytes(n);
        let mut x = bytes.clone();
        match rng.below(3) {
            // The same bit flipped in two words (the pattern a sum of linear terms misses).
            0 => {
                let bit = rng.below(8);
                let (i, j) = (rng.below(n), rng.below(n));
                if i / 8 == j / 8 {
                    continue;
                }
                x[i] ^= 1 << bit;
                x[j] ^= 1 << bit;
            }
            // A run of bytes zeroed.
            1 => {
                let from = rng.below(n);
                let to = (from + 1 + rng.below(64)).min(n);
                x[from..to].fill(0);
            }
            // Two words exchanged whole.
            _ => {
                let (i, j) = (rng.below(n / 8), rng.below(n / 8));
                for k in 0..8 {
                    x.swap(8 * i + k, 8 * j + k);
                }
            }
        }
        if x != bytes {
            assert_ne!(d(&x), d(&bytes));
        }
    }
}

#[test]
fn the_length_enters_the_digest() {
    let mut rng = Rng(9);
    for n in [0, 1, 8, 13] {
        let bytes = rng.bytes(n);
        let mut seen = std::collections::BTreeSet::new();
        for extra in 0..=24 {
            let mut x = bytes.clone();
            x.resize(n + extra, 0);
            assert!(seen.insert(d(&x)), "{n} bytes + {extra} zeros");
        }
    }
}

// -- views ------------------------------------------------------------------------------

/// The row-major elements of a view, gathered one by one: what the digest must equal.
fn gathered(memory: &[u8], shape: &[u64], stride: &[i64], itemsize: usize) -> Vec<u8> {
    let numel: u64 = shape.iter().product();
    let mut out = Vec::new();
    for e in 0..numel {
        let mut rest = e;
        let mut at = 0usize;
        for (&n, &s) in shape.iter().zip(stride).rev() {
            at += (rest % n) as usize * s as usize * itemsize;
            rest /= n;
        }
        out.extend_from_slice(&memory[at..at + itemsize]);
    }
    out
}

#[test]
fn a_strided_view_digests_its_row_major_elements() {
    let mut rng = Rng(10);
    let memory = rng.bytes(8192);
    type Case = (&'static [u64], &'static [i64], u32);
    let cases: &[Case] = &[
        (&[16, 16], &[16, 1], 4),      // contiguous
        (&[16, 16], &[1, 16], 4),      // transposed
        (&[16, 3], &[4, 1], 4),        // rows of 12 bytes out of 16
        (&[5, 7, 3], &[1, 5, 35], 2),  // permuted
        (&[4, 6], &[0, 1], 8),         // expanded (stride 0)
        (&[3, 1, 5], &[10, 99, 2], 1), // a size-1 dimension with any stride
        (&[2, 2, 2, 2, 2], &[1, 2, 4, 8, 16], 16),
        (&[], &[], 8), // a scalar
        (&[0, 4], &[4, 1], 4),
        (&[7], &[3], 2),
    ];
    for &(shape, stride, itemsize) in cases {
        for offset in [0usize, 1, 2, 6] {
            let view = View {
                shape,
                stride,
                itemsize,
            };
            let want = gc128(&gathered(
                &memory[offset..],
                shape,
                stride,
                itemsize as usize,
            ));
            assert_eq!(
                gc128_view(&memory[offset..], view).unwrap(),
                want,
                "{shape:?} {stride:?} itemsize {itemsize} offset {offset}"
            );
        }
    }
}

#[test]
fn layouts_merge_what_steps_over_each_other() {
    let l = |shape: &[u64], stride: &[i64], itemsize| {
        Layout::of(View {
            shape,
            stride,
            itemsize,
        })
        .unwrap()
    };
    let c = l(&[4, 8, 2], &[16, 2, 1], 2);
    assert_eq!(c.dims, vec![(64, 2)]);
    assert!(c.is_contiguous());
    assert_eq!((c.nbytes(), c.span().unwrap()), (128, 128));
    let t = l(&[4, 8], &[1, 4], 4);
    assert_eq!(t.dims, vec![(4, 4), (8, 16)]);
    assert!(!t.is_contiguous());
    let s = l(&[4, 3], &[4, 1], 4);
    assert_eq!(
        (s.dims.clone(), s.span().unwrap()),
        (vec![(4, 16), (3, 4)], 60)
    );
    assert!(l(&[], &[], 2).is_contiguous());
    assert_eq!(l(&[3, 0], &[0, 1], 2).nbytes(), 0);
}

#[test]
fn a_bad_view_is_an_error() {
    let memory = [0u8; 64];
    let err = |shape: &[u64], stride: &[i64], itemsize| {
        gc128_view(
            &memory,
            View {
                shape,
                stride,
                itemsize,
            },
        )
        .unwrap_err()
    };
    assert_eq!(
        err(&[2], &[1, 1], 4),
        ViewError::Rank {
            shape: 1,
            stride: 2
        }
    );
    assert_eq!(err(&[2], &[-1], 4), ViewError::NegativeStride(-1));
    assert_eq!(err(&[2], &[1], 0), ViewError::NoItemsize);
    assert_eq!(err(&[u64::MAX, 4], &[1, 1], 4), ViewError::Overflow);
    assert_eq!(
        err(&[17], &[1], 4),
        ViewError::Span {
            span: 68,
            available: 64
        }
    );
}

/// What `Layout::of` makes of a view, as a located view: its contiguous runs without a
/// layout. `Located::of` must agree with it on every view, including its errors.
fn located_by_layout(addr: u64, view: View<'_>) -> Result<Located, ViewError> {
    let layout = Layout::of(view)?;
    Ok(Located {
        addr,
        nbytes: layout.nbytes(),
        strided: (!layout.is_contiguous()).then_some(layout),
    })
}

#[test]
fn a_located_view_is_its_layout_without_building_a_contiguous_one() {
    type Case = (&'static [u64], &'static [i64], u32);
    let cases: &[Case] = &[
        (&[16, 16], &[16, 1], 4),
        (&[1, 3, 1], &[16, 1, 1], 4), // size-1 dimensions with strides torch ignores
        (&[3, 1, 5], &[5, 99, 1], 1),
        (&[1], &[-1], 4), // a negative stride of a size-1 dimension: Layout::of refuses it
        (&[0], &[-1], 4), // ... but not in an empty view
        (&[0, 4], &[1, 1], 4),
        (&[], &[], 8),
        (&[2], &[1, 1], 4),
        (&[2], &[1], 0),
        (&[u64::MAX, 4], &[4, 1], 4),
        (&[u64::MAX / 2, 4], &[4, 1], 4), // the element count fits, its bytes do not
        (&[0, u64::MAX, u64::MAX], &[1, 1, 1], 1),
        (&[u64::MAX, u64::MAX, 0], &[0, 0, 1], 1),
        (&[16, 16], &[1, 16], 4),
        (&[4, 6], &[0, 1], 8),
    ];
    for &(shape, stride, itemsize) in cases {
        let view = View {
            shape,
            stride,
            itemsize,
        };
        assert_eq!(
            Located::of(0x1000, view),
            located_by_layout(0x1000, view),
            "{shape:?} {stride:?} {itemsize}"
        );
    }
    // Random small views, most of them contiguous or nearly so.
    let mut rng = Rng(11);
    for _ in 0..20_000 {
        let rank = rng.below(5);
        let shape: Vec<u64> = (0..rank).map(|_| rng.below(4) as u64).collect();
        let mut stride = vec![0i64; rank];
        let mut step = 1i64;
        for d in (0..rank).rev() {
            stride[d] = match rng.below(6) {
                0 => rng.below(9) as i64 - 1,
                _ => step,
            };
            step *= shape[d].max(1) as i64;
        }
        let itemsize = [1, 2, 4, 8, 16][rng.below(5)];
        let view = View {
            shape: &shape,
            stride: &stride,
            itemsize,
        };
        let located = Located::of(7, view);
        assert_eq!(located, located_by_layout(7, view), "{shape:?} {stride:?}");
        if let Ok(l) = located {
            let memory = rng.bytes(l.span().unwrap() as usize);
            assert_eq!(
                gc128_located(&memory, &l).map(|t| t.digest()),
                gc128_view(&memory, view),
                "{shape:?} {stride:?}"
            );
        }
    }
}
