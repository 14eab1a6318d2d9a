//! NEFTune (upstream `integrations/neftune.py`): uniform noise added to the input
//! embeddings' output in training mode, `alpha / sqrt(seq_len * hidden)` wide, drawn from
//! the global generator as upstream's forward hook on `get_input_embeddings()` draws it.
//!
//! [`Context::activate_neftune`](crate::Context::activate_neftune) sets the noise level of
//! a model until its guard is dropped (the Trainer does so for the length of `train`, as
//! upstream's `activate_neftune` / `deactivate_neftune`); every model calls
//! [`neftune_post_forward_hook`] on the output of each lookup of its input embeddings
//! (GPT-2's `wte`, also for `token_type_ids`; BERT's `word_embeddings`; Llama's
//! `embed_tokens`), which adds the noise only when the model is training.

use tch::Tensor;

use crate::context::Context;
use crate::error::Result;

/// Upstream `neftune_post_forward_hook`: with NEFTune active on the model of `ctx` and
/// `training`, `output` (`[batch, seq, hidden]`) plus `zeros_like(output).uniform_(-m, m)`
/// where `m = alpha / sqrt(seq * hidden)`, computed with upstream's float32 ops
/// (`torch.sqrt` of an int64 tensor, then Python's `alpha / t`, which is
/// `t.reciprocal() * alpha`); else `output` unchanged.
pub fn neftune_post_forward_hook(ctx: &Context, output: Tensor, training: bool) -> Result<Tensor> {
    let Some(alpha) = ctx.neftune_noise_alpha() else {
        return Ok(output);
    };
    if !training {
        return Ok(output);
    }
    let size = output.size();
    let dims = Tensor::from(size[1] * size[2]);
    let mag_norm = dims.f_sqrt()?.f_reciprocal()?.f_mul_scalar(alpha)?;
    let m = mag_norm.f_double_value(&[])?;
    let mut noise = output.f_zeros_like()?;
    let _ = noise.f_uniform_(-m, m)?;
    Ok(output.f_add(&noise)?)
}
