//! NEFTune (upstream `integrations/neftune.py`): uniform noise added to the input
//! embeddings' output in training mode, `alpha / sqrt(seq_len * hidden)` wide, drawn from
//! the global generator as upstream's forward hook on `get_input_embeddings()` draws it.
//!
//! [`activate_neftune`] installs the noise level for the forwards run on the current thread
//! until its guard is dropped (the Trainer does so for the length of `train`, as upstream's
//! `activate_neftune` / `deactivate_neftune`); every model calls
//! [`neftune_post_forward_hook`] on the output of each lookup of its input embeddings
//! (GPT-2's `wte`, also for `token_type_ids`; BERT's `word_embeddings`; Llama's
//! `embed_tokens`), which adds the noise only when the model is training.

use std::cell::Cell;

use tch::Tensor;

use crate::error::Result;

thread_local! {
    static ALPHA: Cell<Option<f64>> = const { Cell::new(None) };
}

/// Restores the previous NEFTune level of this thread when dropped (upstream's
/// `deactivate_neftune`).
#[derive(Debug)]
pub struct NeftuneGuard {
    previous: Option<f64>,
}

impl Drop for NeftuneGuard {
    fn drop(&mut self) {
        ALPHA.with(|a| a.set(self.previous));
    }
}

/// Upstream `activate_neftune(model, neftune_noise_alpha)`: the input embeddings of the
/// models run on this thread get NEFTune noise of level `alpha` while training, until the
/// guard is dropped.
pub fn activate_neftune(alpha: f64) -> NeftuneGuard {
    NeftuneGuard {
        previous: ALPHA.with(|a| a.replace(Some(alpha))),
    }
}

/// The NEFTune level active on this thread, if any.
pub fn neftune_noise_alpha() -> Option<f64> {
    ALPHA.with(Cell::get)
}

/// Upstream `neftune_post_forward_hook`: with NEFTune active and `training`, `output`
/// (`[batch, seq, hidden]`) plus `zeros_like(output).uniform_(-m, m)` where
/// `m = alpha / sqrt(seq * hidden)`, computed with upstream's float32 ops
/// (`torch.sqrt` of an int64 tensor, then Python's `alpha / t`, which is
/// `t.reciprocal() * alpha`); else `output` unchanged.
pub fn neftune_post_forward_hook(output: Tensor, training: bool) -> Result<Tensor> {
    let Some(alpha) = neftune_noise_alpha() else {
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
