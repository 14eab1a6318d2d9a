//! The stand-in W&B server for tests ([`WandbStandIn`]): scripts/reference/_wandb_server.py
//! served by the setup virtualenv's python, recording each request a run in online mode makes
//! (GraphQL, the file stream, the uploads); the same script folds them as the reference folds
//! upstream's (wandb 0.31's) requests to it.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

/// The stand-in W&B server, serving until dropped.
#[derive(Debug)]
pub struct WandbStandIn {
    child: Child,
    log: PathBuf,
    /// Its base URL (`WANDB_BASE_URL`): `http://127.0.0.1:<port>`.
    pub url: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/_wandb_server.py")
}

fn python() -> Result<PathBuf> {
    std::env::var_os("TCHTRAIN_VENV_PYTHON")
        .map(PathBuf::from)
        .context("TCHTRAIN_VENV_PYTHON names the setup virtualenv's python (with wandb); run `cargo xtask setup`")
}

impl WandbStandIn {
    /// Starts the server; its request log goes to `<dir>/requests.jsonl`.
    pub fn start(dir: &Path) -> Result<Self> {
        let log = dir.join("requests.jsonl");
        let mut child = Command::new(python()?)
            .arg(script())
            .arg("serve")
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .context("starting _wandb_server.py")?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().context("its stdout")?).read_line(&mut line)?;
        let Some(port) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            bail!("the stand-in W&B server said {line:?}");
        };
        let url = format!("http://127.0.0.1:{port}");
        Ok(Self { child, log, url })
    }

    /// The requests received so far, folded (`_wandb_server.py fold`: run, config, history
    /// lines, summary, end of the file stream, uploaded files).
    pub fn fold(&self) -> Result<serde_json::Value> {
        let out = Command::new(python()?)
            .arg(script())
            .arg("fold")
            .arg(&self.log)
            .output()?;
        ensure!(
            out.status.success(),
            "folding the requests: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

impl Drop for WandbStandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
