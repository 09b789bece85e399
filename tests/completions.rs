//! What a user installs beside the binary: the completion script `graphcheck completions
//! SHELL` prints (each names every command; bash's completes, each shell installed here
//! parses its own) and the man pages of `docs/man/` (a page per command, the top page
//! naming them all, each rendered without a warning where groff or man is installed).
//! A check whose tool is missing here says so on stderr and is not counted as done.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "support/mod.rs"]
#[allow(dead_code)] // the snapshot helpers are `cli`'s and `ranks`'
mod support;
use support::{graphcheck, root, text};

/// The subcommands a user is told about, as `graphcheck --help` lists them (clap's own
/// `help` aside).
fn commands() -> Vec<String> {
    let mut cmd = graphcheck_cli::command();
    cmd.build();
    graphcheck_cli::reference::documented(&cmd)
        .map(|c| c.get_name().to_string())
        .collect()
}

/// `graphcheck completions SHELL`, checked to succeed quietly and to name every command.
fn script(shell: &str) -> String {
    let out = graphcheck(&["completions", shell]);
    assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "{shell}");
    let script = text(&out.stdout);
    for name in commands() {
        assert!(
            script.contains(&name),
            "the {shell} script never names {name}"
        );
    }
    script
}

/// The script written to a file of its own, for a shell to read.
fn script_file(shell: &str, dir: &Path) -> PathBuf {
    let path = dir.join(format!("graphcheck.{shell}"));
    std::fs::write(&path, script(shell)).unwrap();
    path
}

/// Runs `program` with `args`; `None` where the program is not installed.
fn run(program: &str, args: &[&str]) -> Option<Output> {
    match Command::new(program).args(args).output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => panic!("cannot run {program}: {e}"),
    }
}

/// What bash's completion offers for `words` (the word completed last), through the
/// function the script registers with `complete -F`, called as bash calls it.
fn bash_completes(script: &Path, words: &[&str]) -> Vec<String> {
    let program = r#"
        source "$1" || exit 3
        fn=$(complete -p graphcheck | sed -n 's/.*-F \([^ ]*\).*/\1/p')
        [ -n "$fn" ] || { echo "the script registers no function for graphcheck" >&2; exit 4; }
        shift
        COMP_WORDS=("$@")
        COMP_CWORD=$(($# - 1))
        COMP_LINE="$*"
        COMP_POINT=${#COMP_LINE}
        "$fn" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
        printf '%s\n' "${COMPREPLY[@]}"
    "#;
    let mut args = vec!["--norc", "--noprofile", "-c", program, "bash"];
    args.push(script.to_str().unwrap());
    args.extend(words);
    let out = run("bash", &args).expect("bash is installed");
    assert!(out.status.success(), "{words:?}: {}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn the_bash_script_parses_and_completes_a_command_and_an_option() {
    let dir = tempfile::tempdir().unwrap();
    let file = script_file("bash", dir.path());
    let out = run("bash", &["-n", file.to_str().unwrap()]).expect("bash is installed");
    assert!(out.status.success(), "bash -n: {}", text(&out.stderr));
    assert_eq!(bash_completes(&file, &["graphcheck", "ve"]), ["verify"]);
    assert_eq!(
        bash_completes(&file, &["graphcheck", "verify", "--fo"]),
        ["--format"]
    );
    assert_eq!(
        bash_completes(&file, &["graphcheck", "completions", "f"]),
        ["fish"]
    );
}

/// Checks the script of `shell` with `check` (the shell's parse-only mode) where the shell
/// is installed; says on stderr that it did not where it is not.
fn parses_where_installed(shell: &str, check: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let file = script_file(shell, dir.path());
    let mut args = check.to_vec();
    args.push(file.to_str().unwrap());
    match run(shell, &args) {
        Some(out) => assert!(
            out.status.success() && out.stderr.is_empty(),
            "{shell} {}: {}",
            check.join(" "),
            text(&out.stderr)
        ),
        None => eprintln!(
            "not checked: `{shell} {}` on the {shell} script, as {shell} is not installed \
             (the script was checked to name every command only)",
            check.join(" ")
        ),
    }
}

#[test]
fn the_zsh_script_names_every_command_and_parses_where_zsh_is_installed() {
    parses_where_installed("zsh", &["-n"]);
}

#[test]
fn the_fish_script_names_every_command_and_parses_where_fish_is_installed() {
    parses_where_installed("fish", &["--no-execute"]);
}

/// No elvish or PowerShell parse check: neither is packaged where CI runs.
#[test]
fn the_elvish_and_powershell_scripts_name_every_command() {
    script("elvish");
    script("powershell");
}

#[test]
fn a_bad_shell_name_is_a_usage_error() {
    let out = graphcheck(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stdout), "");
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: invalid value 'tcsh' for '<SHELL>'"),
        "{err}"
    );
    assert!(
        err.contains("[possible values: bash, zsh, fish, elvish, powershell]"),
        "{err}"
    );
    let out = graphcheck(&["completions"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("<SHELL>"),
        "{}",
        text(&out.stderr)
    );
}

fn man_dir() -> PathBuf {
    root().join("docs/man")
}

#[test]
fn every_command_has_a_man_page_and_the_top_page_names_them_all() {
    let top = std::fs::read_to_string(man_dir().join("graphcheck.1"))
        .expect("docs/man/graphcheck.1 (run `cargo run -p graphcheck-gen -- docs`)");
    assert!(top.contains(".TH graphcheck 1 "), "{top}");
    for name in commands() {
        let page = man_dir().join(format!("graphcheck-{name}.1"));
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(
            text.contains(&format!(".TH graphcheck-{name} 1 ")),
            "{}",
            page.display()
        );
        assert!(text.contains(".SH \"EXIT CODES\""), "{}", page.display());
        // roff spells a hyphen `\-`.
        assert!(
            top.contains(&format!("graphcheck\\-{name}(1)")),
            "graphcheck.1 does not list {name}"
        );
    }
}

#[test]
fn the_man_pages_render_without_warnings_where_groff_is_installed() {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(man_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pages.sort();
    assert!(pages.len() > commands().len(), "{pages:?}");
    for page in &pages {
        let page = page.to_str().unwrap();
        // Every warning but `break`: a long path in a narrow indent that cannot be
        // justified is typography, not a fault of the page. `-k` reads UTF-8 (`…`), as
        // man does.
        let groff = ["-k", "-man", "-Tutf8", "-ww", "-Wbreak", "-z", page];
        let (how, out) = match run("groff", &groff) {
            Some(out) => ("groff", out),
            None => match run("man", &["--warnings", "-l", page]) {
                Some(out) => ("man", out),
                None => {
                    eprintln!(
                        "not checked: the man pages render without warnings, as neither \
                         groff nor man is installed"
                    );
                    return;
                }
            },
        };
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{how} on {page}: {}",
            text(&out.stderr)
        );
    }
}
