//! Running child processes with a readable error when they fail.

use std::process::{Command, Stdio};

/// `cargo` (the one running xtask) in the workspace's folder.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(crate::paths::workspace_root());
    c
}

/// Shows a command the way a user would type it.
pub fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command with inherited stdio; `what` says what it was for in the error.
pub fn status(cmd: &mut Command, what: &str) -> Result<(), String> {
    let shown = display(cmd);
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: could not start `{shown}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what}: `{shown}` failed ({status})"))
    }
}

/// Runs a command and returns its stdout (stderr is shown on failure).
pub fn output(cmd: &mut Command, what: &str) -> Result<String, String> {
    let shown = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: could not start `{shown}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what}: `{shown}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
