//! peft's `utils/other.py` helpers for quantized bases: `prepare_model_for_kbit_training`.

use crate::{ActivationCheckpointing, Result, TrainableModel};

/// peft's `prepare_model_for_kbit_training(model, use_gradient_checkpointing)`: every
/// parameter frozen, the half-precision ones (float16 / bfloat16) cast to float32 (the 4-bit
/// weights stay as they are), and with `use_gradient_checkpointing` (peft's default) the
/// model's activation checkpointing enabled. Call it on the 4-bit model before
/// [`get_peft_model`](crate::get_peft_model).
///
/// With checkpointing, the input embeddings' output is made to require a gradient
/// (`enable_input_require_grads`, as peft does for reentrant checkpointing, which the
/// checkpoints here are): over a frozen embedding the layers would otherwise run without
/// being checkpointed.
pub fn prepare_model_for_kbit_training(
    model: &mut dyn TrainableModel,
    use_gradient_checkpointing: bool,
) -> Result<()> {
    let vars = model.var_store().variables();
    tch::no_grad(|| -> Result<()> {
        for (_, v) in vars {
            if !v.is_floating_point() {
                continue;
            }
            let mut v = v.set_requires_grad(false);
            if matches!(v.kind(), tch::Kind::Half | tch::Kind::BFloat16) {
                let f = v.f_to_kind(tch::Kind::Float)?;
                v.f_set_data(&f)?;
            }
        }
        Ok(())
    })?;
    if use_gradient_checkpointing {
        model.context().enable_input_require_grads();
        model.activation_checkpointing_enable(ActivationCheckpointing::default())?;
    }
    Ok(())
}
