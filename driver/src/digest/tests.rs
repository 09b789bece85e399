//! Tests of the kernels' host side: packing, tuning, the source's constants, and (where
//! NVRTC is found) that the source compiles.

use super::*;

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn packing_follows_the_kernels_structs() {
    let chunk = Tuning::default().chunk_bytes();
    let views = [
        DigestView {
            addr: 0x1000,
            nbytes: chunk + 1,
            strided: None,
        },
        DigestView {
            addr: 0x9000,
            nbytes: 0,
            strided: None,
        },
        DigestView {
            addr: 0x2000,
            nbytes: 48,
            strided: Some((4, vec![(4, 16), (3, 4)])),
        },
        DigestView {
            addr: 0x3000,
            nbytes: 8,
            strided: None,
        },
    ];
    let p = Packed::of(&views, chunk).unwrap();
    let [c, s] = &p.lists;
    // Contiguous: views 0 and 3 (view 1 is empty), view 3's chunk after view 0's two.
    assert_eq!(
        (c.count, c.total_chunks, c.segs.len()),
        (2, 3, 2 * SEG_BYTES)
    );
    let second = &c.segs[SEG_BYTES..];
    assert_eq!(
        (u64_at(second, 0), u64_at(second, 8), u64_at(second, 16)),
        (0x3000, 8, 2)
    );
    assert_eq!((u32_at(second, 24), u32_at(second, 28)), (3, CONTIGUOUS));
    // Strided: view 2, its own chunks from 0, layout 0.
    assert_eq!((s.count, s.total_chunks), (1, 1));
    assert_eq!((u64_at(&s.segs, 0), u64_at(&s.segs, 16)), (0x2000, 0));
    assert_eq!((u32_at(&s.segs, 24), u32_at(&s.segs, 28)), (2, 0));
    let l = &p.layouts;
    assert_eq!(l.len(), LAYOUT_BYTES);
    assert_eq!((u32_at(l, 0), u32_at(l, 4)), (2, 4));
    assert_eq!((u64_at(l, 8), u64_at(l, 16)), (4, 3));
    let strides = 8 + 8 * MAX_DIMS;
    assert_eq!((u64_at(l, strides), u64_at(l, strides + 8)), (16, 4));
}

#[test]
fn the_source_and_the_constants_here_agree() {
    for (name, value) in [
        ("BLOCK", BLOCK.to_string()),
        ("MAX_DIMS", MAX_DIMS.to_string()),
        ("CONTIGUOUS", format!("{CONTIGUOUS:#x}u")),
        ("CHUNK_WORDS", "(2 * BLOCK * UNROLL)".to_string()),
    ] {
        assert!(
            SOURCE.contains(&format!("#define {name} {value}\n")),
            "{name} is {value} here"
        );
    }
    // 8 bytes a word, 2 words a load, UNROLL loads a thread.
    let t = Tuning {
        unroll: 3,
        min_blocks: 0,
    };
    assert_eq!(t.chunk_bytes(), 8 * 2 * u64::from(BLOCK) * 3);
    for name in KERNELS {
        assert!(SOURCE.contains(&format!(
            "\n{name}(const Seg *__restrict__ segs, u32 nsegs,"
        )));
    }
}

#[test]
fn tuning_is_parsed_and_checked() {
    assert_eq!(Tuning::parse("").unwrap(), Tuning::default());
    assert_eq!(
        Tuning::parse(" unroll=8, min_blocks = 3 ").unwrap(),
        Tuning {
            unroll: 8,
            min_blocks: 3
        }
    );
    assert_eq!(Tuning::parse("min_blocks=2").unwrap().unroll, 4);
    for (bad, says) in [
        ("unroll", "not key=value"),
        ("unroll=0", "out of range"),
        ("unroll=17", "out of range"),
        ("min_blocks=9", "out of range"),
        ("unroll=x", "not a whole number"),
        ("threads=512", "unknown key"),
    ] {
        let e = Tuning::parse(bad).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn a_layout_the_kernel_cannot_take_is_an_error() {
    let chunk = Tuning::default().chunk_bytes();
    let deep = DigestView {
        addr: 0,
        nbytes: 8,
        strided: Some((1, vec![(2, 1); MAX_DIMS + 1])),
    };
    assert!(matches!(
        Packed::of(&[deep], chunk),
        Err(DigestError::TooManyDims { index: 0, dims: 13 })
    ));
    let empty_dim = DigestView {
        addr: 0,
        nbytes: 8,
        strided: Some((1, vec![(0, 1), (8, 1)])),
    };
    assert!(matches!(
        Packed::of(&[empty_dim], chunk),
        Err(DigestError::BadLayout { index: 0 })
    ));
}

#[test]
fn the_kernels_compile_for_hopper_with_any_tuning_where_nvrtc_is_found() {
    let Some(nvrtc) = crate::nvrtc::for_tests("the_kernels_compile_for_hopper_with_any_tuning")
    else {
        return;
    };
    let constants = Constants {
        key_a: 3,
        key_b: 5,
        fmix_1: 7,
        fmix_2: 9,
    };
    for tuning in [
        Tuning::default(),
        Tuning {
            unroll: 1,
            min_blocks: 8,
        },
        Tuning {
            unroll: 16,
            min_blocks: 0,
        },
    ] {
        let cubin = compile(&nvrtc, "sm_90", &constants, tuning).unwrap();
        // An ELF image.
        assert_eq!(
            &cubin[..4],
            b"\x7fELF",
            "NVRTC {:?}, {tuning:?}",
            nvrtc.version()
        );
    }
}

#[test]
fn the_kernels_do_not_compile_without_the_constants() {
    let Some(nvrtc) = crate::nvrtc::for_tests("the_kernels_do_not_compile_without_the_constants")
    else {
        return;
    };
    let e = nvrtc
        .compile_cubin(SOURCE, "gc128_digest.cu", "sm_90", &[])
        .unwrap_err()
        .to_string();
    // The directive's error, not the same words as a `#warning` beside other errors.
    assert!(
        e.contains("#error directive: \"compile with the digest's constants"),
        "{e}"
    );
}
