//! `TrainerState`: the training loop's state, saved as `trainer_state.json` in every checkpoint.
//!
//! The JSON is byte-identical to upstream's `save_to_json` (`json.dumps(asdict(state),
//! indent=2, sort_keys=True) + "\n"`). Python keeps `int` and `float` apart and a few fields
//! can hold either (a fresh state has `"epoch": 0`, `logging_steps` can be `1.0`); the state
//! remembers the Python type a numeric field was loaded or computed with, for as long as the
//! field keeps that value, so a loaded file re-serialises unchanged.

use std::collections::BTreeMap;
use std::path::Path;

use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use tchtrain_training_args::loads;
use tchtrain_training_args::{JsonMap, JsonValue, dumps};

/// Upstream `TrainerState`: the state of the training loop, passed to every callback and
/// saved with each checkpoint. One step is one optimizer update.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerState {
    /// The epoch the training is at (the fractional part is the share of the epoch done).
    pub epoch: f64,
    /// Number of update steps completed.
    pub global_step: i64,
    /// Number of update steps of the current training.
    pub max_steps: i64,
    /// Log every X update steps (absolute, after [`compute_steps`](Self::compute_steps)).
    pub logging_steps: i64,
    /// Evaluate every X update steps.
    pub eval_steps: i64,
    /// Save a checkpoint every X update steps.
    pub save_steps: i64,
    /// Batch size of the training dataloader (needed with `auto_find_batch_size`).
    pub train_batch_size: Option<i64>,
    /// Number of epochs of the current training.
    pub num_train_epochs: i64,
    /// Number of input tokens seen during training, when tracked.
    pub num_input_tokens_seen: i64,
    /// Total floating point operations done by the model since the beginning of training.
    pub total_flos: f64,
    /// The logs since the beginning of training, each with its `"step"`.
    pub log_history: Vec<JsonMap>,
    /// Best value of `metric_for_best_model` so far.
    pub best_metric: Option<f64>,
    /// Step at which `best_metric` was reached.
    pub best_global_step: Option<i64>,
    /// Checkpoint folder of the best model so far.
    pub best_model_checkpoint: Option<String>,
    /// Whether this process is the local main process.
    pub is_local_process_zero: bool,
    /// Whether this process is the global main process.
    pub is_world_process_zero: bool,
    /// Whether a hyperparameter search is running.
    pub is_hyper_param_search: bool,
    /// Name of the hyperparameter-search trial.
    pub trial_name: Option<String>,
    /// Parameters of the hyperparameter-search trial.
    pub trial_params: Option<JsonMap>,
    /// Saved states of [`ExportableState`](crate::ExportableState) callbacks, by class name:
    /// a `{"args", "attributes"}` object, or a list of them for several callbacks of one class.
    pub stateful_callbacks: JsonMap,
    /// Which numeric fields Python holds as the other number type (`"epoch": 0`,
    /// `"logging_steps": 1.0`), for as long as they keep that value; filled by
    /// [`load_from_json`](Self::load_from_json) and [`Default`], read by the serializer.
    /// Public only so that `TrainerState { global_step: 3, ..Default::default() }` works.
    pub number_forms: NumberForms,
}

/// The Python number type of the numeric fields of a [`TrainerState`] whose JSON type is not
/// the field's usual one. Formatting only: never part of equality.
#[derive(Debug, Clone, Default)]
pub struct NumberForms {
    /// Float fields that hold a Python `int`: field -> the value it had then.
    ints: BTreeMap<&'static str, f64>,
    /// Integer fields that hold a Python `float`: field -> (integer value, the float).
    floats: BTreeMap<&'static str, (i64, f64)>,
}

impl PartialEq for NumberForms {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Default for TrainerState {
    fn default() -> Self {
        let mut forms = NumberForms::default();
        // Upstream's dataclass defaults are the ints `epoch: float = 0`, `total_flos: float = 0`.
        forms.ints.insert("epoch", 0.0);
        forms.ints.insert("total_flos", 0.0);
        Self {
            epoch: 0.0,
            global_step: 0,
            max_steps: 0,
            logging_steps: 500,
            eval_steps: 500,
            save_steps: 500,
            train_batch_size: None,
            num_train_epochs: 0,
            num_input_tokens_seen: 0,
            total_flos: 0.0,
            log_history: Vec::new(),
            best_metric: None,
            best_global_step: None,
            best_model_checkpoint: None,
            is_local_process_zero: true,
            is_world_process_zero: true,
            is_hyper_param_search: false,
            trial_name: None,
            trial_params: None,
            stateful_callbacks: JsonMap::new(),
            number_forms: forms,
        }
    }
}

/// What [`TrainerState::init_training_references`] records at the start of training.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainingReferences {
    /// Number of update steps of this training.
    pub max_steps: i64,
    /// Number of epochs of this training.
    pub num_train_epochs: i64,
    /// Whether this process is the local main process.
    pub is_local_process_zero: bool,
    /// Whether this process is the global main process.
    pub is_world_process_zero: bool,
    /// Name of the hyperparameter-search trial, if any.
    pub trial_name: Option<String>,
    /// Parameters of the hyperparameter-search trial, if any.
    pub trial_params: Option<JsonMap>,
}

const FIELDS: [&str; 20] = [
    "best_global_step",
    "best_metric",
    "best_model_checkpoint",
    "epoch",
    "eval_steps",
    "global_step",
    "is_hyper_param_search",
    "is_local_process_zero",
    "is_world_process_zero",
    "log_history",
    "logging_steps",
    "max_steps",
    "num_input_tokens_seen",
    "num_train_epochs",
    "save_steps",
    "stateful_callbacks",
    "total_flos",
    "train_batch_size",
    "trial_name",
    "trial_params",
];

impl TrainerState {
    /// A fresh state holding the exported states of `stateful_callbacks` (upstream
    /// `TrainerState(stateful_callbacks=[...])`): one entry per class name, a list when a
    /// class appears more than once.
    pub fn with_stateful_callbacks(
        stateful_callbacks: impl IntoIterator<Item = (String, JsonValue)>,
    ) -> Self {
        let mut state = Self::default();
        for (name, cb_state) in stateful_callbacks {
            match state.stateful_callbacks.get_mut(&name) {
                Some(JsonValue::Array(list)) => list.push(cb_state),
                Some(existing) => {
                    let first = std::mem::replace(existing, JsonValue::Null);
                    *existing = JsonValue::Array(vec![first, cb_state]);
                }
                None => {
                    state.stateful_callbacks.insert(name, cb_state);
                }
            }
        }
        state
    }

    /// Refreshes `stateful_callbacks` before a checkpoint is written, as upstream
    /// `_save_checkpoint` does: a class stored as a list gets the new state appended, any
    /// other entry is replaced.
    pub fn update_stateful_callbacks(
        &mut self,
        states: impl IntoIterator<Item = (String, JsonValue)>,
    ) {
        for (name, cb_state) in states {
            match self.stateful_callbacks.get_mut(&name) {
                Some(JsonValue::Array(list)) => list.push(cb_state),
                _ => {
                    self.stateful_callbacks.insert(name, cb_state);
                }
            }
        }
    }

    /// Upstream `compute_steps`: turns `logging_steps`, `eval_steps` and `save_steps` given as
    /// a ratio (`< 1`) of `max_steps` into absolute steps (`ceil(max_steps * ratio)`); an unset
    /// `eval_steps` leaves the state's value as it is.
    pub fn compute_steps(&mut self, args: &TrainingArguments, max_steps: i64) {
        let kinds: [(&'static str, Option<f64>); 3] = [
            ("logging_steps", Some(args.logging_steps)),
            ("eval_steps", args.eval_steps),
            ("save_steps", Some(args.save_steps)),
        ];
        for (field, num_steps) in kinds {
            let Some(num_steps) = num_steps else { continue };
            let value = if num_steps < 1.0 {
                (max_steps as f64 * num_steps).ceil()
            } else {
                num_steps
            };
            let int = value as i64;
            if value == int as f64 {
                self.number_forms.floats.remove(field);
            } else {
                // A non-whole absolute value (only possible when its strategy is not "steps",
                // so it is never used): Python keeps the float.
                self.number_forms.floats.insert(field, (int, value));
            }
            *self.steps_field(field) = int;
        }
    }

    fn steps_field(&mut self, field: &str) -> &mut i64 {
        match field {
            "logging_steps" => &mut self.logging_steps,
            "eval_steps" => &mut self.eval_steps,
            _ => &mut self.save_steps,
        }
    }

    /// Upstream `init_training_references`: records the training's length, the process's
    /// rank flags and the hyperparameter-search trial.
    pub fn init_training_references(&mut self, refs: TrainingReferences) {
        if refs.trial_name.is_some() {
            self.trial_name = refs.trial_name;
        }
        self.trial_params = refs.trial_params;
        self.max_steps = refs.max_steps;
        self.num_train_epochs = refs.num_train_epochs;
        self.is_local_process_zero = refs.is_local_process_zero;
        self.is_world_process_zero = refs.is_world_process_zero;
    }

    /// The state as the JSON object upstream's `dataclasses.asdict` gives.
    pub fn to_json_value(&self) -> JsonValue {
        let float = |field: &'static str, v: f64| match self.number_forms.ints.get(field) {
            Some(was) if *was == v && v.fract() == 0.0 && v.abs() < 9.0e18 => {
                JsonValue::Int(v as i64)
            }
            _ => JsonValue::Float(v),
        };
        let int = |field: &'static str, v: i64| match self.number_forms.floats.get(field) {
            Some((was, f)) if *was == v => JsonValue::Float(*f),
            _ => JsonValue::Int(v),
        };
        let mut m = JsonMap::new();
        m.insert("epoch", float("epoch", self.epoch));
        m.insert("global_step", int("global_step", self.global_step));
        m.insert("max_steps", int("max_steps", self.max_steps));
        m.insert("logging_steps", int("logging_steps", self.logging_steps));
        m.insert("eval_steps", int("eval_steps", self.eval_steps));
        m.insert("save_steps", int("save_steps", self.save_steps));
        m.insert(
            "train_batch_size",
            self.train_batch_size
                .map_or(JsonValue::Null, |v| int("train_batch_size", v)),
        );
        m.insert(
            "num_train_epochs",
            int("num_train_epochs", self.num_train_epochs),
        );
        m.insert(
            "num_input_tokens_seen",
            int("num_input_tokens_seen", self.num_input_tokens_seen),
        );
        m.insert("total_flos", float("total_flos", self.total_flos));
        m.insert(
            "log_history",
            JsonValue::Array(
                self.log_history
                    .iter()
                    .cloned()
                    .map(JsonValue::Object)
                    .collect(),
            ),
        );
        m.insert(
            "best_metric",
            self.best_metric
                .map_or(JsonValue::Null, |v| float("best_metric", v)),
        );
        m.insert(
            "best_global_step",
            self.best_global_step
                .map_or(JsonValue::Null, |v| int("best_global_step", v)),
        );
        m.insert("best_model_checkpoint", self.best_model_checkpoint.clone());
        m.insert("is_local_process_zero", self.is_local_process_zero);
        m.insert("is_world_process_zero", self.is_world_process_zero);
        m.insert("is_hyper_param_search", self.is_hyper_param_search);
        m.insert("trial_name", self.trial_name.clone());
        m.insert("trial_params", self.trial_params.clone());
        m.insert("stateful_callbacks", self.stateful_callbacks.clone());
        JsonValue::Object(m)
    }

    /// The text upstream's `save_to_json` writes: `json.dumps(..., indent=2, sort_keys=True) + "\n"`.
    pub fn to_json_string(&self) -> String {
        dumps(&self.to_json_value(), Some(2), true) + "\n"
    }

    /// Upstream `save_to_json`: writes [`to_json_string`](Self::to_json_string) to `json_path`.
    pub fn save_to_json(&self, json_path: impl AsRef<Path>) -> Result<()> {
        let path = json_path.as_ref();
        std::fs::write(path, self.to_json_string()).map_err(|e| Error::io("writing", path, e))
    }

    /// Upstream `load_from_json`: reads a `trainer_state.json`. Errors name the file and the field.
    pub fn load_from_json(json_path: impl AsRef<Path>) -> Result<Self> {
        let path = json_path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Parses the text of a `trainer_state.json`; `what` names it in errors.
    pub fn from_json_str(text: &str, what: &str) -> Result<Self> {
        let value = loads(text).map_err(|source| Error::JsonSyntax {
            what: what.to_string(),
            source,
        })?;
        Self::from_json_value(&value, what)
    }

    /// Builds the state from a parsed JSON object, as `TrainerState(**json.loads(text))` does:
    /// missing fields take their defaults, unknown fields are an error.
    pub fn from_json_value(value: &JsonValue, what: &str) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| Error::FieldType {
            what: what.to_string(),
            field: "(top level)".into(),
            expected: "a JSON object",
            found: value.type_name().into(),
        })?;
        let mut s = Self::default();
        let type_err = |field: &str, expected: &'static str, v: &JsonValue| Error::FieldType {
            what: what.to_string(),
            field: field.to_string(),
            expected,
            found: v.type_name().into(),
        };
        for (key, v) in map.iter() {
            let Some(field) = FIELDS.iter().copied().find(|f| *f == key) else {
                return Err(Error::UnknownField {
                    what: what.to_string(),
                    field: key.to_string(),
                });
            };
            let opt = matches!(
                field,
                "best_global_step"
                    | "best_metric"
                    | "best_model_checkpoint"
                    | "train_batch_size"
                    | "trial_name"
                    | "trial_params"
            );
            if opt && *v == JsonValue::Null {
                continue;
            }
            match field {
                "epoch" | "total_flos" | "best_metric" => {
                    let f = match v {
                        JsonValue::Int(i) => {
                            s.number_forms.ints.insert(field, *i as f64);
                            *i as f64
                        }
                        JsonValue::Float(f) => {
                            s.number_forms.ints.remove(field);
                            *f
                        }
                        _ => return Err(type_err(field, "a number", v)),
                    };
                    match field {
                        "epoch" => s.epoch = f,
                        "total_flos" => s.total_flos = f,
                        _ => s.best_metric = Some(f),
                    }
                }
                "global_step"
                | "max_steps"
                | "logging_steps"
                | "eval_steps"
                | "save_steps"
                | "train_batch_size"
                | "num_train_epochs"
                | "num_input_tokens_seen"
                | "best_global_step" => {
                    let i = match v {
                        JsonValue::Int(i) => *i,
                        JsonValue::Float(f) if f.is_finite() => {
                            s.number_forms.floats.insert(field, (f.trunc() as i64, *f));
                            f.trunc() as i64
                        }
                        _ => return Err(type_err(field, "an integer", v)),
                    };
                    match field {
                        "global_step" => s.global_step = i,
                        "max_steps" => s.max_steps = i,
                        "logging_steps" => s.logging_steps = i,
                        "eval_steps" => s.eval_steps = i,
                        "save_steps" => s.save_steps = i,
                        "train_batch_size" => s.train_batch_size = Some(i),
                        "num_train_epochs" => s.num_train_epochs = i,
                        "num_input_tokens_seen" => s.num_input_tokens_seen = i,
                        _ => s.best_global_step = Some(i),
                    }
                }
                "is_local_process_zero" | "is_world_process_zero" | "is_hyper_param_search" => {
                    let b = v.as_bool().ok_or_else(|| type_err(field, "a bool", v))?;
                    match field {
                        "is_local_process_zero" => s.is_local_process_zero = b,
                        "is_world_process_zero" => s.is_world_process_zero = b,
                        _ => s.is_hyper_param_search = b,
                    }
                }
                "best_model_checkpoint" | "trial_name" => {
                    let t = v
                        .as_str()
                        .ok_or_else(|| type_err(field, "a string or null", v))?
                        .to_string();
                    if field == "trial_name" {
                        s.trial_name = Some(t);
                    } else {
                        s.best_model_checkpoint = Some(t);
                    }
                }
                "trial_params" => {
                    s.trial_params = Some(
                        v.as_object()
                            .ok_or_else(|| type_err(field, "a dict or null", v))?
                            .clone(),
                    );
                }
                "stateful_callbacks" => match v {
                    JsonValue::Object(m) => s.stateful_callbacks = m.clone(),
                    JsonValue::Null => {}
                    _ => return Err(type_err(field, "a dict", v)),
                },
                _ => {
                    let items = match v {
                        JsonValue::Array(items) => items,
                        JsonValue::Null => continue,
                        _ => return Err(type_err(field, "a list of dicts", v)),
                    };
                    for (i, item) in items.iter().enumerate() {
                        let entry = item.as_object().ok_or_else(|| Error::FieldType {
                            what: what.to_string(),
                            field: format!("log_history[{i}]"),
                            expected: "a dict",
                            found: item.type_name().into(),
                        })?;
                        s.log_history.push(entry.clone());
                    }
                }
            }
        }
        Ok(s)
    }
}
