//! Plain `argparse` flags for the scripts whose upstream builds an `argparse.ArgumentParser`
//! of its own rather than `HfArgumentParser` (`run_generation`, the hand-written
//! accelerate loop): `--flag value`, `--flag=value`, a bool flag alone meaning true, dashes
//! or underscores.

use crate::error::{Error, Result};

/// One flag: its name (underscores) and value, if it had one.
pub(crate) type RawFlag = (String, Option<String>);

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
