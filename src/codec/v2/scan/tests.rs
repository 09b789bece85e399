//! The fast reader against serde: whatever it reads, serde reads the same; whatever serde
//! refuses, it declines; and the documents graphcheck writes take the fast path.

use std::path::Path;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{fast_manifest, touch_column};
use crate::codec::v2::{ManifestV2, TouchList};
use crate::model::format::Manifest;

/// serde's reading of a column, as (touches, positions of addresses) per node.
fn by_serde(text: &[u8]) -> Option<Vec<(Vec<crate::model::format::Touch>, Vec<u32>)>> {
    let lists: Vec<TouchList> = serde_json::from_slice(text).ok()?;
    Some(lists.into_iter().map(|l| (l.touches, l.absolute)).collect())
}

fn by_scan(text: &[u8]) -> Option<Vec<(Vec<crate::model::format::Touch>, Vec<u32>)>> {
    let lists = touch_column(text)?;
    Some(lists.into_iter().map(|l| (l.touches, l.absolute)).collect())
}

const SAMPLE: &str = r#"[[[0,0,815104,null,26010],[1,0,0,12664,3288]],[],[[0,328,"0x7f8000000000",null,null],[4294967295,8,18446744073709551615,0,4294967295]]]"#;

#[test]
fn reads_what_serde_reads() {
    let spaced = " [ [ [ 0 , 0 , 815104 , null , 26010 ] ,\n\t[1,0,0,12664,3288]\r\n] , [ ] ,[[0,328,\"0x7F8000000000\",null,null],[4294967295,8,18446744073709551615,0,4294967295]] ] ";
    for text in [SAMPLE, spaced, "[]", "[[]]", " [ ] "] {
        let scan = by_scan(text.as_bytes());
        assert!(scan.is_some(), "declined {text}");
        assert_eq!(scan, by_serde(text.as_bytes()), "{text}");
    }
    let lists = touch_column(SAMPLE.as_bytes()).unwrap();
    assert_eq!(lists[2].absolute, [0]);
    assert_eq!(lists[2].touches[0].addr.0, 0x7f80_0000_0000);
}

#[test]
fn declines_what_it_does_not_take() {
    for text in [
        // Refused by serde too.
        "[[[00,0,1,null,null]]]",
        "[[[0,0,1.5,null,null]]]",
        "[[[0,0,1e3,null,null]]]",
        "[[[4294967296,0,1,null,null]]]",
        "[[[0,0,18446744073709551616,null,null]]]",
        "[[[0,0,1,nul,null]]]",
        "[[[0,0,1,nullx,null]]]",
        "[[[0,0,1,null]]]",
        "[[[0,0,1,null,null,7]]]",
        "[[[0,0,\"0x\",null,null]]]",
        "[[[0,0,\"+0x1\",null,null]]]",
        "[[[0,0,1,null,null]],]",
        "[[[0,0,1,null,null]]] x",
        "[[[0,0,1,null,null]]",
        // Valid JSON that serde reads, which the scanner leaves to it.
        "[[[0,0,\"0\\u0078ff\",null,null]]]",
        "[[[0,-0,1,null,null]]]",
    ] {
        assert_eq!(by_scan(text.as_bytes()), None, "{text}");
    }
    assert!(by_serde(b"[[[0,0,\"0\\u0078ff\",null,null]]]").is_some());
}

/// Random damage to a column: wherever the scanner still reads it, serde reads the same.
#[test]
fn never_reads_what_serde_does_not() {
    let mut rng = SmallRng::seed_from_u64(14);
    let alphabet = b"[],0123456789 \n\"xnul.e-\\af";
    let mut read = 0;
    for _ in 0..20_000 {
        let mut text = SAMPLE.as_bytes().to_vec();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..text.len());
            match rng.random_range(0..3) {
                0 => text[at] = alphabet[rng.random_range(0..alphabet.len())],
                1 => {
                    text.remove(at);
                }
                _ => text.insert(at, alphabet[rng.random_range(0..alphabet.len())]),
            }
        }
        if let Some(scan) = by_scan(&text) {
            read += 1;
            assert_eq!(
                Some(scan),
                by_serde(&text),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
    }
    // The damage leaves some columns readable (a digit changed, a space added).
    assert!(read > 1000, "only {read} read");
}

fn slow(bytes: &[u8]) -> Manifest {
    let m: ManifestV2 = serde_json::from_slice(bytes).unwrap();
    m.into_model().unwrap()
}

/// Every format 2 manifest among the fixtures takes the fast path, to the same model.
#[test]
fn the_fixtures_take_the_fast_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut seen = 0;
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
                continue;
            };
            if v["format_version"] != 2 || v["kind"] != "manifest" {
                continue;
            }
            let Some(fast) = fast_manifest(&bytes, 2) else {
                // A fixture the reference checks refuse may still parse; only a valid one
                // has to take the fast path.
                if crate::codec::load::parse_manifest(&bytes, &path).is_ok() {
                    panic!("{} declined", path.display());
                }
                continue;
            };
            assert_eq!(fast, slow(&bytes), "{}", path.display());
            seen += 1;
        }
    }
    assert!(
        seen >= 10,
        "only {seen} format 2 manifests among the fixtures"
    );
}

/// Random damage to a whole manifest: wherever the fast reader still reads it, the usual
/// parse reads the same model (and where that parse refuses it, the fast reader did not
/// read it).
#[test]
fn a_damaged_manifest_reads_the_same_either_way() {
    let m = crate::testkit::manifest().in_version(2);
    let text = serde_json::to_vec(&m).unwrap();
    // The damage goes where the touches are, most of the time.
    let touches = text.windows(10).position(|w| w == b"\"touches\":").unwrap();
    let mut rng = SmallRng::seed_from_u64(2);
    let alphabet = b"[],0123456789 \"xnul";
    let (mut fast, mut tried) = (0, 0);
    for _ in 0..5_000 {
        let mut t = text.clone();
        let at = if rng.random_bool(0.8) {
            rng.random_range(touches..(touches + 120).min(t.len()))
        } else {
            rng.random_range(0..t.len())
        };
        t[at] = alphabet[rng.random_range(0..alphabet.len())];
        tried += 1;
        let slow = serde_json::from_slice::<ManifestV2>(&t)
            .ok()
            .and_then(|d| d.into_model().ok())
            .filter(|d| d.format_version == 2);
        if let Some(f) = fast_manifest(&t, 2) {
            fast += 1;
            assert_eq!(Some(f), slow, "{}", String::from_utf8_lossy(&t));
        }
    }
    assert!(fast > tried / 10, "only {fast} of {tried} read");
}
