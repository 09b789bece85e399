//! Benchmark of allowlist glob matching on the patterns of issue 25 that took seconds: `*a`
//! ten thousand times then `b`, and ten thousand `*`, against a 10⁶-character owner path;
//! and, against 10⁶ characters of short attributes, a glob of the most hops between two
//! `**` (62 parts that match every attribute, all `*` and then all different, the worst
//! case). Best wall time of N runs each. Not product API.
//!
//! `cargo run --release --example glob_bench -- [N]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use graphcheck::model::owner_path::Glob;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(3, |s| s.parse().expect("N is a number"));
    let long_name = "a".repeat(1_000_000);
    // Half a million one-letter hops, and a glob of 64 between two `**` that matches none.
    let many_hops = vec!["a"; 500_000].join(".");
    let hops_glob = format!("**.{}.b**", vec!["*"; 62].join("."));
    // 62 different parts that each match `aaaaaa`: runs of `a` and single `*`.
    let words = (1..10u32).flat_map(|n| {
        (0..1u32 << n).map(move |bits| {
            (0..n)
                .map(|i| if bits >> i & 1 == 1 { '*' } else { 'a' })
                .collect::<String>()
        })
    });
    let distinct: Vec<String> = words
        .filter(|w| !w.contains("**"))
        .filter(|w| {
            let a = w.matches('a').count();
            a == 6 || (a < 6 && w.contains('*'))
        })
        .take(62)
        .collect();
    assert_eq!(distinct.len(), 62);
    let distinct_glob = format!("**.{}.b**", distinct.join("."));
    let aaaa = vec!["aaaaaa"; 142_857].join(".");
    let cases: [(&str, String, &str); 5] = [
        (
            "(*a)x10000 b",
            format!("{}b", "*a".repeat(10_000)),
            &long_name,
        ),
        ("*x10000", "*".repeat(10_000), &long_name),
        ("**.(*.)x62 b**", hops_glob, &many_hops),
        ("**.(62 parts) b**", distinct_glob, &aaaa),
        (
            "quoted keys",
            "runner.adapters[*].*".to_string(),
            "runner.adapters[\"lora.v1\"].scale",
        ),
    ];
    println!(
        "{:<16} {:>9} {:>7} {:>12}",
        "pattern", "path len", "match", "best"
    );
    for (name, pattern, path) in &cases {
        let glob = Glob::owner_path(pattern).expect("a valid glob");
        let mut best = Duration::MAX;
        let mut matched = false;
        for _ in 0..n {
            let t = Instant::now();
            matched = black_box(&glob).is_match(black_box(path));
            best = best.min(t.elapsed());
        }
        println!("{name:<18} {:>9} {matched:>7} {best:>12.3?}", path.len());
    }
}
