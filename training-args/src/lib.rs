//! `tchtrain-training-args` — `TrainingArguments` with Hugging Face's flag names, defaults and
//! checks (transformers 5.23 `training_args.py`). Does not depend on tch.
//!
//! - [`TrainingArguments`]: every 5.23 field in upstream's order, [`Default`] equal to upstream's
//!   `TrainingArguments()`, [`TrainingArguments::post_init`] for upstream's `__post_init__`
//!   derivations and `_validate_args` checks, `get_warmup_steps`, the `set_*` builders, and the
//!   world/process helpers (`world_size` from torchrun's `WORLD_SIZE`).
//! - JSON: [`TrainingArguments::to_json_string`] writes what upstream's `to_json_string` writes
//!   (`training_args.json`); [`TrainingArguments::from_json_str`] / `from_json_file` /
//!   `from_dict` read it back through the same checks.
//! - [`Seq2SeqTrainingArguments`]: upstream's `training_args_seq2seq.py`, the base plus
//!   `sortish_sampler`, `predict_with_generate`, `generation_max_length`, `generation_num_beams`
//!   and `generation_config`, with the same JSON forms and readers
//!   ([`ParsedSeq2SeqArguments`]) and `HfArgumentParser::for_seq2seq()` on the command line.
//! - Command line: [`HfArgumentParser`] parses as upstream's `HfArgumentParser` does. It is a
//!   table-driven parser over field metadata extracted from upstream's own argparse actions,
//!   not clap: argparse's conventions (`--bf16` / `--bf16 false`, `--no_<field>`, kebab-case
//!   twins, prefix abbreviations, negative-number values) are matched exactly this way.
//! - Enums with upstream's string values: [`IntervalStrategy`], [`SaveStrategy`],
//!   [`HubStrategy`], [`SchedulerType`], [`OptimizerNames`] (all names parse;
//!   [`OptimizerNames::ensure_supported`] rejects those tchtrain lacks), [`FsdpOption`],
//!   [`DebugOption`], [`ParallelMode`].
//! - v4 names (`evaluation_strategy`, `warmup_ratio`, `group_by_length`,
//!   `gradient_checkpointing`, `logging_dir`) are accepted on input with a [`Warning`] in
//!   [`ParsedArguments::warnings`].
//!
//! Reading never panics on bad input: every failure is an [`Error`] naming the field (or flag),
//! the value and the fix.
//!
//! ```
//! use tchtrain_training_args::{HfArgumentParser, IntervalStrategy};
//!
//! let parsed = HfArgumentParser::new()
//!     .parse_args_into_dataclasses(["--output_dir", "out", "--evaluation_strategy", "steps", "--logging_steps", "50"])
//!     .unwrap();
//! assert_eq!(parsed.args.eval_strategy, IntervalStrategy::Steps);
//! assert_eq!(parsed.args.eval_steps, Some(50.0));
//! assert_eq!(parsed.warnings[0].field, "evaluation_strategy");
//! ```

mod cli;
mod debug_utils;
mod distributed;
mod error;
mod field_table;
mod json;
mod normalize;
mod optimizer_names;
mod parsed;
mod post_init;
mod seq2seq;
mod seq2seq_field_table;
mod setters;
mod string_enum;
mod suggest;
mod trainer_utils;
mod training_args;
mod values;

pub use cli::{Dataclass, DataclassValues, FieldSpec, HfArgumentParser, Nargs, ValueKind};
pub use debug_utils::DebugOption;
pub use distributed::ParallelMode;
pub use error::{Error, Result};
// Python's `json` and `repr` (the `tchtrain-python-json` crate), re-exported where the
// Trainer's crates have always found them.
pub use normalize::{V4_ALIASES, field_names};
pub use optimizer_names::{OptimizerNames, OptimizerSupport};
pub use parsed::{ParsedArguments, ParsedSeq2SeqArguments, Warning};
pub use seq2seq::{Seq2SeqTrainingArguments, seq2seq_field_names};
pub use setters::{
    SetDataloader, SetEvaluate, SetLogging, SetLrScheduler, SetOptimizer, SetPushToHub, SetSave,
    SetTesting, SetTraining,
};
pub use tchtrain_python_json::{
    JsonMap, JsonSyntaxError, JsonValue, dumps, dumps_compact, loads, python_float_repr,
    python_repr, python_str_repr,
};
pub use trainer_utils::{FsdpOption, HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType};
pub use training_args::TrainingArguments;
pub use values::{AcceleratorConfig, DictOrPath, JsonDict, StrOrBool, StrOrList};
