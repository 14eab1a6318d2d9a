//! `trl/trainer/dpo_config.py`'s `DPOConfig`: the Trainer's arguments with TRL's defaults
//! (`learning_rate` 1e-6, `logging_steps` 10, gradient checkpointing on, `bf16` on unless
//! `fp16`), plus the DPO fields.

use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};
use crate::trainer::base_config;
use crate::trainer::sft_config::TruncationMode;

/// One of `loss_type`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpoLossType {
    /// `"sigmoid"`: DPO's `-logsigmoid(β Δ)`.
    Sigmoid,
    /// `"hinge"`: `relu(1 - β Δ)` (SLiC).
    Hinge,
    /// `"ipo"`: `(Δ_avg - 1/(2β))²` over the length-averaged scores.
    Ipo,
    /// `"exo_pair"`: EXO's reverse KL to the smoothed labels.
    ExoPair,
    /// `"nca_pair"`: NCA.
    NcaPair,
    /// `"robust"`: label-smoothed DPO, unbiased (rDPO).
    Robust,
    /// `"bco_pair"`: BCO.
    BcoPair,
    /// `"sppo_hard"`: SPPO with hard labels.
    SppoHard,
    /// `"aot"`: AOT over sorted log-ratio differences.
    Aot,
    /// `"aot_unpaired"`: AOT over sorted chosen / rejected log-ratios.
    AotUnpaired,
    /// `"apo_zero"`: APO-zero.
    ApoZero,
    /// `"apo_down"`: APO-down.
    ApoDown,
    /// `"discopop"`: DiscoPOP's log-ratio modulated loss.
    Discopop,
    /// `"sft"`: the chosen completions' negative log-likelihood.
    Sft,
    /// `"sigmoid_norm"`: the sigmoid loss over length-averaged scores.
    SigmoidNorm,
}

impl DpoLossType {
    /// TRL's names.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "sigmoid" => Self::Sigmoid,
            "hinge" => Self::Hinge,
            "ipo" => Self::Ipo,
            "exo_pair" => Self::ExoPair,
            "nca_pair" => Self::NcaPair,
            "robust" => Self::Robust,
            "bco_pair" => Self::BcoPair,
            "sppo_hard" => Self::SppoHard,
            "aot" => Self::Aot,
            "aot_unpaired" => Self::AotUnpaired,
            "apo_zero" => Self::ApoZero,
            "apo_down" => Self::ApoDown,
            "discopop" => Self::Discopop,
            "sft" => Self::Sft,
            "sigmoid_norm" => Self::SigmoidNorm,
            other => {
                return Err(Error::InvalidArgument {
                    field: "loss_type",
                    detail: format!(
                        "Unknown loss type: {other}. Should be one of ['sigmoid', 'hinge', 'ipo', 'exo_pair', 'nca_pair', 'robust', 'bco_pair', 'sppo_hard', 'aot', 'aot_unpaired', 'apo_zero', 'apo_down', 'discopop', 'sft', 'sigmoid_norm'] (TRL's message)"
                    ),
                });
            }
        })
    }

    /// Whether the loss is built on the chosen-rejected score difference (the ones a
    /// non-default `f_divergence_type` applies to).
    fn takes_f_divergence(self) -> bool {
        matches!(
            self,
            Self::Sigmoid
                | Self::SigmoidNorm
                | Self::Hinge
                | Self::Ipo
                | Self::ExoPair
                | Self::Robust
                | Self::Discopop
                | Self::Sft
        )
    }
}

/// `f_divergence_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FDivergenceType {
    /// `"reverse_kl"` (standard DPO).
    #[default]
    ReverseKl,
    /// `"forward_kl"`.
    ForwardKl,
    /// `"js_divergence"`.
    JsDivergence,
    /// `"alpha_divergence"` (with `f_alpha_divergence_coef`).
    AlphaDivergence,
}

impl FDivergenceType {
    /// TRL's names.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "reverse_kl" => Self::ReverseKl,
            "forward_kl" => Self::ForwardKl,
            "js_divergence" => Self::JsDivergence,
            "alpha_divergence" => Self::AlphaDivergence,
            other => {
                return Err(Error::InvalidArgument {
                    field: "f_divergence_type",
                    detail: format!(
                        "Unknown f_divergence_type: {other} (TRL's message); use reverse_kl, forward_kl, js_divergence or alpha_divergence"
                    ),
                });
            }
        })
    }
}

/// TRL's `DPOConfig`.
#[derive(Debug, Clone)]
pub struct DPOConfig {
    /// The Trainer's arguments (TRL's defaults set by [`DPOConfig::new`]; `bf16` is resolved
    /// from [`DPOConfig::bf16`] at [`DPOConfig::post_init`]).
    pub base: TrainingArguments,
    /// TRL's `bf16=None`: `None` resolves to `!fp16` at [`DPOConfig::post_init`].
    pub bf16: Option<bool>,
    /// `router_aux_loss_coef`: the MoE load-balancing loss's weight (refused here unless
    /// `0.0` on a mixture-of-experts model: the fused head's router loss is not computed).
    pub router_aux_loss_coef: Option<f64>,
    /// `disable_dropout` (true): the decoder families have no dropout modules, so it changes
    /// nothing there, as upstream.
    pub disable_dropout: bool,
    /// `max_length` (1024): the collator truncates each prompt + completion to it.
    pub max_length: Option<usize>,
    /// `truncation_mode` (`keep_start`; rows whose prompt fills `max_length` are dropped).
    pub truncation_mode: TruncationMode,
    /// `padding_free` (refused when true: TRL 1.16 itself falls back to padding).
    pub padding_free: bool,
    /// `pad_to_multiple_of` (`"auto"`: none on the CPU).
    pub pad_to_multiple_of: Option<usize>,
    /// `precompute_ref_log_probs`: the reference log-probabilities computed once before
    /// training (by the reference model, or the policy before training).
    pub precompute_ref_log_probs: bool,
    /// `precompute_ref_batch_size` (`None`: the per-device train / eval batch size).
    pub precompute_ref_batch_size: Option<usize>,
    /// `loss_type` (`["sigmoid"]`): several are summed with `loss_weights`.
    pub loss_type: Vec<DpoLossType>,
    /// `loss_weights` (`None`: 1.0 each).
    pub loss_weights: Option<Vec<f64>>,
    /// `ld_alpha`: LD-DPO's weight of the completion tokens beyond the shorter completion.
    pub ld_alpha: Option<f64>,
    /// `f_divergence_type`.
    pub f_divergence_type: FDivergenceType,
    /// `f_alpha_divergence_coef` (0.5).
    pub f_alpha_divergence_coef: f64,
    /// `label_smoothing` (0.0).
    pub label_smoothing: f64,
    /// `beta` (0.1).
    pub beta: f64,
    /// `use_weighting`: WPO's per-pair weights.
    pub use_weighting: bool,
    /// `discopop_tau` (0.05).
    pub discopop_tau: f64,
    /// `activation_offloading` (refused when true).
    pub activation_offloading: bool,
    /// `sync_ref_model`: TR-DPO's reference updated every `ref_model_sync_steps` steps.
    pub sync_ref_model: bool,
    /// `ref_model_mixup_alpha` (0.6).
    pub ref_model_mixup_alpha: f64,
    /// `ref_model_sync_steps` (512).
    pub ref_model_sync_steps: usize,
    /// `pad_token` (deprecated upstream): the padding token (default the tokenizer's, else
    /// its EOS).
    pub pad_token: Option<String>,
}

impl DPOConfig {
    /// `DPOConfig(output_dir)`: TRL's defaults.
    pub fn new(output_dir: impl Into<String>) -> Self {
        Self {
            base: base_config::base_arguments(output_dir, 1e-6),
            bf16: None,
            router_aux_loss_coef: None,
            disable_dropout: true,
            max_length: Some(1024),
            truncation_mode: TruncationMode::KeepStart,
            padding_free: false,
            pad_to_multiple_of: None,
            precompute_ref_log_probs: false,
            precompute_ref_batch_size: None,
            loss_type: vec![DpoLossType::Sigmoid],
            loss_weights: None,
            ld_alpha: None,
            f_divergence_type: FDivergenceType::ReverseKl,
            f_alpha_divergence_coef: 0.5,
            label_smoothing: 0.0,
            beta: 0.1,
            use_weighting: false,
            discopop_tau: 0.05,
            activation_offloading: false,
            sync_ref_model: false,
            ref_model_mixup_alpha: 0.6,
            ref_model_sync_steps: 512,
            pad_token: None,
        }
    }

    /// `__post_init__` and the trainer's checks of the loss settings, with TRL's messages;
    /// what is not implemented here is refused, naming the field.
    pub fn post_init(&mut self) -> Result<()> {
        base_config::post_init(&mut self.base, self.bf16)?;
        let refuse = |field: &'static str, detail: String| -> Result<()> {
            Err(Error::InvalidArgument { field, detail })
        };
        if self.loss_type.is_empty() {
            refuse("loss_type", "at least one loss type is needed".into())?;
        }
        if let Some(w) = &self.loss_weights
            && w.len() != self.loss_type.len()
        {
            refuse(
                "loss_weights",
                format!(
                    "`loss_weights` must have the same length as `loss_type` when combining multiple losses. Got {} weights for {} loss types. (TRL's message)",
                    w.len(),
                    self.loss_type.len()
                ),
            )?;
        }
        if self.f_divergence_type != FDivergenceType::ReverseKl
            && !self.loss_type.iter().all(|l| l.takes_f_divergence())
        {
            refuse(
                "f_divergence_type",
                format!(
                    "`f_divergence_type` other than 'reverse_kl' is only supported for the loss types ['discopop', 'exo_pair', 'hinge', 'ipo', 'robust', 'sft', 'sigmoid', 'sigmoid_norm']. You provided {:?}. (TRL's message)",
                    self.loss_type
                ),
            )?;
        }
        if self.use_weighting
            && self
                .loss_type
                .iter()
                .any(|l| matches!(l, DpoLossType::Aot | DpoLossType::AotUnpaired))
        {
            refuse(
                "use_weighting",
                "WPO-style weighting is not implemented for 'aot' or 'aot_unpaired' because those losses sort samples, which would misalign per-pair weights. (TRL's message)".into(),
            )?;
        }
        if self.loss_type.contains(&DpoLossType::ExoPair) && self.label_smoothing == 0.0 {
            refuse(
                "label_smoothing",
                "Label smoothing must be greater than 0.0 when using 'exo_pair' loss. The EXO paper recommends a value of 1e-3. (TRL's message)".into(),
            )?;
        }
        if let Some(a) = self.ld_alpha
            && !(0.0..=1.0).contains(&a)
        {
            refuse("ld_alpha", format!("{a}: must be in [0.0, 1.0]"))?;
        }
        if self.padding_free {
            refuse(
                "padding_free",
                "trl 1.16 itself disables it (\"temporarily unavailable after a refactor\") and pads; leave it False".into(),
            )?;
        }
        if self.activation_offloading {
            refuse(
                "activation_offloading",
                "offloading activations to the host is not implemented here; use gradient_checkpointing".into(),
            )?;
        }
        if self.pad_to_multiple_of == Some(0) {
            refuse("pad_to_multiple_of", "must be at least 1 (or None)".into())?;
        }
        if self.sync_ref_model && self.precompute_ref_log_probs {
            refuse(
                "sync_ref_model",
                "You cannot use `sync_ref_model=True` together with `precompute_ref_log_probs=True`: the precomputed reference log-probs would go stale. (TRL's message)".into(),
            )?;
        }
        if self.sync_ref_model && self.ref_model_sync_steps == 0 {
            refuse("ref_model_sync_steps", "must be at least 1".into())?;
        }
        if matches!(
            self.base.train_sampling_strategy.as_str(),
            "group_by_length" | "batch_rebalance"
        ) {
            refuse(
                "train_sampling_strategy",
                "the preference rows have no `input_ids` to group by (upstream: \"Can only automatically infer lengths for datasets whose items are dictionaries with an 'input_ids' key.\"); leave it 'random'".into(),
            )?;
        }
        Ok(())
    }
}
