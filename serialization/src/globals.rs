//! The allow-list of globals a pickle may name (torch's `_get_allowed_globals` plus
//! `add_safe_globals`): the only `GLOBAL` / `STACK_GLOBAL` names the unpickler accepts. Every
//! name is kept as an inert reference; nothing is imported, looked up or called.

use std::collections::BTreeSet;

use crate::dtype::DType;

/// The rebuild functions and containers the unpickler interprets itself.
pub(crate) const ORDERED_DICT: (&str, &str) = ("collections", "OrderedDict");
pub(crate) const REBUILD_TENSOR_V2: (&str, &str) = ("torch._utils", "_rebuild_tensor_v2");
pub(crate) const REBUILD_TENSOR_V3: (&str, &str) = ("torch._utils", "_rebuild_tensor_v3");
pub(crate) const REBUILD_PARAMETER: (&str, &str) = ("torch._utils", "_rebuild_parameter");
pub(crate) const CODECS_ENCODE: (&str, &str) = ("_codecs", "encode");
pub(crate) const BUILTINS_BYTES: (&str, &str) = ("builtins", "bytes");
pub(crate) const UNTYPED_STORAGE: (&str, &str) = ("torch.storage", "UntypedStorage");

/// Classes that Python pickles as `REDUCE` records with no state and that are singletons
/// (enum members): the pickler memoizes equal ones, as Python's memo (by identity) does.
pub(crate) const ENUM_CLASSES: [&str; 8] = [
    "transformers.trainer_utils.IntervalStrategy",
    "transformers.trainer_utils.SaveStrategy",
    "transformers.trainer_utils.HubStrategy",
    "transformers.trainer_utils.SchedulerType",
    "transformers.trainer_utils.FSDPOption",
    "transformers.training_args.OptimizerNames",
    "transformers.debug_utils.DebugOption",
    "accelerate.utils.dataclasses.DistributedType",
];

/// Globals a checkpoint may name, as `module.name` strings.
///
/// [`Globals::weights_only`] is what `torch.load(weights_only=True)` allows by default and
/// this crate can represent; [`Globals::trainer_checkpoint`] (the default of [`crate::load`])
/// adds what transformers' Trainer checkpoints hold: numpy's RNG state in `rng_state.pth`
/// (transformers' `safe_globals()`) and the `TrainingArguments` family in
/// `training_args.bin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Globals {
    names: BTreeSet<String>,
}

impl Globals {
    /// No globals at all: plain containers and scalars only.
    pub fn none() -> Self {
        Self {
            names: BTreeSet::new(),
        }
    }

    /// torch's default allow-list (`_get_allowed_globals`), less what this crate cannot
    /// represent (sparse / quantized / nested tensor rebuilds, `torch.Tensor` legacy
    /// construction, `collections.Counter`), plus `builtins.bytes` (how Python pickles
    /// `b""`).
    #[doc(alias = "_get_allowed_globals")]
    pub fn weights_only() -> Self {
        let mut g = Self::none();
        for (m, n) in [
            ORDERED_DICT,
            REBUILD_TENSOR_V2,
            REBUILD_TENSOR_V3,
            REBUILD_PARAMETER,
            CODECS_ENCODE,
            BUILTINS_BYTES,
            UNTYPED_STORAGE,
            ("torch.serialization", "_get_layout"),
            ("torch", "Size"),
            ("torch", "device"),
            ("builtins", "bytearray"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "complex"),
            ("torch", "per_tensor_affine"),
            ("torch", "per_tensor_symmetric"),
            ("torch", "per_channel_affine"),
            ("torch", "per_channel_symmetric"),
            ("torch", "per_channel_affine_float_qparams"),
        ] {
            g.names.insert(format!("{m}.{n}"));
        }
        for dtype in DType::ALL {
            g.names.insert(format!("torch.{}", dtype.name()));
            if let Some(storage) = dtype.legacy_storage_name() {
                g.names.insert(format!("torch.{storage}"));
                g.names.insert(format!("torch.cuda.{storage}"));
            }
        }
        g
    }

    /// [`Globals::weights_only`] plus what transformers' Trainer pickles into
    /// `checkpoint-N/`: numpy's `_reconstruct` / `ndarray` / `dtype` (both numpy 1 and 2
    /// module paths) for `rng_state.pth`, and `TrainingArguments` (and TRL's configs
    /// derived from it) with its enums, `AcceleratorConfig` and accelerate's `PartialState` /
    /// `DistributedType` for `training_args.bin`.
    pub fn trainer_checkpoint() -> Self {
        let mut g = Self::weights_only();
        for name in [
            "numpy._core.multiarray._reconstruct",
            "numpy.core.multiarray._reconstruct",
            "numpy.ndarray",
            "numpy.dtype",
            "numpy.dtypes.UInt32DType",
            "transformers.training_args.TrainingArguments",
            "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
            // TRL's configs, the `TrainingArguments` of its trainers' checkpoints.
            "trl.trainer.sft_config.SFTConfig",
            "trl.trainer.dpo_config.DPOConfig",
            "trl.trainer.reward_config.RewardConfig",
            "trl.trainer.grpo_config.GRPOConfig",
            "transformers.trainer_pt_utils.AcceleratorConfig",
            "accelerate.state.PartialState",
        ] {
            g.names.insert(name.to_string());
        }
        for name in ENUM_CLASSES {
            g.names.insert(name.to_string());
        }
        g
    }

    /// Adds `module.name` (torch's `add_safe_globals`). The name stays an inert record: an
    /// added class is read as an [`crate::Object`], never constructed.
    #[doc(alias = "add_safe_globals")]
    pub fn with(mut self, qualified_name: &str) -> Self {
        self.names.insert(qualified_name.to_string());
        self
    }

    /// Whether `module.name` may appear.
    pub fn allows(&self, module: &str, name: &str) -> bool {
        self.names.contains(&format!("{module}.{name}"))
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }
}

impl Default for Globals {
    fn default() -> Self {
        Self::trainer_checkpoint()
    }
}

/// Python 2 module names that protocol-2 pickles use for Python 3's (`_compat_pickle`'s
/// `IMPORT_MAPPING`, the part that can occur in a checkpoint).
pub(crate) fn python3_module(module: &str) -> &str {
    match module {
        "__builtin__" => "builtins",
        "copy_reg" => "copyreg",
        other => other,
    }
}

/// The reverse: the module name a protocol-2 pickle writes.
pub(crate) fn python2_module(module: &str) -> &str {
    match module {
        "builtins" => "__builtin__",
        "copyreg" => "copy_reg",
        other => other,
    }
}
