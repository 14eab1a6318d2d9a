//! The command line of an example script: `TrainingArguments` flags through
//! `HfArgumentParser::parse_known_args`, then the script's own flags from what is left
//! (`--flag value`, `--flag=value`, a bool flag alone meaning true, dashes or underscores).

use tchtrain_training_args::{HfArgumentParser, Seq2SeqTrainingArguments, TrainingArguments};

use crate::error::{Error, Result};

/// One of the script's own flags: its name (underscores) and value, if it had one.
pub(crate) type RawFlag = (String, Option<String>);

/// A script's own flags: applies one flag, `Ok(false)` when the name is not one of them.
pub(crate) trait ScriptFlags {
    /// Sets the field `name` from `value`.
    fn apply(&mut self, name: &str, value: Option<&str>) -> Result<bool>;

    /// The flags that take several values (`nargs="+"`): their values come to
    /// [`apply`](Self::apply) joined by newlines.
    fn list_flags(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Splits `argv` into `TrainingArguments` and the script's flags, applied to `flags`.
/// `--help` returns the help with `script_help` (the script's flags) in front.
pub(crate) fn parse<I, S>(
    argv: I,
    script_help: &str,
    flags: &mut dyn ScriptFlags,
) -> Result<TrainingArguments>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let parser = HfArgumentParser::new();
    let (parsed, rest) = match parser.parse_known_args(&argv) {
        Ok(r) => r,
        Err(tchtrain_training_args::Error::HelpRequested(help)) => {
            return Err(Error::TrainingArgs(
                tchtrain_training_args::Error::HelpRequested(format!("{script_help}\n{help}")),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    // Upstream's scripts: `logging.basicConfig(...)`, then the process's log level.
    tchtrain_trainer::init_logging(&parsed.args);
    for w in parsed.warnings() {
        log::warn!("{w}");
    }
    apply_rest(&rest, flags)?;
    Ok(parsed.into_args())
}

/// [`parse`] for the seq2seq scripts: `Seq2SeqTrainingArguments` flags
/// (`HfArgumentParser::for_seq2seq().parse_seq2seq_known_args`), then the script's own.
pub(crate) fn parse_seq2seq<I, S>(
    argv: I,
    script_help: &str,
    flags: &mut dyn ScriptFlags,
) -> Result<Seq2SeqTrainingArguments>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let argv: Vec<String> = argv.into_iter().map(|a| a.as_ref().to_string()).collect();
    let parser = HfArgumentParser::for_seq2seq();
    let (parsed, rest) = match parser.parse_seq2seq_known_args(&argv) {
        Ok(r) => r,
        Err(tchtrain_training_args::Error::HelpRequested(help)) => {
            return Err(Error::TrainingArgs(
                tchtrain_training_args::Error::HelpRequested(format!("{script_help}\n{help}")),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    tchtrain_trainer::init_logging(&parsed.args.base);
    for w in parsed.warnings() {
        log::warn!("{w}");
    }
    apply_rest(&rest, flags)?;
    Ok(parsed.into_args())
}

/// Applies the flags `TrainingArguments` left to the script's own.
fn apply_rest(rest: &[String], flags: &mut dyn ScriptFlags) -> Result<()> {
    for (name, value) in split_flags_with_lists(rest, flags.list_flags())? {
        if !flags.apply(&name, value.as_deref())? {
            return Err(Error::InvalidFlag {
                flag: name,
                detail: "unrecognized argument (see --help for the script's flags and every TrainingArguments flag)".into(),
            });
        }
    }
    Ok(())
}

/// `--name value`, `--name=value` or `--name` pairs; names with `-` spelled `_`.
pub(crate) fn split_flags(rest: &[String]) -> Result<Vec<RawFlag>> {
    split_flags_with_lists(rest, &[])
}

/// [`split_flags`] where the flags `lists` names take every value up to the next flag
/// (joined by newlines).
pub(crate) fn split_flags_with_lists(rest: &[String], lists: &[&str]) -> Result<Vec<RawFlag>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        let Some(body) = arg.strip_prefix("--") else {
            return Err(Error::InvalidFlag {
                flag: arg.clone(),
                detail: "unexpected positional argument".into(),
            });
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None if lists.contains(&body.replace('-', "_").as_str()) => {
                let mut values = Vec::new();
                while let Some(next) = rest.get(i + 1).filter(|n| !n.starts_with("--")) {
                    values.push(next.clone());
                    i += 1;
                }
                (
                    body.to_string(),
                    (!values.is_empty()).then(|| values.join("\n")),
                )
            }
            None => match rest.get(i + 1) {
                Some(next) if !next.starts_with("--") => {
                    i += 1;
                    (body.to_string(), Some(next.clone()))
                }
                _ => (body.to_string(), None),
            },
        };
        out.push((name.replace('-', "_"), value));
        i += 1;
    }
    Ok(out)
}

/// A flag's value, required.
pub(crate) fn string(name: &str, value: Option<&str>) -> Result<String> {
    value.map(str::to_string).ok_or_else(|| Error::InvalidFlag {
        flag: name.to_string(),
        detail: "expected one argument".into(),
    })
}

/// A flag's value as a number.
pub(crate) fn number<T: std::str::FromStr>(name: &str, value: Option<&str>) -> Result<T> {
    let v = string(name, value)?;
    v.parse().map_err(|_| Error::InvalidFlag {
        flag: name.to_string(),
        detail: format!("invalid number: '{v}'"),
    })
}

/// A bool flag as `HfArgumentParser` reads it: alone means true, else
/// `true/false/yes/no/1/0` in any case.
pub(crate) fn boolean(name: &str, value: Option<&str>) -> Result<bool> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("true" | "yes" | "t" | "y" | "1") => Ok(true),
        Some("false" | "no" | "f" | "n" | "0") => Ok(false),
        Some(other) => Err(Error::InvalidFlag {
            flag: name.to_string(),
            detail: format!(
                "Truthy value expected: got {other} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_flag_forms() {
        let rest: Vec<String> = [
            "--block-size",
            "64",
            "--keep_linebreaks",
            "--x=1",
            "--y",
            "-2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let flags = split_flags(&rest).unwrap();
        assert_eq!(
            flags,
            vec![
                ("block_size".into(), Some("64".into())),
                ("keep_linebreaks".into(), None),
                ("x".into(), Some("1".into())),
                ("y".into(), Some("-2".into())),
            ]
        );
        assert!(split_flags(&["stray".to_string()]).is_err());
        assert!(boolean("b", Some("False")).is_ok_and(|b| !b));
        assert!(boolean("b", Some("maybe")).is_err());
        assert!(number::<usize>("n", Some("x")).is_err());
    }
}
