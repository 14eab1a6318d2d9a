//! TRL's LoRA flags for the example scripts (`trl.ModelConfig`'s `--use_peft`, `--lora_r`,
//! `--lora_alpha`, `--lora_dropout`, `--lora_target_modules`, `--lora_target_parameters`,
//! `--lora_modules_to_save`, `--lora_task_type`, `--use_rslora`, `--use_dora`, with TRL's defaults), made into a
//! [`LoraConfig`] as `trl.get_peft_config` makes it and applied to the loaded model; and its
//! quantization flags (`--load_in_4bit`, `--bnb_4bit_quant_type`, `--use_bnb_nested_quant`,
//! `--bnb_4bit_quant_storage`, `--load_in_8bit`) as `trl.get_quantization_config`.

use tchtrain_models::{LoraConfig, PreTrainedModel, TargetModules, get_peft_model};

use crate::error::{Error, Result};
use tchtrain_training_args::{Dataclass, FieldSpec};

/// The LoRA flags (TRL's `ModelConfig` fields; defaults from [`LORA_ARGUMENTS`]).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeftArguments {
    /// `--use_peft`: train a LoRA adapter instead of the whole model.
    pub use_peft: bool,
    /// `--lora_r` (default 16).
    pub lora_r: i64,
    /// `--lora_alpha` (default 32).
    pub lora_alpha: f64,
    /// `--lora_dropout` (default 0.05).
    pub lora_dropout: f64,
    /// `--lora_target_modules NAME...`: one value is a regular expression or
    /// `all-linear` (as TRL passes a single value on); several are module names. Default:
    /// peft's for the model type.
    pub lora_target_modules: Option<Vec<String>>,
    /// `--lora_target_parameters NAME...`: parameters adapted directly (peft's
    /// `target_parameters`: a mixture of experts' `mlp.experts.gate_up_proj`,
    /// `mlp.experts.down_proj`; peft needs `--lora_dropout 0` for them).
    pub lora_target_parameters: Option<Vec<String>>,
    /// `--lora_modules_to_save NAME...`: modules trained in full and saved with the adapter.
    pub lora_modules_to_save: Option<Vec<String>>,
    /// `--lora_task_type` (default `CAUSAL_LM`; `SEQ_CLS` for classification heads).
    pub lora_task_type: String,
    /// `--use_rslora`.
    pub use_rslora: bool,
    /// `--use_dora`.
    pub use_dora: bool,
    /// `--load_in_8bit`: the base model loaded in 8 bits (LLM.int8, with `--use_peft`).
    pub load_in_8bit: bool,
    /// `--load_in_4bit`: the base model loaded in 4 bits (QLoRA, with `--use_peft`).
    pub load_in_4bit: bool,
    /// `--bnb_4bit_quant_type` (default `nf4`).
    pub bnb_4bit_quant_type: String,
    /// `--use_bnb_nested_quant`: double quantization of the absmax.
    pub use_bnb_nested_quant: bool,
    /// `--bnb_4bit_quant_storage` (only `uint8` here).
    pub bnb_4bit_quant_storage: Option<String>,
}

impl Default for PeftArguments {
    /// TRL's defaults (the table's).
    fn default() -> Self {
        crate::args::defaults(&[&LORA_ARGUMENTS])
            .unwrap_or_else(|e| unreachable!("the LoRA table's defaults read: {e}"))
    }
}

/// TRL's `ModelConfig` LoRA fields (trl 1.16), as the scripts take them.
pub static LORA_ARGUMENTS: Dataclass = Dataclass {
    name: "ModelConfig (TRL's LoRA flags)",
    fields: &[
        FieldSpec::bool(
            "use_peft",
            false,
            "Train a LoRA adapter (peft's files) instead of the whole model.",
        ),
        FieldSpec::int("lora_r", "16", "LoRA R value (the rank)."),
        FieldSpec::int("lora_alpha", "32", "LoRA alpha (the scaling numerator)."),
        FieldSpec::float(
            "lora_dropout",
            "0.05",
            "LoRA dropout on the adapters' input.",
        ),
        FieldSpec::list(
            "lora_target_modules",
            "None",
            "Modules to adapt: names, or one regular expression / all-linear (default: peft's for the model type).",
        ),
        FieldSpec::list(
            "lora_target_parameters",
            "None",
            "Parameters to adapt directly (a mixture of experts' mlp.experts.gate_up_proj, mlp.experts.down_proj); peft needs --lora_dropout 0 for them.",
        ),
        FieldSpec::list(
            "lora_modules_to_save",
            "None",
            "Model layers trained in full and saved with the adapter.",
        ),
        FieldSpec::str(
            "lora_task_type",
            "CAUSAL_LM",
            "Task type of the adapter: CAUSAL_LM, SEQ_CLS, TOKEN_CLS, QUESTION_ANS.",
        ),
        FieldSpec::bool(
            "use_rslora",
            false,
            "Rank-stabilised LoRA: scaling alpha / sqrt(r) instead of alpha / r.",
        ),
        FieldSpec::bool("use_dora", false, "Weight-decomposed LoRA (DoRA)."),
        FieldSpec::bool(
            "load_in_8bit",
            false,
            "Use 8 bit precision for the base model (LLM.int8, with --use_peft).",
        ),
        FieldSpec::bool(
            "load_in_4bit",
            false,
            "Use 4 bit precision for the base model (QLoRA, with --use_peft).",
        ),
        FieldSpec::str(
            "bnb_4bit_quant_type",
            "nf4",
            "Quantization type (nf4 or fp4).",
        ),
        FieldSpec::bool(
            "use_bnb_nested_quant",
            false,
            "Whether to use nested quantization (double quantization of the absmax).",
        ),
        FieldSpec::str(
            "bnb_4bit_quant_storage",
            "None",
            "Quantization storage dtype (uint8 here).",
        ),
    ],
};

impl PeftArguments {
    /// `trl.get_peft_config(model_args)`: `None` without `--use_peft`.
    pub fn lora_config(&self) -> Option<LoraConfig> {
        self.use_peft.then(|| LoraConfig {
            task_type: Some(self.lora_task_type.clone()),
            r: self.lora_r,
            target_modules: self
                .lora_target_modules
                .as_ref()
                .map(|t| match t.as_slice() {
                    // TRL's `ModelConfig.__post_init__` passes a single value on as a string.
                    [one] => TargetModules::Regex(one.clone()),
                    many => TargetModules::Names(many.to_vec()),
                }),
            lora_alpha: self.lora_alpha,
            lora_dropout: self.lora_dropout,
            use_rslora: self.use_rslora,
            use_dora: self.use_dora,
            modules_to_save: self.lora_modules_to_save.clone(),
            target_parameters: self.lora_target_parameters.clone(),
            ..LoraConfig::default()
        })
    }

    /// `trl.get_quantization_config(model_args)`: with `--load_in_4bit`, the 4-bit config
    /// (its compute dtype the model's `dtype`, float32 by default); with `--load_in_8bit`,
    /// `BitsAndBytesConfig(load_in_8bit=True)`; `None` otherwise.
    pub fn quantization_config(
        &self,
        dtype: tchtrain_models::LoadDtype,
    ) -> Result<Option<tchtrain_models::BitsAndBytesConfig>> {
        if self.load_in_8bit && self.load_in_4bit {
            return Err(Error::InvalidFlag {
                flag: "load_in_8bit".into(),
                detail: "You can't use 8 bit and 4 bit precision at the same time (TRL's message); give one of --load_in_4bit and --load_in_8bit".into(),
            });
        }
        if self.load_in_8bit {
            return Ok(Some(tchtrain_models::BitsAndBytesConfig::int8()));
        }
        if !self.load_in_4bit {
            return Ok(None);
        }
        let compute = match dtype {
            tchtrain_models::LoadDtype::Kind(k) => k,
            tchtrain_models::LoadDtype::Auto => tch::Kind::Float,
        };
        let compute_name = match compute {
            tch::Kind::BFloat16 => "bfloat16",
            tch::Kind::Half => "float16",
            _ => "float32",
        };
        let config = tchtrain_models::BitsAndBytesConfig::from_json(&serde_json::json!({
            "load_in_4bit": true,
            "bnb_4bit_compute_dtype": compute_name,
            "bnb_4bit_quant_type": self.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": self.use_bnb_nested_quant,
            "bnb_4bit_quant_storage": self.bnb_4bit_quant_storage,
        }))
        .map_err(|e| Error::InvalidFlag {
            flag: "load_in_4bit".into(),
            detail: e.to_string(),
        })?;
        Ok(Some(config))
    }

    /// LoRA flags without `--use_peft` would do nothing: an error naming the fix.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.use_peft && *self != Self::default() {
            return Err(Error::InvalidFlag {
                flag: "use_peft".into(),
                detail:
                    "LoRA or quantization flags were given without --use_peft: add --use_peft to train an adapter (a quantized model trains through its adapter only)"
                        .into(),
            });
        }
        Ok(())
    }

    /// The model with its adapter (`get_peft_model`, drawing from the global generator as
    /// peft does), or as it is without `--use_peft`. `name_or_path` (`--model_name_or_path`)
    /// is the adapter's `base_model_name_or_path`, as peft takes it from the model.
    pub(crate) fn wrap(
        &self,
        model: Box<dyn PreTrainedModel>,
        name_or_path: Option<&str>,
    ) -> Result<Box<dyn PreTrainedModel>> {
        match self.lora_config() {
            Some(config) => {
                let config = LoraConfig {
                    base_model_name_or_path: name_or_path.map(String::from),
                    ..config
                };
                let peft = get_peft_model(model, config)?;
                let (trainable, all) = peft.get_nb_trainable_parameters();
                log::info!(
                    "trainable params: {trainable} || all params: {all} || trainable%: {:.4}",
                    100.0 * trainable as f64 / all.max(1) as f64
                );
                Ok(Box::new(peft))
            }
            None => Ok(model),
        }
    }
}
