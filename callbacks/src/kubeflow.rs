//! `KubeflowCallback` (upstream integrations/integration_utils.py): the training progress
//! reported to the Kubeflow Trainer controller of a TrainJob pod, as upstream reports it. The
//! controller injects `KUBEFLOW_TRAINER_SERVER_URL` (its status endpoint),
//! `KUBEFLOW_TRAINER_SERVER_TOKEN` (the path of the pod's service-account token) and
//! `KUBEFLOW_TRAINER_SERVER_CA_CERT` (the path of the CA certificate the endpoint's TLS
//! certificate is checked against; without it, the system's roots).
//!
//! Each update is a `POST` of `{"trainerStatus": {"lastUpdatedTime", "progressPercentage",
//! "estimatedRemainingSeconds", "metrics": [{"name", "value"}]}}` (Python's `json.dumps`;
//! values as Python's `str`) with `Authorization: Bearer <token>`: at `on_train_begin` (0 %,
//! `total_steps`), at `on_step_end` at most every 5 seconds (the step's percentage, capped at
//! 99, the remaining time from the mean step time so far, the numbers of the last logs with
//! `current_step`, `total_steps` and `current_epoch` rounded to 2 places) and at
//! `on_train_end` (100 %, 0 s, the last logs' numbers). On the first process only. As
//! upstream, a failed update (no token file, an unreachable controller, an error status) is
//! logged at debug level and never stops training. The token file is read again after 5
//! minutes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tchtrain_training_args::{JsonMap, JsonValue, TrainingArguments, dumps, python_float_repr};

use crate::error::{Error, Result};
use crate::trainer_callback::TrainerCallback;
use crate::trainer_control::TrainerControl;
use crate::trainer_state::TrainerState;

/// Upstream's `_MIN_UPDATE_INTERVAL`: step updates at most this often.
pub const MIN_UPDATE_INTERVAL: Duration = Duration::from_secs(5);
/// Upstream's `_TOKEN_CACHE_DURATION`.
const TOKEN_CACHE_DURATION: Duration = Duration::from_secs(300);
/// Upstream's request timeout.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Upstream `is_kubeflow_available`: `KUBEFLOW_TRAINER_SERVER_URL` is set, and
/// `DISABLE_KUBEFLOW_INTEGRATION` is not `TRUE`.
pub fn is_kubeflow_available() -> bool {
    !std::env::var("DISABLE_KUBEFLOW_INTEGRATION").is_ok_and(|v| v.to_uppercase() == "TRUE")
        && std::env::var_os("KUBEFLOW_TRAINER_SERVER_URL").is_some()
}

/// Where `KubeflowCallback` reports, as the controller injects it.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeflowSettings {
    /// `KUBEFLOW_TRAINER_SERVER_URL`.
    pub server_url: String,
    /// `KUBEFLOW_TRAINER_SERVER_TOKEN`: the token file's path.
    pub token_path: Option<PathBuf>,
    /// `KUBEFLOW_TRAINER_SERVER_CA_CERT`: the CA certificate's path (PEM).
    pub ca_cert: Option<PathBuf>,
    /// Step updates at most this often ([`MIN_UPDATE_INTERVAL`]).
    pub min_update_interval: Duration,
}

impl KubeflowSettings {
    /// From the environment; an error naming `KUBEFLOW_TRAINER_SERVER_URL` when it is unset
    /// (upstream's `RuntimeError`).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the environment given as a function.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let disabled =
            lookup("DISABLE_KUBEFLOW_INTEGRATION").is_some_and(|v| v.to_uppercase() == "TRUE");
        match lookup("KUBEFLOW_TRAINER_SERVER_URL") {
            Some(server_url) if !disabled => Ok(Self {
                server_url,
                token_path: lookup("KUBEFLOW_TRAINER_SERVER_TOKEN").filter(|p| !p.is_empty()).map(PathBuf::from),
                ca_cert: lookup("KUBEFLOW_TRAINER_SERVER_CA_CERT").filter(|p| !p.is_empty()).map(PathBuf::from),
                min_update_interval: MIN_UPDATE_INTERVAL,
            }),
            _ => Err(Error::KubeflowSetting {
                setting: "KUBEFLOW_TRAINER_SERVER_URL".into(),
                reason: "KubeflowCallback requires KUBEFLOW_TRAINER_SERVER_URL environment variable to be set. This is automatically set when running inside a Kubeflow TrainJob with TrainJobRuntimeStatus enabled.".into(),
            }),
        }
    }
}

/// Python's `str` of a log value (numbers only reach the reports).
fn python_str(v: &JsonValue) -> String {
    match v {
        JsonValue::Bool(b) => if *b { "True" } else { "False" }.into(),
        JsonValue::Int(i) => i.to_string(),
        JsonValue::Float(x) => python_float_repr(*x),
        other => dumps(other, None, false),
    }
}

/// Python's `round(x, 2)`: the nearest of the two-place decimals, ties to even, as a float.
fn round2(x: f64) -> f64 {
    let scaled = format!("{x:.2}");
    scaled.parse().unwrap_or(x)
}

/// `datetime.now(UTC).isoformat()`.
fn utc_now_iso() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let (year, month, day, hour, minute, second) =
        crate::checksum_time::utc_parts(d.as_secs() as i64);
    let micros = d.subsec_micros();
    let fraction = if micros == 0 {
        String::new()
    } else {
        format!(".{micros:06}")
    };
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{fraction}+00:00")
}

/// Upstream `KubeflowCallback`: training progress to the Kubeflow Trainer controller (see the
/// module's documentation).
pub struct KubeflowCallback {
    settings: KubeflowSettings,
    agent: Option<ureq::Agent>,
    initialized: bool,
    metrics: Vec<(String, JsonValue)>,
    start: Option<Instant>,
    last_update: Option<Instant>,
    token: Option<(String, Instant)>,
}

impl std::fmt::Debug for KubeflowCallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeflowCallback")
            .field("settings", &self.settings)
            .field("initialized", &self.initialized)
            .finish()
    }
}

impl KubeflowCallback {
    /// Settings from the environment ([`KubeflowSettings::from_env`]).
    pub fn new() -> Result<Self> {
        Ok(Self::with_settings(KubeflowSettings::from_env()?))
    }

    /// With the given settings.
    pub fn with_settings(settings: KubeflowSettings) -> Self {
        Self {
            settings,
            agent: None,
            initialized: false,
            metrics: Vec::new(),
            start: None,
            last_update: None,
            token: None,
        }
    }

    /// The HTTP client: TLS checked against the CA certificate when one is named (upstream's
    /// `ssl.create_default_context(cafile=...)`; one that cannot be read is logged and the
    /// system's roots used, as upstream falls back to its default context).
    fn agent(&mut self) -> &ureq::Agent {
        let ca_cert = self.settings.ca_cert.clone();
        self.agent.get_or_insert_with(|| {
            let builder = ureq::AgentBuilder::new().timeout(TIMEOUT);
            let tls = ca_cert.and_then(|path| match tls_config(&path) {
                Ok(config) => Some(config),
                Err(e) => {
                    log::warn!(
                        "[Kubeflow] Failed to create SSL context with CA file {}: {e}",
                        path.display()
                    );
                    None
                }
            });
            match tls {
                Some(config) => builder.tls_config(config),
                None => builder,
            }
            .build()
        })
    }

    /// Upstream `_get_token`: the token file's content, read again after 5 minutes.
    fn token(&mut self) -> Option<String> {
        if let Some((token, read)) = &self.token
            && read.elapsed() < TOKEN_CACHE_DURATION
        {
            return Some(token.clone());
        }
        let path = self.settings.token_path.as_ref()?;
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let token = text.trim().to_string();
                self.token = Some((token.clone(), Instant::now()));
                Some(token)
            }
            Err(e) => {
                log::debug!(
                    "[Kubeflow] Token file not readable: {}: {e}",
                    path.display()
                );
                None
            }
        }
    }

    /// Upstream `_update_status`; whether the controller answered 200.
    fn update_status(
        &mut self,
        progress: Option<i64>,
        remaining: Option<f64>,
        metrics: &[(String, JsonValue)],
        force: bool,
    ) -> bool {
        if !force
            && self
                .last_update
                .is_some_and(|t| t.elapsed() < self.settings.min_update_interval)
        {
            return false;
        }
        self.last_update = Some(Instant::now());
        let Some(token) = self.token() else {
            return false;
        };
        let mut status = JsonMap::new();
        status.insert("lastUpdatedTime", utc_now_iso());
        if let Some(p) = progress {
            status.insert("progressPercentage", p.clamp(0, 100));
        }
        if let Some(r) = remaining {
            status.insert("estimatedRemainingSeconds", (r as i64).max(0));
        }
        if !metrics.is_empty() {
            status.insert(
                "metrics",
                JsonValue::Array(
                    metrics
                        .iter()
                        .map(|(k, v)| {
                            let mut m = JsonMap::new();
                            m.insert("name", k.clone());
                            m.insert("value", python_str(v));
                            JsonValue::Object(m)
                        })
                        .collect(),
                ),
            );
        }
        let mut body = JsonMap::new();
        body.insert("trainerStatus", JsonValue::Object(status));
        let body = dumps(&JsonValue::Object(body), None, false);
        let url = self.settings.server_url.clone();
        match self
            .agent()
            .post(&url)
            .set("Authorization", &format!("Bearer {token}"))
            .set("Content-Type", "application/json")
            .send_bytes(body.as_bytes())
        {
            Ok(response) => response.status() == 200,
            Err(e) => {
                log::debug!("[Kubeflow] Failed to update status: {e}");
                false
            }
        }
    }
}

/// A rustls client configuration trusting the certificates of a PEM file.
fn tls_config(path: &std::path::Path) -> std::result::Result<Arc<rustls::ClientConfig>, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| e.to_string())? {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate in the file".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

impl TrainerCallback for KubeflowCallback {
    fn name(&self) -> &str {
        "KubeflowCallback"
    }

    fn on_train_begin(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if !state.is_world_process_zero {
            return Ok(());
        }
        self.start = Some(Instant::now());
        self.metrics.clear();
        self.initialized = true;
        let metrics = if state.max_steps > 0 {
            vec![("total_steps".to_string(), JsonValue::Int(state.max_steps))]
        } else {
            Vec::new()
        };
        self.update_status(Some(0), None, &metrics, true);
        Ok(())
    }

    fn on_log(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
        logs: &JsonMap,
    ) -> Result<()> {
        if !self.initialized || !state.is_world_process_zero {
            return Ok(());
        }
        for (k, v) in logs.iter() {
            if matches!(
                v,
                JsonValue::Int(_) | JsonValue::Float(_) | JsonValue::Bool(_)
            ) {
                match self.metrics.iter_mut().find(|(key, _)| key == k) {
                    Some(entry) => entry.1 = v.clone(),
                    None => self.metrics.push((k.to_string(), v.clone())),
                }
            }
        }
        Ok(())
    }

    fn on_step_end(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if !self.initialized || !state.is_world_process_zero || state.max_steps <= 0 {
            return Ok(());
        }
        let progress = (state.global_step * 100 / state.max_steps).min(99);
        let remaining = self.start.filter(|_| state.global_step > 0).map(|start| {
            let per_step = start.elapsed().as_secs_f64() / state.global_step as f64;
            (per_step * (state.max_steps - state.global_step) as f64).trunc()
        });
        let mut metrics = self.metrics.clone();
        for (k, v) in [
            ("current_step", JsonValue::Int(state.global_step)),
            ("total_steps", JsonValue::Int(state.max_steps)),
            ("current_epoch", JsonValue::Float(round2(state.epoch))),
        ] {
            match metrics.iter_mut().find(|(key, _)| key == k) {
                Some(entry) => entry.1 = v,
                None => metrics.push((k.to_string(), v)),
            }
        }
        self.update_status(Some(progress), remaining, &metrics, false);
        Ok(())
    }

    fn on_train_end(
        &mut self,
        _args: &TrainingArguments,
        state: &TrainerState,
        _control: &mut TrainerControl,
    ) -> Result<()> {
        if !self.initialized || !state.is_world_process_zero {
            return Ok(());
        }
        let metrics = self.metrics.clone();
        self.update_status(Some(100), Some(0.0), &metrics, true);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_pythons_str_and_round() {
        assert_eq!(python_str(&JsonValue::Float(0.0003)), "0.0003");
        assert_eq!(python_str(&JsonValue::Int(20)), "20");
        assert_eq!(python_str(&JsonValue::Bool(true)), "True");
        assert_eq!(python_str(&JsonValue::Float(1.0)), "1.0");
        // round(0.125, 2) == 0.12, round(0.375, 2) == 0.38 (ties to even on the exact value),
        // round(2.675, 2) == 2.67 (2.675 is below the tie in binary).
        assert_eq!(round2(0.125), 0.12);
        assert_eq!(round2(0.375), 0.38);
        assert_eq!(round2(2.675), 2.67);
        assert_eq!(round2(1.0 / 3.0), 0.33);
        let iso = utc_now_iso();
        assert!(
            iso.ends_with("+00:00") && iso.as_bytes()[10] == b'T',
            "{iso}"
        );
        let err = KubeflowSettings::from_lookup(|k| match k {
            "KUBEFLOW_TRAINER_SERVER_URL" => Some("http://127.0.0.1:1/".into()),
            "DISABLE_KUBEFLOW_INTEGRATION" => Some("true".into()),
            _ => None,
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("KUBEFLOW_TRAINER_SERVER_URL"), "{err}");
    }
}
