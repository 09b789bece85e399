//! The committed `docs/reference/cli.md` and `docs/man/` are what `graphcheck-gen docs`
//! writes from the command line's definitions, so neither drifts from `--help`.

use std::path::Path;

use graphcheck_gen::docs;

#[test]
fn committed_docs_match_the_generator() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let differ = docs::check(&dir, &docs::files().unwrap());
    assert!(
        differ.is_empty(),
        "docs/ differs from the command line's definitions; run `{}`:\n{}",
        graphcheck_cli::reference::REGENERATE,
        differ.join("\n")
    );
}
