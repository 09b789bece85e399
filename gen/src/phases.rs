//! `graphcheck-gen phases MANIFEST LIVE`: where `graphcheck verify MANIFEST LIVE` spends its
//! time, phase by phase, on one thread (the binary loads the live snapshot on a second
//! one): read, parse, convert (format 2), check references, verify, render; wall and CPU
//! time of each, so that a machine busy with other work still shows each phase's cost; and
//! how long serde_json takes only to scan the manifest's bytes (the floor of any reader
//! built on it). For the profile in `benches/verify.md`.

use std::path::Path;
use std::time::Instant;

use graphcheck::check::allow::Allowlist;
use graphcheck::check::verify::verify_checked;
use graphcheck::codec::v2::{LiveV2, ManifestV2, RawTouches};
use graphcheck::index::refs::{check_live, check_manifest};
use graphcheck::model::format::{Live, Manifest};

/// A phase's start: wall clock and this thread's CPU time.
#[derive(Clone, Copy)]
struct Mark(Instant, u64);

fn now() -> Mark {
    Mark(Instant::now(), cpu_ns())
}

/// This thread's CPU time in nanoseconds (Linux: `/proc/thread-self/schedstat`), so that a
/// machine busy with other work still gives each phase its own cost; 0 elsewhere.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `wall/cpu` milliseconds since `t`.
fn ms(t: Mark) -> String {
    let wall = t.0.elapsed().as_secs_f64() * 1e3;
    let cpu = cpu_ns().saturating_sub(t.1) as f64 / 1e6;
    format!("{wall:.0}/{cpu:.0}")
}

/// Format 1 where the document says so first, as every writer writes it.
fn is_v1(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]);
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    compact.starts_with("{\"format_version\":1,")
}

/// Loads and verifies `manifest` against `live` `rounds` times, printing one line of phase
/// times per round.
pub fn run(manifest: &Path, live: &Path, rounds: usize) -> anyhow::Result<()> {
    for round in 0..rounds {
        let mut line = vec![format!("round {round}")];
        let t = now();
        let mb = std::fs::read(manifest)?;
        let lb = std::fs::read(live)?;
        line.push(format!("read {}", ms(t)));
        // The floor of any serde_json reader of these bytes: tokenizing them, building
        // nothing.
        let t = now();
        serde_json::from_slice::<serde::de::IgnoredAny>(&mb)?;
        line.push(format!("(scan manifest {})", ms(t)));
        let (m, l): (Manifest, Live) = if is_v1(&mb) {
            let t = now();
            let m = serde_json::from_slice(&mb)?;
            line.push(format!("parse manifest {}", ms(t)));
            let t = now();
            let l = serde_json::from_slice(&lb)?;
            line.push(format!("parse live {}", ms(t)));
            (m, l)
        } else {
            // serde's reading of every column (what the loader falls back to), for
            // comparison with the fast reader's in the same round.
            let t = now();
            let m: ManifestV2 = serde_json::from_slice(&mb)?;
            let parse = ms(t);
            let t = now();
            drop(m.into_model().map_err(|e| anyhow::anyhow!(e.message))?);
            line.push(format!("(serde reader: parse {parse}, convert {})", ms(t)));
            // As the loader reads it (`fast_manifest`): the touches columns kept as text
            // here, and scanned by the conversion's threads.
            let t = now();
            let m: ManifestV2<RawTouches<'_>> = serde_json::from_slice(&mb)?;
            line.push(format!("parse manifest {}", ms(t)));
            let t = now();
            let m = m.into_model().map_err(|e| anyhow::anyhow!(e.message))?;
            line.push(format!("convert {}", ms(t)));
            let t = now();
            let l: LiveV2 = serde_json::from_slice(&lb)?;
            line.push(format!("parse live {}", ms(t)));
            let t = now();
            let l = l.into_model().map_err(|e| anyhow::anyhow!(e.message))?;
            line.push(format!("convert {}", ms(t)));
            (m, l)
        };
        drop((mb, lb));
        let t = now();
        let mt = check_manifest(&m).map_err(|e| anyhow::anyhow!(e.message))?;
        let lt = check_live(&l).map_err(|e| anyhow::anyhow!(e.message))?;
        line.push(format!("check {}", ms(t)));
        let t = now();
        let r = verify_checked(&m, &mt, Some((&l, &lt)), &Allowlist::default())?;
        line.push(format!("verify {}", ms(t)));
        let t = now();
        let json = graphcheck::present::report::render_json(&r);
        line.push(format!("render {} ({} findings)", ms(t), r.findings.len()));
        drop(json);
        println!("{} (ms wall/cpu)", line.join(", "));
    }
    Ok(())
}
