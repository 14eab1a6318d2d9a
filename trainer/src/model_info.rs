//! What the Trainer reads off a model: upstream's model introspection
//! (`model_accepts_loss_kwargs`, `_loss_shifts_labels`), the LayerNorm parameters excluded
//! from weight decay, `num_parameters(exclude_embeddings=True)` and `floating_point_ops`.
//!
//! A `VarStore` carries names but no module types, so the module-type rules of upstream
//! are expressed on upstream's parameter names here.

use tch::Tensor;
use tchtrain_collators::Batch;
use tchtrain_models::PreTrainedModel;

/// Upstream `model_accepts_loss_kwargs` for a model of this crate's families: `true`.
///
/// Upstream reads the model's `accepts_loss_kwargs` attribute, else checks whether its
/// `forward` takes `**kwargs`; in transformers 5.23 every GPT-2, BERT and Llama class
/// (heads included) has `**kwargs: Unpack[TransformersKwargs]` and no attribute, so the
/// Trainer passes `num_items_in_batch` to all of them and never divides their loss by the
/// accumulation steps. BERT heads ignore the count (their loss is a per-batch mean), so
/// with accumulation their step gradient is the sum of the micro-batch means, exactly as
/// upstream's. [`TrainerBuilder::model_accepts_loss_kwargs`](crate::TrainerBuilder::model_accepts_loss_kwargs)
/// overrides this (upstream: set `model.accepts_loss_kwargs = False`).
pub fn model_accepts_loss_kwargs(_model: &dyn PreTrainedModel) -> bool {
    true
}

/// Upstream `_loss_shifts_labels`: the model's `loss_type` maps to `ForCausalLMLoss`.
/// `loss_type` comes from the class name (`...ForCausalLM`), so `LlamaForCausalLM` shifts
/// while `GPT2LMHeadModel` (no `loss_type`) does not count as shifting, although its loss
/// does shift: upstream then counts `num_items_in_batch` over all labels, and so do we.
pub fn loss_shifts_labels(model: &dyn PreTrainedModel) -> bool {
    model.architecture().contains("ForCausalLM")
}

/// Upstream's `model_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()` (the label
/// smoother's `shift_labels`): `GPT2LMHeadModel` and every `...ForCausalLM`.
pub fn is_causal_lm(model: &dyn PreTrainedModel) -> bool {
    let arch = model.architecture();
    arch.ends_with("ForCausalLM") || arch.ends_with("LMHeadModel")
}

/// The trainable parameters in the order the model created them, which the models keep
/// equal to upstream's module registration order (`model.parameters()`, a tied weight once,
/// at its first place). Gradient clipping sums the per-parameter norms in this order, as
/// torch does: another order changes the total norm in the last bits, and with bf16
/// autocast such a bit shows in the next steps' losses.
pub fn parameters(model: &dyn PreTrainedModel) -> Vec<Tensor> {
    model
        .var_store()
        .trainable_variables()
        .into_iter()
        .filter(Tensor::requires_grad)
        .collect()
}

/// The model's parameters with their names, sorted by name (a stable order for the
/// optimizer's state layout).
pub fn named_parameters(model: &dyn PreTrainedModel) -> Vec<(String, Tensor)> {
    let mut named: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// The LayerNorm modules among `names` whose parameters no pattern of upstream's
/// `forbidden_name_patterns` catches: GPT-2's `ln_1`, `ln_2`, `ln_f` (upstream excludes
/// them from weight decay as `nn.LayerNorm` modules). BERT's `LayerNorm` and Llama's
/// `*_layernorm` / `norm` already match the name patterns.
pub fn layernorm_modules<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    let mut out: Vec<String> = names
        .iter()
        .filter_map(|n| n.as_ref().rsplit_once('.').map(|(module, _)| module))
        .filter(|module| {
            let last = module.rsplit('.').next().unwrap_or(module);
            last == "ln_f" || (last.starts_with("ln_") && last[3..].parse::<u32>().is_ok())
        })
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether `name` is the weight of an `nn.Embedding` in this crate's models (GPT-2 `wte`,
/// `wpe`; BERT `word_embeddings`, `position_embeddings`, `token_type_embeddings`; Llama
/// `embed_tokens`).
pub fn is_embedding_weight(name: &str) -> bool {
    let Some(module) = name.strip_suffix(".weight") else {
        return false;
    };
    let last = module.rsplit('.').next().unwrap_or(module);
    matches!(
        last,
        "wte"
            | "wpe"
            | "word_embeddings"
            | "position_embeddings"
            | "token_type_embeddings"
            | "embed_tokens"
    )
}

/// Upstream `num_parameters(exclude_embeddings)`: every parameter once (tied weights are
/// one variable), without the embedding matrices when asked.
pub fn num_parameters(model: &dyn PreTrainedModel, exclude_embeddings: bool) -> i64 {
    model
        .var_store()
        .variables()
        .iter()
        .filter(|(name, _)| !(exclude_embeddings && is_embedding_weight(name)))
        .map(|(_, t)| t.numel() as i64)
        .sum()
}

/// Upstream `floating_point_ops`: `6 * input_ids.numel() * num_parameters(exclude_embeddings=True)`
/// (forward + backward), 0 when the batch has no `input_ids`.
pub fn floating_point_ops(num_params_without_embeddings: i64, inputs: &Batch) -> f64 {
    inputs.get("input_ids").map_or(0.0, |ids| {
        6.0 * ids.numel() as f64 * num_params_without_embeddings as f64
    })
}
