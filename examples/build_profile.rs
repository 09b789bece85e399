//! Profiling scaffolding for the manifest build (`benches/capture_profile.py --dump` writes
//! a build spec with its walked graphs inline): the walked graphs are taken out and handed
//! over by index, as the Python recorder does, then building the manifest and writing its
//! JSON are timed, best of N. Not product API.
//!
//! `cargo run --release --example build_profile -- SPEC.json [N]`

use std::sync::Arc;
use std::time::Instant;

use graphcheck::resolve::spec::{self, BuildSpec};
use graphcheck::resolve::walked::WalkedGraph;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: build_profile SPEC.json [N]");
    let n: usize = args.next().map_or(5, |s| s.parse().expect("N is a number"));
    // `build` repeats only the build (for `perf stat`, which counts what a noisy machine
    // cannot time): the spec is parsed N times up front.
    let only_build = args.next().as_deref() == Some("build");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read the spec")).expect("JSON");
    let mut walked: Vec<Arc<WalkedGraph>> = Vec::new();
    for (i, g) in v["graphs"]
        .as_array_mut()
        .expect("graphs")
        .iter_mut()
        .enumerate()
    {
        let w = g
            .as_object_mut()
            .unwrap()
            .remove("walked")
            .expect("walked inline");
        walked.push(Arc::new(serde_json::from_value(w).expect("a walked graph")));
        g["walked_index"] = i.into();
    }
    let bytes = serde_json::to_vec(&v).unwrap();
    if only_build {
        let specs: Vec<BuildSpec> = (0..n)
            .map(|_| BuildSpec::parse(&bytes, &path).expect("parses"))
            .collect();
        for s in specs {
            std::hint::black_box(spec::build(s, &walked, &path).expect("builds"));
        }
        return;
    }
    let (mut parse, mut build, mut write, mut size) = (f64::MAX, f64::MAX, f64::MAX, 0);
    for _ in 0..n {
        let t = Instant::now();
        let s = BuildSpec::parse(&bytes, &path).expect("parses");
        parse = parse.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let m = spec::build(s, &walked, &path).expect("builds");
        build = build.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let text = serde_json::to_string(&m).expect("serializes");
        write = write.min(t.elapsed().as_secs_f64());
        size = text.len();
    }
    println!(
        "best of {n}: spec parse {:.2} ms, build {:.2} ms, JSON {:.2} ms ({:.1} MB)",
        parse * 1e3,
        build * 1e3,
        write * 1e3,
        size as f64 / 1e6
    );
}
