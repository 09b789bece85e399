//! The targets and their invariants. Each case makes one input from the corpus, runs the
//! code under test on it, and says whether it was accepted, rejected, or broke an invariant.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use graphcheck::check::allow::Allowlist;
use graphcheck::check::finding::{FindingKind, Report};
use graphcheck::codec::load::Source;
use graphcheck::model::format::{
    Addr, AllocState, Contents, Document, Event, Live, Manifest, Probe, Producer,
};
use graphcheck::model::owner_path::{self, Glob, OwnerPath};
use graphcheck::present::explain::Query;
use graphcheck::present::fmt::RawAddrs;
use graphcheck::resolve::manifest::ManifestBuilder;
use graphcheck::resolve::walked::{RangeSet, RawWord, WalkedGraph, WalkedNode};
use rand::Rng;
use rand::rngs::SmallRng;
use serde_json::Value;

use crate::Outcome;
use crate::mutate::{mutate_bytes, mutate_json, mutate_text};

/// What the targets mutate: every document, allowlist, owner path and kernel name of the
/// committed fixtures, and the schema documents must satisfy.
pub struct Corpus {
    /// Documents that parse as JSON (good and bad ones), and every document's raw bytes.
    pub documents: Vec<Value>,
    pub raw: Vec<Vec<u8>>,
    pub manifests: Vec<Manifest>,
    pub allowlists: Vec<String>,
    pub owner_paths: Vec<String>,
    pub kernel_names: Vec<String>,
    /// Strings seen in the corpus, for splicing.
    pub dict: Vec<String>,
    /// The committed schemas of format 1 and format 2, in that order.
    pub schemas: [jsonschema::Validator; 2],
    /// A report with findings, for allowlists to apply to.
    pub report: Report,
}

/// The committed schema of format `version`.
fn schema(repo: &Path, version: u32) -> Result<jsonschema::Validator, String> {
    let file = format!("schema/graphcheck-v{version}.schema.json");
    let text = std::fs::read_to_string(repo.join(&file)).map_err(|e| format!("{file}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    jsonschema::validator_for(&v).map_err(|e| format!("{file}: {e}"))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, ext, out);
        } else if p.to_string_lossy().ends_with(ext) {
            out.push(p);
        }
    }
}

fn strings(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::String(s) if s.len() <= 200 => {
            out.insert(s.clone());
        }
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

impl Corpus {
    pub fn load(repo: &Path) -> Result<Corpus, String> {
        let mut paths = Vec::new();
        files(&repo.join("fixtures"), ".json", &mut paths);
        paths.retain(|p| !p.ends_with("index.json"));
        paths.sort();
        let mut c = Corpus {
            documents: Vec::new(),
            raw: Vec::new(),
            manifests: Vec::new(),
            allowlists: Vec::new(),
            owner_paths: Vec::new(),
            kernel_names: Vec::new(),
            dict: Vec::new(),
            schemas: [schema(repo, 1)?, schema(repo, 2)?],
            report: Report {
                format_version: 1,
                ok: true,
                checked: vec![],
                summary: Default::default(),
                findings: vec![],
                allowed: vec![],
                subjects: 0,
                graphs: 0,
                unread_nodes: 0,
                world_size: None,
                ranks: vec![],
                missing_ranks: vec![],
                superseded: vec![],
                retarget: vec![],
            },
        };
        let mut dict = BTreeSet::new();
        let mut owner_paths = BTreeSet::new();
        let mut kernels = BTreeSet::new();
        for p in &paths {
            let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                strings(&v, &mut dict);
                c.documents.push(v);
            }
            if let Ok(Document::Manifest(m)) = (Source::Text {
                bytes: bytes.clone(),
                name: p.clone(),
            })
            .document()
            {
                owner_paths.extend(m.owners.iter().map(|o| o.path.to_string()));
                kernels.extend(
                    m.graphs
                        .iter()
                        .flat_map(|g| &g.nodes)
                        .map(|n| n.name.clone()),
                );
                c.manifests.push(m);
            }
            c.raw.push(bytes);
        }
        let mut tomls = Vec::new();
        files(&repo.join("fixtures"), ".toml", &mut tomls);
        tomls.sort();
        for p in tomls {
            c.allowlists
                .push(std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?);
        }
        c.dict = dict.into_iter().collect();
        c.owner_paths = owner_paths.into_iter().collect();
        c.kernel_names = kernels.into_iter().map(|k| k.to_string()).collect();
        if c.manifests.is_empty() || c.allowlists.is_empty() {
            return Err("the fixture corpus has no manifest or no allowlist".into());
        }
        // The report of the manifest with the most findings, for allowlists.
        c.report = c
            .manifests
            .iter()
            .filter_map(|m| graphcheck::check::verify::verify(m, None, &Allowlist::default()).ok())
            .max_by_key(|r| r.findings.len())
            .expect("a manifest verifies");
        Ok(c)
    }

    fn pick<'a, T>(&self, rng: &mut SmallRng, v: &'a [T]) -> &'a T {
        &v[rng.random_range(0..v.len())]
    }

    /// A mutated document: a corpus document changed as a tree, sometimes also as bytes.
    pub fn mutated_document(&self, rng: &mut SmallRng) -> Vec<u8> {
        if rng.random_bool(0.05) {
            let mut b = self.pick(rng, &self.raw).clone();
            mutate_bytes(rng, &mut b);
            return b;
        }
        let mut doc = self.pick(rng, &self.documents).clone();
        mutate_json(rng, &mut doc, &self.documents, &self.dict);
        let mut bytes = serde_json::to_vec(&doc).expect("a Value serializes");
        if rng.random_bool(0.05) {
            mutate_bytes(rng, &mut bytes);
        }
        bytes
    }
}

/// The live snapshot of a manifest taken with nothing changed since its last capture: the
/// same pools, allocations, tensors and owners (a path the manifest gives once per storage
/// it held holds its first, what it held at the last walk), every captured address probed
/// active in its allocation.
pub fn live_of(m: &Manifest) -> Live {
    let mut l = Live::new(
        m.producer.clone(),
        Event {
            name: "nothing changed".into(),
            contents: Contents::Preserved,
        },
    );
    l.pools = m.pools.clone();
    l.allocations = m.allocations.clone();
    l.tensors = m.tensors.clone();
    let mut paths = BTreeSet::new();
    l.owners = m
        .owners
        .iter()
        .filter(|o| paths.insert(o.path.as_str()))
        .cloned()
        .collect();
    let mut seen = BTreeSet::new();
    for t in m
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
    {
        if !seen.insert(t.addr) {
            continue;
        }
        let a = m
            .allocations
            .iter()
            .find(|a| a.base.0 <= t.addr.0 && t.addr.0 - a.base.0 < a.size);
        l.probes.push(Probe {
            addr: t.addr,
            state: AllocState::Active,
            pool: a.and_then(|a| a.pool),
            allocation: a.map(|a| a.id),
        });
    }
    l
}

/// The kinds only a live snapshot can give: every kind but the capture-time ones, the
/// cross-rank one and the allowlist's own warning.
fn live_kind(k: FindingKind) -> bool {
    !FindingKind::CAPTURE_TIME.contains(&k)
        && k != FindingKind::UnusedAllow
        && k != FindingKind::RankMismatch
}

fn same(a: &Document, b: &Document) -> bool {
    match (a, b) {
        (Document::Manifest(x), Document::Manifest(y)) => x == y,
        (Document::Live(x), Document::Live(y)) => x == y,
        _ => false,
    }
}

fn text_source(bytes: Vec<u8>) -> Source {
    Source::Text {
        bytes,
        name: PathBuf::from("<fuzz>"),
    }
}

/// The loader: what it accepts validates against the schema of its format version, writes
/// back (in that version, and in the other) and loads back equal, holds together
/// ([`crate::records::consistent`]), and (a manifest) verifies clean against itself as its
/// own live snapshot.
pub fn load(rng: &mut SmallRng, c: &Corpus) -> (Vec<u8>, Outcome) {
    let bytes = c.mutated_document(rng);
    let doc = match text_source(bytes.clone()).document() {
        Ok(d) => d,
        Err(_) => return (bytes, Outcome::Rejected),
    };
    let outcome = (|| {
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("accepted, not JSON: {e}"))?;
        // The schema of the version the loader read it as.
        let version = match &doc {
            Document::Manifest(m) => m.format_version,
            Document::Live(l) => l.format_version,
        };
        let schema = &c.schemas[usize::from(version != 1)];
        if let Some(e) = schema.iter_errors(&v).next() {
            let what: String = format!("{:?}", e.kind()).chars().take(300).collect();
            return Err(format!(
                "the loader accepted a document the schema rejects, at `{}` (schema `{}`): {what}",
                e.instance_path(),
                e.schema_path()
            ));
        }
        let written = match &doc {
            Document::Manifest(m) => serde_json::to_vec(m),
            Document::Live(l) => serde_json::to_vec(l),
        }
        .map_err(|e| format!("does not serialize: {e}"))?;
        let back = text_source(written)
            .document()
            .map_err(|e| format!("written back, it no longer loads: {e}"))?;
        if !same(&doc, &back) {
            return Err("written back and loaded again, it differs".into());
        }
        let other = 3 - version;
        let converted = match &doc {
            Document::Manifest(m) => serde_json::to_vec(&m.clone().in_version(other)),
            Document::Live(l) => serde_json::to_vec(&l.clone().in_version(other)),
        }
        .map_err(|e| format!("does not serialize in format {other}: {e}"))?;
        let converted = text_source(converted)
            .document()
            .map_err(|e| format!("written in format {other}, it no longer loads: {e}"))?;
        let back_again = match converted {
            Document::Manifest(m) => Document::Manifest(m.in_version(version)),
            Document::Live(l) => Document::Live(l.in_version(version)),
        };
        if !same(&doc, &back_again) {
            return Err(format!(
                "written in format {other} and loaded again, it differs"
            ));
        }
        crate::records::consistent(&doc)?;
        if let Document::Manifest(m) = &doc {
            let l = live_of(m);
            let r = graphcheck::check::verify::verify(m, Some(&l), &Allowlist::default())
                .map_err(|e| format!("verify against itself failed: {e}"))?;
            // A path rebound between two captures moved since the earlier one: what that
            // graph read is another storage than the path's now, a change before this one.
            let mut once = BTreeSet::new();
            let repeated: BTreeSet<&str> = m
                .owners
                .iter()
                .filter(|o| !once.insert(o.path.as_str()))
                .map(|o| o.path.as_str())
                .collect();
            if let Some(f) = r.findings.iter().find(|f| {
                live_kind(f.kind) && !f.owners.iter().any(|o| repeated.contains(o.path.as_str()))
            }) {
                return Err(format!(
                    "verify against itself (nothing changed) reports {} {}: {}",
                    f.kind, f.subject, f.detail
                ));
            }
        }
        Ok(())
    })();
    match outcome {
        Ok(()) => (bytes, Outcome::Accepted),
        Err(e) => (bytes, Outcome::Failed(e)),
    }
}

/// Allowlists, as TOML text and as data: no panic; what parses applies to a report.
pub fn allow(rng: &mut SmallRng, c: &Corpus) -> (Vec<u8>, Outcome) {
    let base = c.pick(rng, &c.allowlists).clone();
    let text = match rng.random_range(0..3) {
        0 => {
            let mut t = base;
            for _ in 0..rng.random_range(1..4) {
                t = mutate_text(rng, &t, &c.dict);
            }
            t
        }
        _ => {
            let mut v: Value = toml::from_str(&base).unwrap_or(Value::Null);
            mutate_json(rng, &mut v, &[], &c.dict);
            match toml::to_string(&v) {
                Ok(t) => t,
                Err(_) => {
                    // Not expressible as TOML (a null): hand it over as data instead.
                    let json = serde_json::to_string(v.get("allow").unwrap_or(&v))
                        .expect("a Value serializes");
                    return match Allowlist::from_json(&json) {
                        Ok(a) => {
                            let _ = a.apply(c.report.findings.clone(), &c.report.checked);
                            (json.into_bytes(), Outcome::Accepted)
                        }
                        Err(_) => (json.into_bytes(), Outcome::Rejected),
                    };
                }
            }
        }
    };
    match Allowlist::parse(&text) {
        Ok(a) => {
            let (kept, allowed) = a.apply(c.report.findings.clone(), &c.report.checked);
            let outcome = if kept.len() + allowed.len() < c.report.findings.len() {
                Outcome::Failed("applying an allowlist lost findings".into())
            } else {
                Outcome::Accepted
            };
            (text.into_bytes(), outcome)
        }
        Err(_) => (text.into_bytes(), Outcome::Rejected),
    }
}

/// Owner paths and globs: the parser, `OwnerPath` and the canonical spelling agree.
pub fn owner_path(rng: &mut SmallRng, c: &Corpus) -> (Vec<u8>, Outcome) {
    let mut p = if rng.random_bool(0.8) {
        c.pick(rng, &c.owner_paths).clone()
    } else {
        c.pick(rng, &c.dict).clone()
    };
    for _ in 0..rng.random_range(1..4) {
        p = mutate_text(rng, &p, &c.owner_paths);
    }
    let input = p.clone().into_bytes();
    let parsed = owner_path::parse(&p);
    let typed = OwnerPath::parse(&p);
    let check = || -> Result<bool, String> {
        if parsed.is_ok() != typed.is_ok() {
            return Err("parse and OwnerPath::parse disagree".into());
        }
        let (Ok(segs), Ok(op)) = (&parsed, &typed) else {
            return Ok(false);
        };
        let canonical = owner_path::join(segs);
        if owner_path::parse(&canonical).as_ref() != Ok(segs) {
            return Err(format!(
                "the canonical spelling {canonical:?} parses differently"
            ));
        }
        if op.len() != segs.len() || op.prefix(op.len()) != p {
            return Err("OwnerPath's hops disagree with the parser".into());
        }
        for (k, s) in segs.iter().enumerate() {
            if op.segment(k) != *s {
                return Err(format!("OwnerPath::segment({k}) differs from the parser"));
            }
            if owner_path::parse(op.prefix(k + 1)).as_deref() != Ok(&segs[..=k]) {
                return Err(format!("prefix {} does not parse to the first hops", k + 1));
            }
        }
        Ok(true)
    };
    let accepted = match check() {
        Ok(a) => a,
        Err(e) => return (input, Outcome::Failed(e)),
    };
    if let Ok(g) = Glob::new(&p) {
        let other = c.pick(rng, &c.owner_paths);
        let _ = g.is_match(other);
        if !p.contains('*') && !g.is_match(&p) {
            return (
                input,
                Outcome::Failed("a glob without * does not match itself".into()),
            );
        }
    }
    (
        input,
        if accepted {
            Outcome::Accepted
        } else {
            Outcome::Rejected
        },
    )
}

/// explain: any target string against a corpus manifest; a captured address and an
/// existing owner path are found.
pub fn explain(rng: &mut SmallRng, c: &Corpus) -> (Vec<u8>, Outcome) {
    let m = c.pick(rng, &c.manifests);
    let touches: Vec<Addr> = m
        .graphs
        .iter()
        .flat_map(|g| &g.nodes)
        .flat_map(|n| &n.touches)
        .map(|t| t.addr)
        .collect();
    let (target, must_find) = match rng.random_range(0..5) {
        0 if !touches.is_empty() => (
            touches[rng.random_range(0..touches.len())].to_string(),
            true,
        ),
        1 if !m.owners.is_empty() => (
            m.owners[rng.random_range(0..m.owners.len())]
                .path
                .to_string(),
            true,
        ),
        2 if !touches.is_empty() => {
            let a = touches[rng.random_range(0..touches.len())];
            (
                Addr(a.0.wrapping_add(rng.random_range(0..4096))).to_string(),
                false,
            )
        }
        _ => {
            let mut t = c.pick(rng, &c.dict).clone();
            for _ in 0..rng.random_range(1..3) {
                t = mutate_text(rng, &t, &c.owner_paths);
            }
            (t, false)
        }
    };
    let input = target.clone().into_bytes();
    let query = if !must_find && rng.random_bool(0.2) {
        Query::Kernel(target.clone())
    } else {
        match Query::parse(&target) {
            Ok(q) => q,
            Err(e) if must_find => {
                return (
                    input,
                    Outcome::Failed(format!("a captured target is refused: {e}")),
                );
            }
            Err(_) => return (input, Outcome::Rejected),
        }
    };
    let e = graphcheck::present::explain::explain(m, &query, &RawAddrs);
    if must_find && !e.found {
        return (
            input,
            Outcome::Failed("a captured address or owner path was not found".into()),
        );
    }
    (
        input,
        if e.found {
            Outcome::Accepted
        } else {
            Outcome::Rejected
        },
    )
}

const SIGNATURE_TOKENS: &[&str] = &[
    "at::cuda::detail::TensorInfo<float, unsigned int>",
    "OffsetCalculator<2, unsigned int, false>",
    "at::PhiloxCudaState",
    "std::array<char*, 3ul>",
    "at::native::(anonymous namespace)::gpu_kernel_impl<X>(at::TensorIteratorBase&, X const&)::{lambda(int)#1}",
    "void k<",
    ">(",
    "(",
    ")",
    ", ",
    "<",
    ">",
    "const",
    "{lambda(int)#1}",
];

/// The kernel-signature rules: any name and any words build a consistent manifest, and
/// the unexplained-word query answers.
pub fn signature(rng: &mut SmallRng, c: &Corpus) -> (Vec<u8>, Outcome) {
    let mut name = c.pick(rng, &c.kernel_names).clone();
    let tokens: Vec<String> = SIGNATURE_TOKENS.iter().map(|s| s.to_string()).collect();
    for _ in 0..rng.random_range(1..4) {
        name = mutate_text(rng, &name, &tokens);
    }
    let words: Vec<RawWord> = (0..rng.random_range(0..24))
        .map(|_| {
            let base = 0x7f00_0000_0000u64 + rng.random_range(0..4u64) * 0x10_0000;
            RawWord {
                param: rng.random_range(0..12),
                offset: rng.random_range(0..128) * 8,
                addr: Addr(base + rng.random_range(0..0x10_0000)),
                allocation: rng.random_bool(0.7).then_some((Addr(base), 0x10_0000)),
            }
        })
        .collect();
    let walked = WalkedGraph {
        node_counts: [("kernel".to_string(), 1)].into(),
        unread: vec![],
        nodes: vec![WalkedNode {
            index: 0,
            kind: graphcheck::model::format::NodeKind::Kernel,
            name: name.as_str().into(),
            grid: None,
            block: None,
            parent: None,
            opaque: None,
            words,
        }],
        graph_allocations: vec![],
    };
    let _ = walked.unexplained(&RangeSet::default());
    let mut b = ManifestBuilder::new(Producer {
        tool: "fuzz".into(),
        tool_version: "0".into(),
        gpu: None,
        driver_version: None,
        framework: None,
        rank: 0,
        world_size: 1,
        session: None,
    });
    b.add_graph("g", None, walked);
    let input = name.into_bytes();
    match b.finish() {
        Ok(_) => (input, Outcome::Accepted),
        Err(e) => (
            input,
            Outcome::Failed(format!("the builder made an inconsistent manifest: {e}")),
        ),
    }
}

/// The most stderr a command may print for any input (progress lines and one error).
const STDERR_LIMIT: usize = 16 * 1024;

/// The command line as a whole: any documents and arguments exit 0, 1 or 2, without a
/// panic or a hang (no answer in 120 s).
pub fn cli(rng: &mut SmallRng, c: &Corpus, binary: &Path, dir: &Path) -> (Vec<u8>, Outcome) {
    let m = dir.join("m.json");
    let l = dir.join("l.json");
    let a = dir.join("a.toml");
    let doc = c.mutated_document(rng);
    let _ = std::fs::write(&m, &doc);
    let _ = std::fs::write(&l, c.mutated_document(rng));
    let mut allow = c.pick(rng, &c.allowlists).clone();
    if rng.random_bool(0.5) {
        allow = mutate_text(rng, &allow, &c.dict);
    }
    let _ = std::fs::write(&a, &allow);
    let (m, l, a) = (
        m.display().to_string(),
        l.display().to_string(),
        a.display().to_string(),
    );
    let format = ["table", "json", "markdown"][rng.random_range(0..3)].to_string();
    let args: Vec<String> = match rng.random_range(0..7) {
        0 => vec!["verify".into(), m, "--format".into(), format],
        1 => vec![
            "verify".into(),
            m,
            l,
            "--allow".into(),
            a,
            "--format".into(),
            format,
        ],
        2 => vec!["show".into(), m, "--normalized".into()],
        // The reads view of any document the loader takes (a live one is exit 2).
        5 => vec!["show".into(), m, "--reads".into(), "--no-kernels".into()],
        3 => vec!["diff".into(), m, l, "--format".into(), format],
        4 => {
            let seed = c.pick(rng, &c.dict).clone();
            // No command line can carry a NUL byte (the spawn itself fails): mutations
            // drop any, keeping the rest of the target.
            let t = mutate_text(rng, &seed, &c.owner_paths).replace('\0', "");
            vec!["explain".into(), m, t]
        }
        _ => vec!["verify".into(), m, l, "--normalized".into()],
    };
    // An argument cannot hold a NUL (the OS takes C strings): a shell could not pass one.
    let args: Vec<String> = args.into_iter().map(|a| a.replace('\0', "")).collect();
    let input = format!("{args:?}").into_bytes();
    let child = Command::new(binary)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(ch) => ch,
        Err(e) => {
            return (
                input,
                Outcome::Failed(format!("cannot run {}: {e}", binary.display())),
            );
        }
    };
    // stderr is read while the child runs: left in the pipe, 64 KiB of it would block the
    // child, and that is the harness hanging, not graphcheck.
    let reader = child.stderr.take().map(|mut s| {
        std::thread::spawn(move || {
            use std::io::Read;
            let mut v = Vec::new();
            let _ = s.read_to_end(&mut v);
            v
        })
    });
    // Generous: CI runs a debug binary on a loaded 2-core machine; a hang is minutes.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return (input, Outcome::Failed("no answer in 120 s".into()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return (input, Outcome::Failed(e.to_string())),
        }
    };
    let err = reader
        .and_then(|r| r.join().ok())
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .unwrap_or_default();
    // An error message is read by a person: a screenful, not a dump of the document.
    if err.len() > STDERR_LIMIT {
        return (
            input,
            Outcome::Failed(format!(
                "{} bytes on stderr (more than {STDERR_LIMIT}): {}",
                err.len(),
                err.chars().take(300).collect::<String>()
            )),
        );
    }
    match status.code() {
        Some(0 | 1) if !err.contains("panicked") => (input, Outcome::Accepted),
        Some(2) if !err.contains("panicked") => (input, Outcome::Rejected),
        code => (
            input,
            Outcome::Failed(format!(
                "exit {code:?}: {}",
                err.lines().next().unwrap_or("")
            )),
        ),
    }
}
