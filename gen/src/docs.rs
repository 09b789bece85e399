//! The documentation generated from the command line's clap definitions (`docs/`): the
//! Markdown reference (`reference/cli.md`) and a man page per command (`man/*.1`), and
//! checking a folder against them.

use std::path::Path;

use crate::fixtures::Files;

/// Where the reference page goes, relative to the docs folder.
pub const REFERENCE: &str = "reference/cli.md";

/// The folder of the man pages, relative to the docs folder; `graphcheck-gen docs` owns
/// every file in it.
pub const MAN: &str = "man";

/// Every generated file, by path relative to the docs folder.
pub fn files() -> anyhow::Result<Files> {
    let mut files = Files::new();
    files.insert(
        REFERENCE.to_string(),
        graphcheck_cli::reference::reference_markdown().into_bytes(),
    );
    for (name, page) in man_pages()? {
        files.insert(format!("{MAN}/{name}"), page);
    }
    Ok(files)
}

/// `graphcheck.1` and one page per documented subcommand (`graphcheck-verify.1`, …), as
/// clap_mangen's `generate_to` names them; no date, so the pages change only with the
/// definitions.
fn man_pages() -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    // As clap_mangen's `generate_to`: no page for clap's own `help` subcommand, which
    // would otherwise be listed on the top page too.
    let mut cmd = graphcheck_cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    let mut stack = vec![cmd];
    while let Some(c) = stack.pop() {
        stack.extend(graphcheck_cli::reference::documented(&c).cloned());
        pages.push(man_page(c)?);
    }
    Ok(pages)
}

/// One command's page and its file name. The exit codes get a section of their own, a
/// tagged paragraph per code: clap_mangen prints the text after the help line by line
/// under EXTRA, where roff's filling runs each code's lines into the next.
fn man_page(cmd: clap::Command) -> anyhow::Result<(String, Vec<u8>)> {
    let after = cmd.get_after_help().map(|a| a.to_string());
    let section = after.as_deref().and_then(exit_section);
    let cmd = match section {
        Some(_) => cmd.after_help(None::<&str>).after_long_help(None::<&str>),
        None => cmd,
    };
    let man = clap_mangen::Man::new(cmd);
    let mut page = Vec::new();
    man.render(&mut page)?;
    let mut page = String::from_utf8(page)?;
    if let Some(section) = section {
        // Before VERSION, the last section clap_mangen writes for graphcheck's pages, as
        // man-pages(7) orders them.
        let at = page.find("\n.SH VERSION\n").map_or(page.len(), |i| i + 1);
        page.insert_str(at, &section.to_roff());
    }
    Ok((man.get_filename(), page.into_bytes()))
}

/// The exit codes (`Exit codes:` and a line or more per code) as a man page section.
fn exit_section(text: &str) -> Option<clap_mangen::roff::Roff> {
    use clap_mangen::roff::{Roff, bold, roman};
    let (title, items) = graphcheck_cli::reference::titled_list(text)?;
    let mut roff = Roff::new();
    roff.control("SH", [title.to_uppercase().as_str()]);
    for (code, meaning) in items {
        roff.control("TP", []);
        roff.text([bold(code)]);
        roff.text([roman(meaning)]);
    }
    Some(roff)
}

/// Writes `files` under `out`, and removes man pages that are no longer generated.
pub fn write(out: &Path, files: &Files) -> anyhow::Result<()> {
    crate::fixtures::write(out, files)?;
    for stray in strays(out, files) {
        let path = out.join(stray);
        std::fs::remove_file(&path)
            .map_err(|e| anyhow::anyhow!("failed to remove {}: {e}", path.display()))?;
    }
    Ok(())
}

/// What differs between `out` and `files`: files missing, files with other bytes, and
/// files of the man folder that are not generated. Sorted.
pub fn check(out: &Path, files: &Files) -> Vec<String> {
    let mut differ: Vec<String> = files
        .iter()
        .filter_map(|(rel, bytes)| match std::fs::read(out.join(rel)) {
            Ok(have) if &have == bytes => None,
            Ok(_) => Some(format!("{rel} (differs)")),
            Err(_) => Some(format!("{rel} (missing)")),
        })
        .collect();
    differ.extend(
        strays(out, files)
            .into_iter()
            .map(|rel| format!("{rel} (not generated)")),
    );
    differ.sort();
    differ
}

/// Files of the man folder under `out` that `files` does not hold (a page of a command
/// since removed), by path relative to `out`.
fn strays(out: &Path, files: &Files) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(out.join(MAN)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| format!("{MAN}/{}", e.file_name().to_string_lossy()))
        .filter(|rel| !files.contains_key(rel))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_command_and_the_reference() {
        let files = files().unwrap();
        let mut names: Vec<&str> = files.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "man/graphcheck-completions.1",
                "man/graphcheck-convert.1",
                "man/graphcheck-diff.1",
                "man/graphcheck-explain.1",
                "man/graphcheck-retarget.1",
                "man/graphcheck-schema.1",
                "man/graphcheck-show.1",
                "man/graphcheck-verify.1",
                "man/graphcheck.1",
                "reference/cli.md",
            ]
        );
    }

    /// `--check` right after writing finds nothing, and finds an edit and a stray page;
    /// writing again removes the stray.
    #[test]
    fn check_after_write_finds_no_difference() {
        let dir = tempfile::tempdir().unwrap();
        let files = files().unwrap();
        write(dir.path(), &files).unwrap();
        assert_eq!(check(dir.path(), &files), Vec::<String>::new());
        std::fs::write(dir.path().join(REFERENCE), "# edited\n").unwrap();
        std::fs::write(dir.path().join("man/graphcheck-gone.1"), ".TH gone\n").unwrap();
        assert_eq!(
            check(dir.path(), &files),
            vec![
                "man/graphcheck-gone.1 (not generated)".to_string(),
                "reference/cli.md (differs)".to_string(),
            ]
        );
        write(dir.path(), &files).unwrap();
        assert_eq!(check(dir.path(), &files), Vec::<String>::new());
    }
}
