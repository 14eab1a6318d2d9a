//! What the Trainer reads off a model beyond its own methods: the parameters in
//! `model.parameters()` order and by name, `num_parameters(exclude_embeddings=True)` and
//! `floating_point_ops`. The facts themselves (`loss_type`, `accepts_loss_kwargs`, the
//! LayerNorm modules, the embedding weights) are methods of
//! [`TrainableModel`](tchtrain_models::TrainableModel), stated by each model.

use tch::Tensor;
use tchtrain_collators::Batch;
use tchtrain_models::TrainableModel;

/// The trainable parameters in the order the model created them, which the models keep
/// equal to upstream's module registration order (`model.parameters()`, a tied weight once,
/// at its first place; checked against upstream's `named_parameters()` in tchtrain-models'
/// tests). Gradient clipping sums the per-parameter norms in this order, as torch does:
/// another order changes the total norm in the last bits, and with bf16 autocast such a bit
/// shows in the next steps' losses.
pub fn parameters(model: &dyn TrainableModel) -> Vec<Tensor> {
    model.parameters()
}

/// The names of the trainable parameters in [`parameters`] order (`named_parameters()`'s
/// order upstream; each variable matched by its storage).
pub fn parameter_names_in_order(model: &dyn TrainableModel) -> Vec<String> {
    let named = named_parameters(model);
    parameters(model)
        .iter()
        .filter_map(|t| {
            named
                .iter()
                .find(|(_, v)| v.data_ptr() == t.data_ptr() && v.size() == t.size())
                .map(|(n, _)| n.clone())
        })
        .collect()
}

/// The model's parameters with their names, sorted by name (a stable order for the
/// optimizer's state layout).
pub fn named_parameters(model: &dyn TrainableModel) -> Vec<(String, Tensor)> {
    let mut named: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// Upstream `num_parameters(exclude_embeddings)`: every parameter once (tied weights are
/// one variable; buffers such as Gemma 4's `layer_scalar` are not parameters), without the
/// embedding matrices (the model's [`is_embedding_weight`](TrainableModel::is_embedding_weight))
/// when asked.
///
/// A 4-bit part's packed `weight` counts twice its bytes (two values per byte), its state
/// (`weight.absmax`, ...) not at all: `Params4bit` is its only parameter upstream; an 8-bit
/// part's int8 `weight` counts once, its `SCB` and `weight_format` not at all (`Int8Params`).
/// peft's `modules_to_save` count twice (its wrapper holds the original and the trained copy;
/// see [`parameters_held_twice`](TrainableModel::parameters_held_twice)).
pub fn num_parameters(model: &dyn TrainableModel, exclude_embeddings: bool) -> i64 {
    let buffers = model.buffer_names();
    let quantized = tchtrain_models::quantized_modules(model);
    let is_packed = |name: &str, t: &tch::Tensor| {
        t.kind() == tch::Kind::Uint8
            && name
                .strip_suffix(".weight")
                .is_some_and(|m| quantized.iter().any(|q| q == m))
    };
    let is_state = |name: &str| {
        quantized.iter().any(|q| {
            name.strip_prefix(q.as_str()).is_some_and(|rest| {
                rest.starts_with(".weight.") || rest == ".SCB" || rest == ".weight_format"
            })
        })
    };
    let twice = model.parameters_held_twice();
    model
        .var_store()
        .variables()
        .iter()
        .filter(|(name, _)| !buffers.contains(name) && !is_state(name))
        .filter(|(name, _)| !(exclude_embeddings && model.is_embedding_weight(name)))
        .map(|(name, t)| {
            let copies = if twice.contains(name) { 2 } else { 1 };
            t.numel() as i64 * if is_packed(name, t) { 2 } else { 1 } * copies
        })
        .sum()
}

/// Upstream `floating_point_ops`: `6 * inputs[main_input_name].numel() *
/// num_parameters(exclude_embeddings=True)` (forward + backward; `main_input_name` is
/// `input_ids`, a vision model's `pixel_values`), 0 when the batch has no such input.
pub fn floating_point_ops(
    num_params_without_embeddings: i64,
    inputs: &Batch,
    main_input_name: &str,
) -> f64 {
    inputs.get(main_input_name).map_or(0.0, |ids| {
        6.0 * ids.numel() as f64 * num_params_without_embeddings as f64
    })
}
