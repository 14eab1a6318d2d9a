//! `cargo xtask codegen [--check]`: the generated sources, regenerated from the pinned
//! Python packages (rust-analyzer's `cargo codegen` convention).
//!
//! Today two files: `training-args/src/field_table.rs`, which
//! `training-args/tools/gen_field_table.py` writes from the argparse actions that
//! transformers 5.23's `HfArgumentParser(TrainingArguments)` builds, and
//! `training-args/src/seq2seq_field_table.rs`, which
//! `training-args/tools/gen_seq2seq_field_table.py` writes from those of
//! `HfArgumentParser(Seq2SeqTrainingArguments)` (the fields it adds). `--check` writes
//! nothing and fails when the committed file differs from what the generator gives now
//! (`cargo xtask test` runs the check, so a stale table fails the suite).

use std::path::Path;
use std::process::Command;

use crate::cmd;
use crate::setup;

/// One generated file: where it lives and the generator script that prints it.
struct Generated {
    file: &'static str,
    script: &'static str,
}

const GENERATED: &[Generated] = &[
    Generated {
        file: "training-args/src/field_table.rs",
        script: "training-args/tools/gen_field_table.py",
    },
    Generated {
        file: "training-args/src/seq2seq_field_table.rs",
        script: "training-args/tools/gen_seq2seq_field_table.py",
    },
];

/// The command's options.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Compare instead of writing.
    pub check: bool,
}

impl Options {
    /// Parses `codegen`'s arguments.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        for a in args {
            match a.as_str() {
                "--check" => o.check = true,
                other => {
                    return Err(format!(
                        "codegen: unknown option `{other}` (known: --check)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// Runs setup (for the virtualenv), then regenerates or checks every generated file.
pub fn run(args: &[String]) -> Result<(), String> {
    let o = Options::parse(args)?;
    let s = setup::run(&setup::Options::default())?;
    check_or_write(&s.python, o.check)
}

/// Regenerates (or, with `check`, compares) every generated file with `python`.
pub fn check_or_write(python: &Path, check: bool) -> Result<(), String> {
    let root = crate::paths::workspace_root();
    let mut stale = Vec::new();
    for g in GENERATED {
        let mut c = Command::new(python);
        c.current_dir(&root).arg(root.join(g.script));
        let fresh = cmd::output(&mut c, &format!("generating {}", g.file))?;
        let path = root.join(g.file);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        // The committed file is rustfmt's layout of the generator's output; layout is not
        // content, so the comparison ignores whitespace (and needs no rustfmt).
        if same_tokens(&current, &fresh) {
            println!("codegen: {} is up to date", g.file);
        } else if check {
            stale.push(g);
        } else {
            let formatted = rustfmt(&fresh)?;
            std::fs::write(&path, formatted)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("codegen: wrote {}", g.file);
        }
    }
    if stale.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = stale
        .iter()
        .map(|g| format!("{} (from {})", g.file, g.script))
        .collect();
    Err(format!(
        "generated files are stale: {}; run `cargo xtask codegen` and commit the result",
        names.join(", ")
    ))
}

/// Whether two sources are equal up to layout: every whitespace character removed, and the
/// trailing commas rustfmt adds before a closing bracket of a multi-line list.
fn same_tokens(a: &str, b: &str) -> bool {
    fn tokens(s: &str) -> Vec<char> {
        let mut out: Vec<char> = Vec::with_capacity(s.len());
        for c in s.chars().filter(|c| !c.is_whitespace()) {
            if matches!(c, ']' | ')' | '}') && out.last() == Some(&',') {
                out.pop();
            }
            out.push(c);
        }
        out
    }
    tokens(a) == tokens(b)
}

/// `source` laid out by `rustfmt --edition 2024` (stdin to stdout).
fn rustfmt(source: &str) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2024"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start rustfmt ({e}): `rustup component add rustfmt`"))?;
    child
        .stdin
        .take()
        .ok_or("rustfmt has no stdin")?
        .write_all(source.as_bytes())
        .map_err(|e| format!("writing to rustfmt: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for rustfmt: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "rustfmt failed ({}) on the generated source",
            out.status
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("rustfmt's output: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        assert_eq!(Options::parse(&[]).unwrap(), Options { check: false });
        assert_eq!(
            Options::parse(&["--check".into()]).unwrap(),
            Options { check: true }
        );
        assert!(
            Options::parse(&["--chek".into()])
                .unwrap_err()
                .contains("--check")
        );
    }

    #[test]
    fn layout_is_not_content() {
        assert!(same_tokens(
            "a: &[\n    \"x\",\n    \"y\",\n]",
            "a: &[\"x\", \"y\"]"
        ));
        assert!(same_tokens("S {\n    a: 1,\n}", "S { a: 1 }"));
        assert!(!same_tokens("a: 1", "a: 2"));
    }

    #[test]
    fn every_generator_and_file_exists() {
        let root = crate::paths::workspace_root();
        for g in GENERATED {
            assert!(root.join(g.file).is_file(), "{}", g.file);
            assert!(root.join(g.script).is_file(), "{}", g.script);
        }
    }
}
