//! The house's layout, held by tests: the pipeline folders use only the stages before
//! them, no module circle inside a folder, and no source file over 800 lines outside tests.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// Each folder of `src/` and the folders it may use (`crate::<folder>`).
    const ARROWS: &[(&str, &[&str])] = &[
        ("document", &[]),
        ("resolve", &["document"]),
        ("check", &["document"]),
        ("present", &["check", "document"]),
        ("cuda", &["resolve", "document"]),
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
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if p.is_dir() {
                    if name != "tests" {
                        stack.push(p);
                    }
                } else if name.ends_with(".rs") && name != "tests.rs" {
                    let text = std::fs::read_to_string(&p).unwrap();
                    let code = match text.find("#[cfg(test)]\nmod tests") {
                        Some(i) => &text[..i],
                        None => &text[..],
                    };
                    out.push((p, code.to_string()));
                }
            }
        }
        out.sort();
        out
    }

    /// The code of a file without its comments (a doc link is not a dependency).
    fn code_only(code: &str) -> String {
        code.lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn folders_use_only_the_stages_before_them() {
        for (folder, allowed) in ARROWS {
            for (path, code) in sources(&src().join(folder)) {
                let code = code_only(&code);
                for (i, _) in code.match_indices("crate::") {
                    let used: String = code[i + 7..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let stage = ARROWS.iter().any(|(f, _)| *f == used);
                    assert!(
                        !stage || used == *folder || allowed.contains(&used.as_str()),
                        "{} uses crate::{used}; {folder}/ may use only {allowed:?}",
                        path.display()
                    );
                }
            }
        }
    }

    #[test]
    fn no_module_circle_inside_a_folder() {
        for (folder, _) in ARROWS {
            let dir = src().join(folder);
            let files = sources(&dir);
            let module = |p: &Path| p.file_stem().unwrap().to_string_lossy().to_string();
            let names: BTreeSet<String> = files.iter().map(|(p, _)| module(p)).collect();
            let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (p, code) in &files {
                let me = module(p);
                let code = code_only(code);
                for other in &names {
                    let by_super = format!("super::{other}::");
                    let by_super_list = format!("super::{other}::{{");
                    let by_crate = format!("crate::{folder}::{other}::");
                    if *other != me
                        && other != "mod"
                        && (code.contains(&by_super)
                            || code.contains(&by_super_list)
                            || code.contains(&by_crate))
                    {
                        uses.entry(me.clone()).or_default().insert(other.clone());
                    }
                }
            }
            // Depth-first search for a back edge.
            fn visit(
                n: &str,
                uses: &BTreeMap<String, BTreeSet<String>>,
                path: &mut Vec<String>,
                done: &mut BTreeSet<String>,
            ) {
                if done.contains(n) {
                    return;
                }
                assert!(
                    !path.iter().any(|p| p == n),
                    "module circle: {} -> {n}",
                    path.join(" -> ")
                );
                path.push(n.to_string());
                for m in uses.get(n).into_iter().flatten() {
                    visit(m, uses, path, done);
                }
                path.pop();
                done.insert(n.to_string());
            }
            let mut done = BTreeSet::new();
            for n in &names {
                visit(n, &uses, &mut Vec::new(), &mut done);
            }
        }
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
        ] {
            for (path, code) in sources(&root.join(dir)) {
                let lines = code.lines().count();
                assert!(lines <= 800, "{} has {lines} lines", path.display());
            }
        }
    }
}
