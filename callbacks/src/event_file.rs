//! TensorBoard event files: TFRecord framing with masked CRC32C around hand-encoded
//! `tensorflow.Event` protobufs (scalars as `simple_value`, text as the text plugin's string
//! tensors, hyperparameters as the hparams plugin's summaries), starting with the
//! `file_version: "brain.Event:2"` event TensorBoard expects.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::printer::python_str;
use crate::protobuf::Proto;
use tchtrain_training_args::{JsonMap, JsonValue, python_float_repr};

const CRC32C_TABLE: [u32; 256] = crate::checksum_time::crc_table(0x82f6_3b78);

/// CRC-32C (Castagnoli), the checksum TFRecord uses.
pub fn crc32c(data: &[u8]) -> u32 {
    crate::checksum_time::crc(&CRC32C_TABLE, &[data])
}

/// TFRecord's masked CRC: `((crc >> 15) | (crc << 17)) + 0xa282ead8`.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length (u64 LE), its masked CRC, the data, the data's masked CRC.
pub fn tfrecord(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// `Event { wall_time = 1; step = 2; file_version = 3 | summary = 5 }`.
fn event(wall_time: f64, step: i64, file_version: Option<&str>, summary: Option<&[u8]>) -> Vec<u8> {
    let mut e = Proto::default();
    e.double(1, wall_time);
    if step != 0 {
        e.int(2, step);
    }
    if let Some(v) = file_version {
        e.bytes(3, v.as_bytes());
    }
    if let Some(s) = summary {
        e.bytes(5, s);
    }
    e.0
}

/// `Summary { value = 1: Value { tag = 1; simple_value = 2 } }`.
fn scalar_summary(tag: &str, value: f32) -> Vec<u8> {
    let mut v = Proto::default();
    v.bytes(1, tag.as_bytes());
    v.float(2, value);
    let mut s = Proto::default();
    s.bytes(1, &v.0);
    s.0
}

/// `Summary.Value { tag = 1; metadata = 9 (plugin "text"); tensor = 8 (DT_STRING, shape [1]) }`,
/// as `SummaryWriter.add_text` writes it.
fn text_summary(tag: &str, text: &str) -> Vec<u8> {
    let mut plugin = Proto::default();
    plugin.bytes(1, b"text");
    let mut metadata = Proto::default();
    metadata.bytes(1, &plugin.0);
    let mut dim = Proto::default();
    dim.int(1, 1);
    let mut shape = Proto::default();
    shape.bytes(2, &dim.0);
    let mut tensor = Proto::default();
    tensor.int(1, 7); // DT_STRING
    tensor.bytes(2, &shape.0);
    tensor.bytes(8, text.as_bytes());
    let mut v = Proto::default();
    v.bytes(1, format!("{tag}/text_summary").as_bytes());
    v.bytes(9, &metadata.0);
    v.bytes(8, &tensor.0);
    let mut s = Proto::default();
    s.bytes(1, &v.0);
    s.0
}

/// `Summary { value = 1: Value { tag = 1; metadata = 9: SummaryMetadata { plugin_data = 1:
/// PluginData { plugin_name = 1; content = 2 } } } }`: a value that carries only plugin data, as
/// the hparams plugin's summaries do.
fn plugin_summary(tag: &str, plugin_name: &str, content: &[u8]) -> Vec<u8> {
    let mut plugin = Proto::default();
    plugin.bytes(1, plugin_name.as_bytes());
    plugin.bytes(2, content);
    let mut metadata = Proto::default();
    metadata.bytes(1, &plugin.0);
    let mut v = Proto::default();
    v.bytes(1, tag.as_bytes());
    v.bytes(9, &metadata.0);
    let mut s = Proto::default();
    s.bytes(1, &v.0);
    s.0
}

/// TensorBoard's hparams plugin (tensorboard/plugins/hparams/metadata.py).
const HPARAMS_PLUGIN_NAME: &str = "hparams";
const HPARAMS_EXPERIMENT_TAG: &str = "_hparams_/experiment";
const HPARAMS_SESSION_START_INFO_TAG: &str = "_hparams_/session_start_info";
const HPARAMS_SESSION_END_INFO_TAG: &str = "_hparams_/session_end_info";
/// `DataType`: `DATA_TYPE_STRING = 1`, `DATA_TYPE_FLOAT64 = 3` (api.proto).
const DATA_TYPE_STRING: i64 = 1;
const DATA_TYPE_FLOAT64: i64 = 3;
/// `Status.STATUS_SUCCESS` (api.proto).
const STATUS_SUCCESS: i64 = 1;

/// The three summaries of `torch.utils.tensorboard.summary.hparams(hparam_dict, metric_dict)`:
/// the experiment (`HParamsPluginData { experiment = 2: Experiment { hparam_infos = 4:
/// HParamInfo { name = 1; type = 4 }; metric_infos = 5: MetricInfo { name = 1: MetricName {
/// tag = 2 } } } }`), the session start (`session_start_info = 3: SessionStartInfo { hparams = 1:
/// map<string, google.protobuf.Value { number_value = 2 | string_value = 3 }> }`) and the
/// session end (`session_end_info = 4: SessionEndInfo { status = 1: STATUS_SUCCESS }`); the
/// plugin data `version` is 0, which protobuf leaves out. As torch does, `None` values are
/// skipped and booleans are numbers (Python's `bool` is an `int`); lists and dicts are refused
/// there and written here as their Python `str()`.
fn hparams_summaries(hparams: &JsonMap, metrics: &JsonMap) -> [Vec<u8>; 3] {
    let mut infos = Vec::new();
    let mut start = Proto::default();
    for (k, v) in hparams.iter() {
        let mut value = Proto::default();
        let data_type = match v {
            JsonValue::Null => continue,
            JsonValue::Bool(b) => {
                value.double(2, f64::from(u8::from(*b)));
                DATA_TYPE_FLOAT64
            }
            JsonValue::Int(i) => {
                value.double(2, *i as f64);
                DATA_TYPE_FLOAT64
            }
            JsonValue::Float(f) => {
                value.double(2, *f);
                DATA_TYPE_FLOAT64
            }
            JsonValue::Str(s) => {
                value.bytes(3, s.as_bytes());
                DATA_TYPE_STRING
            }
            other => {
                value.bytes(3, python_str(other).as_bytes());
                DATA_TYPE_STRING
            }
        };
        let mut entry = Proto::default();
        entry.bytes(1, k.as_bytes());
        entry.bytes(2, &value.0);
        start.bytes(1, &entry.0);
        let mut info = Proto::default();
        info.bytes(1, k.as_bytes());
        info.int(4, data_type);
        infos.push(info.0);
    }
    let mut experiment = Proto::default();
    for info in &infos {
        experiment.bytes(4, info);
    }
    for (k, _) in metrics.iter() {
        let mut name = Proto::default();
        name.bytes(2, k.as_bytes());
        let mut info = Proto::default();
        info.bytes(1, &name.0);
        experiment.bytes(5, &info.0);
    }
    let plugin_data = |field: u32, message: &[u8]| {
        let mut data = Proto::default();
        data.bytes(field, message);
        data.0
    };
    let mut end = Proto::default();
    end.int(1, STATUS_SUCCESS);
    [
        plugin_summary(
            HPARAMS_EXPERIMENT_TAG,
            HPARAMS_PLUGIN_NAME,
            &plugin_data(2, &experiment.0),
        ),
        plugin_summary(
            HPARAMS_SESSION_START_INFO_TAG,
            HPARAMS_PLUGIN_NAME,
            &plugin_data(3, &start.0),
        ),
        plugin_summary(
            HPARAMS_SESSION_END_INFO_TAG,
            HPARAMS_PLUGIN_NAME,
            &plugin_data(4, &end.0),
        ),
    ]
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The machine's host name (for event file and run folder names); `localhost` when unknown.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

static FILE_UID: AtomicU32 = AtomicU32::new(0);

/// Writes one `events.out.tfevents.*` file, as PyTorch's `SummaryWriter` does.
#[derive(Debug)]
pub struct EventFileWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventFileWriter {
    /// Creates `log_dir` and a new event file in it, beginning with the `brain.Event:2` record.
    pub fn new(log_dir: impl AsRef<Path>) -> Result<Self> {
        let dir = log_dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        let now = wall_time();
        let name = format!(
            "events.out.tfevents.{:010}.{}.{}.{}",
            now as u64,
            hostname(),
            std::process::id(),
            FILE_UID.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = File::create(&path).map_err(|e| Error::io("creating", &path, e))?;
        let mut w = Self {
            path,
            out: BufWriter::new(file),
        };
        w.write(&event(now, 0, Some("brain.Event:2"), None))?;
        w.flush()?;
        Ok(w)
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, event: &[u8]) -> Result<()> {
        self.out
            .write_all(&tfrecord(event))
            .map_err(|e| Error::io("writing", &self.path, e))
    }

    /// Appends a scalar (stored as a 32-bit float, as TensorBoard's `simple_value` is).
    pub fn add_scalar(&mut self, tag: &str, value: f64, step: i64) -> Result<()> {
        self.write(&event(
            wall_time(),
            step,
            None,
            Some(&scalar_summary(tag, value as f32)),
        ))
    }

    /// Appends a text summary (TensorBoard's text plugin; the tag gets `/text_summary` as in PyTorch).
    pub fn add_text(&mut self, tag: &str, text: &str, step: i64) -> Result<()> {
        self.write(&event(
            wall_time(),
            step,
            None,
            Some(&text_summary(tag, text)),
        ))
    }

    /// PyTorch's `SummaryWriter.add_hparams(hparam_dict, metric_dict, run_name=run_name,
    /// global_step=global_step)`: a new event file in the sub-folder `run_name` (by default
    /// the current time in seconds, as Python's `str(time.time())`) of this file's folder,
    /// holding the hparams plugin's experiment, session start and session end summaries and
    /// one scalar per metric. Returns the sub-folder.
    pub fn add_hparams(
        &mut self,
        hparam_dict: &JsonMap,
        metric_dict: &JsonMap,
        run_name: Option<&str>,
        global_step: Option<i64>,
    ) -> Result<PathBuf> {
        let run_name = match run_name {
            Some(r) if !r.is_empty() => r.to_string(),
            _ => python_float_repr(wall_time()),
        };
        let dir = self
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
            .join(run_name);
        let mut w = EventFileWriter::new(&dir)?;
        let step = global_step.unwrap_or(0);
        for summary in hparams_summaries(hparam_dict, metric_dict) {
            w.write(&event(wall_time(), step, None, Some(&summary)))?;
        }
        for (k, v) in metric_dict.iter() {
            if let Some(x) = v.as_f64() {
                w.add_scalar(k, x, step)?;
            }
        }
        w.flush()?;
        Ok(dir)
    }

    /// Writes buffered events to disk.
    pub fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|e| Error::io("writing", &self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_values() {
        // RFC 3720 test vectors.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    }

    #[test]
    fn varint_encodes_negative_steps_in_ten_bytes() {
        let mut p = Proto::default();
        p.varint(-1i64 as u64);
        assert_eq!(p.0.len(), 10);
        let mut p = Proto::default();
        p.varint(300);
        assert_eq!(p.0, [0xac, 0x02]);
    }
}
