//! The command line's reference page in Markdown (`docs/reference/cli.md`), rendered from
//! the clap definitions by walking [`clap::Command`], so it says what `--help` says.

use std::fmt::Write as _;

use clap::{Arg, Command};

/// The command that writes the reference page and the man pages, as the page names it.
pub const REGENERATE: &str = "cargo run -p graphcheck-gen -- docs";

/// The reference page: an opening line saying how it is made, then one `##` section per
/// command, the top command first and its subcommands in the order `--help` lists them,
/// each with its description, usage line, arguments, options and exit codes.
pub fn reference_markdown() -> String {
    let mut cmd = crate::command();
    // Built, clap has added `--help` and `--version` and named each subcommand
    // `graphcheck verify` as its usage line does.
    cmd.build();
    let mut out = String::from("# Command-line reference\n\n");
    let _ = writeln!(
        out,
        "Generated from the command-line definitions (`cli/src/lib.rs`) by `{REGENERATE}`: \
         edit those and run it, not this page. `graphcheck --help` and \
         `graphcheck COMMAND --help` print the same text.\n"
    );
    let mut stack = vec![&cmd];
    while let Some(c) = stack.pop() {
        section(&mut out, c);
        let subs: Vec<&Command> = documented(c).collect();
        stack.extend(subs.into_iter().rev());
    }
    // One newline at the end, as every text file of the repository has.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// The subcommands a reader is told about, in `--help`'s order: clap's own `help`
/// subcommand is not graphcheck's to document (the man pages leave it out too).
pub fn documented(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// The page's heading of a command, which is also its full name: `graphcheck verify`.
fn full_name(cmd: &Command) -> &str {
    cmd.get_bin_name().unwrap_or(cmd.get_name())
}

/// The anchor mkdocs gives a `##` heading of plain words: lowercase, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading.to_lowercase().replace(' ', "-")
}

fn section(out: &mut String, cmd: &Command) {
    let name = full_name(cmd);
    let _ = writeln!(out, "## {name}\n");
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        paragraphs(out, &about.to_string());
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage);
    let _ = writeln!(out, "```text\n{}\n```\n", usage.trim_end());

    let subs: Vec<&Command> = documented(cmd).collect();
    if !subs.is_empty() {
        out.push_str("### Commands\n\n");
        for sub in subs {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            let _ = writeln!(
                out,
                "- [`{}`](#{}): {}",
                sub.get_name(),
                anchor(full_name(sub)),
                escape(&about)
            );
        }
        out.push('\n');
    }
    let args: Vec<&Arg> = cmd.get_arguments().filter(|a| !a.is_hide_set()).collect();
    for (title, positional) in [("Arguments", true), ("Options", false)] {
        let these: Vec<&Arg> = args
            .iter()
            .copied()
            .filter(|a| a.is_positional() == positional)
            .collect();
        if these.is_empty() {
            continue;
        }
        let _ = writeln!(out, "### {title}\n");
        for arg in these {
            argument(out, cmd, arg);
        }
    }
    if let Some(after) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        after_help(out, &after.to_string());
    }
}

/// One argument or option as a list item: its spelling and value names, whether it is
/// required, its help, default, possible values with their help, and what it excludes.
fn argument(out: &mut String, cmd: &Command, arg: &Arg) {
    // `Arg`'s Display is the spelling of clap's usage and error lines: `--format <FORMAT>`,
    // `<DOCUMENT>...`; it names the long form only, so the short one is added before it.
    let spelling = match (arg.get_short(), arg.get_long()) {
        (Some(s), Some(_)) => format!("-{s}, {arg}"),
        _ => arg.to_string(),
    };
    let required = if arg.is_required_set() {
        " (required)"
    } else {
        ""
    };
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let mut help = help.split("\n\n").map(str::trim).filter(|p| !p.is_empty());
    let first = help.next().unwrap_or("");
    let _ = writeln!(
        out,
        "- `{spelling}`{required}: {}",
        escape(&join_lines(first))
    );
    for p in help {
        let _ = write!(out, "\n    {}\n", escape(&join_lines(p)));
    }
    let mut facts = Vec::new();
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    // A flag's default (`false`) says nothing its help does not.
    let takes_value = arg.get_action().takes_values();
    if takes_value && !defaults.is_empty() && !arg.is_hide_default_value_set() {
        facts.push(format!("Default: {}.", defaults.join(", ")));
    }
    let conflicts: Vec<String> = cmd
        .get_arg_conflicts_with(arg)
        .iter()
        .map(|c| format!("`{}`", short_name(c)))
        .collect();
    if !conflicts.is_empty() {
        facts.push(format!("Not with {}.", conflicts.join(", ")));
    }
    if !facts.is_empty() {
        let _ = write!(out, "\n    {}\n", facts.join(" "));
    }
    let values: Vec<_> = arg
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .collect();
    if !values.is_empty() && !arg.is_hide_possible_values_set() {
        out.push_str("\n    Possible values:\n\n");
        for v in values {
            match v.get_help() {
                Some(h) => {
                    let h = escape(&join_lines(&h.to_string()));
                    let _ = writeln!(out, "    - `{}`: {h}", v.get_name());
                }
                None => {
                    let _ = writeln!(out, "    - `{}`", v.get_name());
                }
            }
        }
    }
    out.push('\n');
}

/// How the page names an argument in a sentence: `--kernel`, `-x`, `<TARGET>`.
fn short_name(arg: &Arg) -> String {
    match (arg.get_long(), arg.get_short()) {
        (Some(l), _) => format!("--{l}"),
        (None, Some(s)) => format!("-{s}"),
        (None, None) => arg.to_string(),
    }
}

/// The text after a command's help. The exit codes (`Exit codes:` then `  CODE  meaning`
/// lines, a meaning's further lines indented deeper) become a `###` section with a list
/// item per code; any other text is shown as `--help` prints it.
fn after_help(out: &mut String, text: &str) {
    match titled_list(text) {
        Some((title, items)) => {
            let _ = writeln!(out, "### {title}\n");
            for (key, meaning) in items {
                let _ = writeln!(out, "- `{key}`: {}", escape(&meaning));
            }
            out.push('\n');
        }
        None => {
            let _ = writeln!(out, "```text\n{}\n```\n", text.trim_end());
        }
    }
}

/// `Title:` followed by items `  KEY  text`, each item's further lines indented deeper than
/// its key (the shape of [`crate::EXIT_CODES`]): the title and the items, their lines
/// joined; `None` for text of another shape. The man pages read the exit codes with it too.
pub fn titled_list(text: &str) -> Option<(&str, Vec<(String, String)>)> {
    let mut lines = text.lines();
    let title = lines.next()?.strip_suffix(':')?;
    let mut items: Vec<(String, String)> = Vec::new();
    let mut key_indent = None;
    for line in lines {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if indent == 0 || trimmed.is_empty() {
            return None;
        }
        if *key_indent.get_or_insert(indent) == indent {
            let (key, meaning) = trimmed.split_once("  ")?;
            items.push((key.to_string(), meaning.trim().to_string()));
        } else {
            let (_, meaning) = items.last_mut()?;
            meaning.push(' ');
            meaning.push_str(trimmed);
        }
    }
    (!items.is_empty()).then_some((title, items))
}

/// Paragraphs, each on a line of its own (clap keeps a blank line between them).
fn paragraphs(out: &mut String, text: &str) {
    for p in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        let _ = writeln!(out, "{}\n", escape(&join_lines(p)));
    }
}

/// A paragraph on one line: Markdown would join its lines anyway, and a line that happens
/// to start with `-` or `1.` would start a list.
fn join_lines(p: &str) -> String {
    p.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// Help text as Markdown prose: outside code spans, the characters Markdown would read as
/// emphasis, links or HTML are escaped, so `[[allow]]` and `<FILE>` print as written.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, piece) in text.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        // Odd pieces are inside a code span, which Markdown prints as is.
        if i % 2 == 1 {
            out.push_str(piece);
            continue;
        }
        for c in piece.chars() {
            match c {
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '*' | '_' | '[' | ']' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                c => out.push(c),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of the page outside its ```text blocks, with code spans removed.
    fn prose(page: &str) -> Vec<String> {
        let mut lines = Vec::new();
        let mut fenced = false;
        for line in page.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if !fenced {
                let outside: String = line.split('`').step_by(2).collect();
                lines.push(outside);
            }
        }
        lines
    }

    #[test]
    fn every_command_argument_and_value_is_on_the_page_in_help_order() {
        let page = reference_markdown();
        let mut cmd = crate::command();
        cmd.build();
        let mut at = 0;
        for sub in std::iter::once(&cmd).chain(documented(&cmd)) {
            let heading = format!("\n## {}\n", full_name(sub));
            let found = page[at..].find(&heading).map(|i| at + i);
            let start = found.unwrap_or_else(|| panic!("no {heading:?} after byte {at}"));
            let end = page[start + 1..]
                .find("\n## ")
                .map_or(page.len(), |i| start + 1 + i);
            let text = &page[start..end];
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                assert!(
                    text.contains(&format!("`{arg}`")) || text.contains(&format!(", {arg}`")),
                    "{}: {arg} missing",
                    full_name(sub)
                );
                for v in arg.get_possible_values() {
                    assert!(
                        text.contains(&format!("- `{}`", v.get_name())),
                        "{}: {arg}'s value {} missing",
                        full_name(sub),
                        v.get_name()
                    );
                }
            }
            assert!(
                text.contains("### Exit codes\n\n- `0`: "),
                "{}",
                full_name(sub)
            );
            at = start + 1;
        }
        assert!(page.contains("[`completions`](#graphcheck-completions)"));
    }

    /// mkdocs-material serves the page: no raw HTML, and no fence but the usage lines'.
    #[test]
    fn the_page_has_no_raw_html_and_only_text_fences() {
        let page = reference_markdown();
        for line in page.lines().filter(|l| l.starts_with("```")) {
            assert!(line == "```text" || line == "```", "{line}");
        }
        for line in prose(&page) {
            assert!(!line.contains('<') && !line.contains('>'), "{line}");
        }
        assert!(page.ends_with('\n') && !page.ends_with("\n\n"));
    }

    #[test]
    fn escape_leaves_code_spans_and_escapes_markup_outside_them() {
        assert_eq!(
            escape("TOML: [[allow]] path, `a_b <c>` and <FILE> *x*"),
            "TOML: \\[\\[allow\\]\\] path, `a_b <c>` and &lt;FILE&gt; \\*x\\*"
        );
    }

    /// The exit codes' shape is read as a list; text of another shape is kept as printed.
    #[test]
    fn after_help_of_another_shape_is_kept_whole() {
        let codes = titled_list("Exit codes:\n  0  fine;\n     really\n  2  bad").unwrap();
        assert_eq!(codes.0, "Exit codes");
        assert_eq!(
            codes.1,
            vec![
                ("0".to_string(), "fine; really".to_string()),
                ("2".to_string(), "bad".to_string())
            ]
        );
        assert_eq!(titled_list("Notes: see the README"), None);
        assert_eq!(titled_list("Notes:\nflush left"), None);
        let mut out = String::new();
        after_help(&mut out, "See the README.");
        assert_eq!(out, "```text\nSee the README.\n```\n\n");
    }
}
