//! The house's layout, held by tests: each stage of `src/` uses only the stages before it,
//! no module circle inside a folder, and no source file over 800 lines outside tests.
//! Every way a module names another counts: `use crate::index::refs;`, `crate::{model,
//! index::refs}`, `super::{schema, v2}`, `self::x`, and full paths in code.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// Each stage of `src/` (a folder, or a file with its folder) and the stages it may use.
    const ARROWS: &[(&str, &[&str])] = &[
        ("model", &[]),
        ("index", &["model"]),
        ("codec", &["model", "index"]),
        ("digest", &["model"]),
        ("resolve", &["model", "index"]),
        ("check", &["model", "index", "codec"]),
        ("plan", &["model", "index", "check"]),
        ("present", &["model", "index", "codec", "check", "plan"]),
        ("cuda", &["model", "digest", "resolve", "plan"]),
        (
            "app",
            &[
                "model", "index", "codec", "digest", "resolve", "check", "plan", "present",
            ],
        ),
    ];

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    /// The non-test source files under `dir` (a `tests.rs` or a `tests/` folder is a test),
    /// with their text up to a `#[cfg(test)]` module.
    fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if p.is_dir() {
                    if name != "tests" {
                        stack.push(p);
                    }
                } else if name.ends_with(".rs") && name != "tests.rs" {
                    let text = std::fs::read_to_string(&p).unwrap();
                    out.push((p, non_test(&text).to_string()));
                }
            }
        }
        out.sort();
        out
    }

    fn non_test(text: &str) -> &str {
        match text.find("#[cfg(test)]\nmod tests") {
            Some(i) => &text[..i],
            None => text,
        }
    }

    /// A stage's files: its folder's, and the file of the same name beside it.
    fn stage_sources(stage: &str) -> Vec<(PathBuf, String)> {
        let mut files = sources(&src().join(stage));
        let file = src().join(format!("{stage}.rs"));
        if let Ok(text) = std::fs::read_to_string(&file) {
            files.push((file, non_test(&text).to_string()));
        }
        files
    }

    /// The code of a file without its comments and string literals (a doc link or a
    /// message is not a dependency).
    fn code_only(code: &str) -> String {
        let mut out = String::with_capacity(code.len());
        let code = code.replace("'\"'", "' '");
        for line in code.lines() {
            let line = match line.find("//") {
                Some(i) if !line[..i].contains('"') => &line[..i],
                _ => line,
            };
            let mut in_str = false;
            let mut prev = ' ';
            for c in line.chars() {
                if c == '"' && prev != '\\' {
                    in_str = !in_str;
                    out.push(' ');
                } else if !in_str {
                    out.push(c);
                }
                prev = c;
            }
            out.push('\n');
        }
        out
    }

    /// Every path that starts with `crate::`, `super::` or `self::` in `code`, use trees
    /// expanded (`crate::{a, b::{c, d}}` gives `crate::a`, `crate::b::c`, `crate::b::d`),
    /// as its segments.
    fn paths(code: &str) -> Vec<Vec<String>> {
        let code = code_only(code);
        let bytes = code.as_bytes();
        let mut out = Vec::new();
        for root in ["crate", "super", "self"] {
            for (i, _) in code.match_indices(&format!("{root}::")) {
                let before = code[..i].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue; // `my_crate::`, `xsuper::`
                }
                let mut at = i;
                tree(bytes, &mut at, vec![], &mut out);
            }
        }
        out
    }

    fn ident(b: &[u8], at: &mut usize) -> String {
        while *at < b.len() && b[*at].is_ascii_whitespace() {
            *at += 1;
        }
        let start = *at;
        while *at < b.len() && (b[*at].is_ascii_alphanumeric() || b[*at] == b'_' || b[*at] == b'*')
        {
            *at += 1;
        }
        String::from_utf8_lossy(&b[start..*at]).into_owned()
    }

    fn skip_ws(b: &[u8], at: &mut usize) {
        while *at < b.len() && b[*at].is_ascii_whitespace() {
            *at += 1;
        }
    }

    /// Reads one use tree at `at` onto `prefix`, pushing each full path.
    fn tree(b: &[u8], at: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        loop {
            skip_ws(b, at);
            if b.get(*at) == Some(&b'{') {
                *at += 1;
                loop {
                    tree(b, at, prefix.clone(), out);
                    skip_ws(b, at);
                    match b.get(*at) {
                        Some(b',') => *at += 1,
                        Some(b'}') => {
                            *at += 1;
                            return;
                        }
                        _ => return,
                    }
                    skip_ws(b, at);
                    if b.get(*at) == Some(&b'}') {
                        *at += 1;
                        return;
                    }
                }
            }
            let name = ident(b, at);
            if name.is_empty() {
                if !prefix.is_empty() {
                    out.push(prefix);
                }
                return;
            }
            prefix.push(name);
            if b.get(*at..*at + 2) == Some(b"::") {
                *at += 2;
            } else {
                out.push(prefix);
                return;
            }
        }
    }

    /// The module path of a source file under `src/` (`codec/v2/scan.rs` is
    /// `codec::v2::scan`, `codec/mod.rs` is `codec`).
    fn module_of(path: &Path) -> Vec<String> {
        let rel = path.strip_prefix(src()).unwrap();
        let mut m: Vec<String> = rel
            .iter()
            .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if m.last().is_some_and(|s| s == "mod") {
            m.pop();
        }
        m
    }

    /// `path` as named in a file of module `me`, made absolute from the crate root.
    fn absolute(me: &[String], path: &[String]) -> Vec<String> {
        let mut base: Vec<String> = me.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            _ => {}
        }
        while rest.first().map(String::as_str) == Some("super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        base
    }

    /// The stage a file uses for each path it names.
    fn stages_used(path: &Path, code: &str) -> BTreeSet<String> {
        let me = module_of(path);
        paths(code)
            .iter()
            .map(|p| absolute(&me, p))
            .filter_map(|p| p.first().cloned())
            .filter(|s| ARROWS.iter().any(|(f, _)| f == s))
            .collect()
    }

    fn check_arrows(files: &[(PathBuf, String)], stage: &str, allowed: &[&str]) {
        for (path, code) in files {
            for used in stages_used(path, code) {
                assert!(
                    used == stage || allowed.contains(&used.as_str()),
                    "{} uses crate::{used}; {stage} may use only {allowed:?}",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn stages_use_only_the_stages_before_them() {
        for (stage, allowed) in ARROWS {
            check_arrows(&stage_sources(stage), stage, allowed);
        }
    }

    /// Edges between the children of each module folder: `a -> b` where a file of child
    /// `a` names child `b`.
    fn sibling_uses(
        files: &[(PathBuf, String)],
    ) -> BTreeMap<Vec<String>, BTreeSet<(String, String)>> {
        let mut edges: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
        for (path, code) in files {
            let me = module_of(path);
            for p in paths(code) {
                let target = absolute(&me, &p);
                // The deepest folder holding both as different children.
                let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common < me.len() && common < target.len() {
                    let folder = me[..common].to_vec();
                    edges
                        .entry(folder)
                        .or_default()
                        .insert((me[common].clone(), target[common].clone()));
                }
            }
        }
        edges
    }

    fn find_circle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
        fn visit(
            n: &str,
            edges: &BTreeSet<(String, String)>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == n) {
                let mut c = path[i..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            if done.contains(n) {
                return None;
            }
            path.push(n.to_string());
            for (_, m) in edges.iter().filter(|(a, _)| a == n) {
                if let Some(c) = visit(m, edges, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(n.to_string());
            None
        }
        let mut done = BTreeSet::new();
        for (a, _) in edges {
            if let Some(c) = visit(a, edges, &mut Vec::new(), &mut done) {
                return Some(c);
            }
        }
        None
    }

    fn check_no_circle(files: &[(PathBuf, String)]) {
        for (folder, edges) in sibling_uses(files) {
            if let Some(c) = find_circle(&edges) {
                panic!(
                    "module circle in crate::{}: {}",
                    folder.join("::"),
                    c.join(" -> ")
                );
            }
        }
    }

    #[test]
    fn no_module_circle_inside_a_folder() {
        check_no_circle(&sources(&src()));
    }

    /// The checks see every form a circle or a backward arrow can be written in: each
    /// planted in text, each must fail.
    #[test]
    fn the_layout_checks_fail_on_what_they_forbid() {
        let at = |rel: &str, code: &str| (src().join(rel), code.to_string());
        let plants: &[(&str, Vec<(PathBuf, String)>)] = &[
            (
                "a module imported, then used by its name",
                vec![
                    at("codec/a.rs", "use crate::codec::b;\nfn f() { b::g() }"),
                    at("codec/b.rs", "pub fn g() { crate::codec::a::f() }"),
                ],
            ),
            (
                "a brace group under crate::folder",
                vec![
                    at("codec/a.rs", "use crate::codec::{b, c};"),
                    at("codec/b.rs", "use crate::codec::{\n    a::X,\n};"),
                ],
            ),
            (
                "super:: and a brace group under super::",
                vec![
                    at("codec/a.rs", "use super::{b};"),
                    at("codec/b.rs", "use super::a;"),
                ],
            ),
            (
                "a crate-level brace group",
                vec![
                    at("codec/a.rs", "use crate::{model, codec::b::Y};"),
                    at("codec/b.rs", "fn g() -> super::a::X { todo!() }"),
                ],
            ),
            (
                "three modules round",
                vec![
                    at("index/a.rs", "use crate::index::b::B;"),
                    at("index/b.rs", "use self::super::c;"),
                    at("index/c.rs", "pub type C = crate::index::a::A;"),
                ],
            ),
        ];
        for (what, files) in plants {
            let r = std::panic::catch_unwind(|| check_no_circle(files));
            assert!(r.is_err(), "a circle through {what} went unseen");
        }
        let backward: &[(&str, &str)] = &[
            ("index/refs.rs", "use crate::codec::schema;"),
            ("index/refs.rs", "use crate::{model::format, codec::load};"),
            ("model/format.rs", "fn f() { crate::check::pair::g() }"),
            ("model/ids.rs", "use super::super::index::refs;"),
        ];
        for (rel, code) in backward {
            let stage = rel.split('/').next().unwrap();
            let allowed = ARROWS.iter().find(|(s, _)| *s == stage).unwrap().1;
            let files = vec![at(rel, code)];
            let r = std::panic::catch_unwind(|| check_arrows(&files, stage, allowed));
            assert!(r.is_err(), "a backward arrow went unseen: {rel}: {code}");
        }
        // What is no dependency stays none: a comment, a string, another crate's path.
        let quiet = vec![
            at(
                "index/a.rs",
                "// see crate::codec::load\nfn f() { let _ = \"crate::codec\"; }",
            ),
            at("index/b.rs", "use graphcheck_driver::codec::x;"),
        ];
        check_arrows(&quiet, "index", &["model"]);
    }

    #[test]
    fn every_stage_of_src_is_in_the_arrows() {
        let mut named: BTreeSet<String> = BTreeSet::new();
        for e in std::fs::read_dir(src()).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                named.insert(name);
            }
        }
        for (stage, _) in ARROWS {
            assert!(
                named.contains(*stage) || src().join(format!("{stage}.rs")).exists(),
                "{stage}"
            );
        }
        let stages: BTreeSet<String> = ARROWS.iter().map(|(s, _)| s.to_string()).collect();
        let missing: Vec<&String> = named.difference(&stages).collect();
        assert!(
            missing.is_empty(),
            "folders of src/ with no arrows: {missing:?}"
        );
    }

    #[test]
    fn no_source_file_over_800_lines_outside_tests() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for dir in [
            "src",
            "cli/src",
            "driver/src",
            "sleep/src",
            "python/src",
            "gen/src",
            "fuzz/src",
            "examples",
        ] {
            for (path, code) in sources(&root.join(dir)) {
                let lines = code.lines().count();
                assert!(lines <= 800, "{} has {lines} lines", path.display());
            }
        }
    }

    #[test]
    fn no_python_file_over_800_lines() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut stack = vec![root.join("python/graphcheck"), root.join("benches")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "py") {
                    let lines = std::fs::read_to_string(&p).unwrap().lines().count();
                    assert!(lines <= 800, "{} has {lines} lines", p.display());
                }
            }
        }
    }

    /// Where unsafe code is allowed, derived from the code: `#![allow(unsafe_code)]` for a
    /// whole crate only in the driver layer, and every item-level `#[allow(unsafe_code)]`
    /// right under a comment saying why (each block inside says why again: clippy's
    /// `undocumented_unsafe_blocks`). Run with `--nocapture` to see the list.
    #[test]
    fn unsafe_code_is_allowed_only_where_a_comment_says_why() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut places = Vec::new();
        let mut stack: Vec<PathBuf> = [
            "src",
            "cli",
            "driver",
            "sleep",
            "python/src",
            "gen",
            "fuzz",
            "examples",
            "tests",
        ]
        .iter()
        .map(|d| root.join(d))
        .collect();
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries {
                let p = e.unwrap().path();
                if p.is_dir() {
                    if !p.ends_with("target") {
                        stack.push(p);
                    }
                    continue;
                }
                if p.extension().is_none_or(|x| x != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                let lines: Vec<&str> = text.lines().collect();
                for (i, line) in lines.iter().enumerate() {
                    let l = line.trim();
                    let rel = p.strip_prefix(root).unwrap().display().to_string();
                    if l.starts_with("#![allow(unsafe_code)]") {
                        assert_eq!(
                            rel, "driver/src/lib.rs",
                            "a crate allows unsafe code: {rel}"
                        );
                        places.push(format!("{rel}: the whole crate"));
                    } else if l.starts_with("#[allow(unsafe_code)]") {
                        // Above it: other attributes, then the comment.
                        let said = lines[..i]
                            .iter()
                            .rev()
                            .skip_while(|l| l.trim().starts_with("#["))
                            .take_while(|l| l.trim().starts_with("//"))
                            .count();
                        assert!(
                            said > 0,
                            "{rel}:{}: #[allow(unsafe_code)] says not why",
                            i + 1
                        );
                        let item = lines[i + 1..]
                            .iter()
                            .map(|l| l.trim())
                            .find(|l| !l.starts_with("#[") && !l.is_empty())
                            .unwrap_or("");
                        places.push(format!("{rel}:{}: {item}", i + 1));
                    }
                }
            }
        }
        places.sort();
        eprintln!("unsafe code is allowed in:\n  {}", places.join("\n  "));
        assert!(places.iter().any(|p| p.starts_with("driver/src/lib.rs")));
    }
}
