//! `trl/trainer/utils.py`: `add_fused_lm_head`'s forward (`model(..., labels=labels,
//! fused_lm_head=True)`), which TRL's SFT trainer scores every batch with.

use tch::{Kind, Tensor};
use tchtrain_models::{ModelInputs, TrainableModel};

use crate::error::{Error, Result};
use crate::kernels::{CHUNKED_LOGPROB_CHUNK_SIZE, LogProbOutputs, chunked_logprob};

/// TRL's `FusedCausalLMOutput`: per-token values over the shifted labels' positions
/// `[batch, seq - 1]`, zero (false) where the label is -100; the optional ones `None` unless
/// asked for.
#[derive(Debug)]
pub struct FusedCausalLMOutput {
    /// `log p(label)` (float32), differentiable.
    pub log_probs: Tensor,
    /// The entropy of each position's distribution (float32).
    pub entropy: Option<Tensor>,
    /// `log(sum_v p_v^2)` of each position (float32).
    pub log_sum_sq_probs: Option<Tensor>,
    /// The mean logit of each position (float32).
    pub mean_logits: Option<Tensor>,
    /// Whether the label is the (first) argmax of its logits.
    pub is_top1: Option<Tensor>,
    /// `labels[:, 1:] != -100`.
    pub label_mask: Tensor,
}

impl FusedCausalLMOutput {
    /// An optional output the caller asked for.
    pub(crate) fn required<'a>(
        field: &'a Option<Tensor>,
        name: &'static str,
    ) -> Result<&'a Tensor> {
        field.as_ref().ok_or_else(|| Error::InvalidArgument {
            field: name,
            detail: format!("the fused LM head was not asked for `{name}`"),
        })
    }
}

/// `model(**inputs, labels=labels, fused_lm_head=True)` with `add_fused_lm_head(model,
/// outputs=...)`: the backbone alone
/// ([`ModelInputs::backbone_only`]), its hidden states but the last and the labels but the
/// first, and every position scored through the LM head by
/// [`chunked_logprob`](crate::kernels::chunked_logprob) (all positions, as TRL does off
/// Triton devices, then masked). Runs in the caller's autocast region.
pub fn fused_lm_head_forward(
    model: &dyn TrainableModel,
    inputs: &ModelInputs<'_>,
    labels: &Tensor,
    outputs: LogProbOutputs,
) -> Result<FusedCausalLMOutput> {
    fused_lm_head_forward_at(model, inputs, labels, outputs, 1.0)
}

/// [`fused_lm_head_forward`] with `add_fused_lm_head(model, temperature=...)`: the logits
/// divided by `temperature` (GRPO scores completions at its sampling temperature).
pub fn fused_lm_head_forward_at(
    model: &dyn TrainableModel,
    inputs: &ModelInputs<'_>,
    labels: &Tensor,
    outputs: LogProbOutputs,
    temperature: f64,
) -> Result<FusedCausalLMOutput> {
    let head = model.output_head().ok_or_else(|| Error::InvalidArgument {
        field: "model",
        detail: format!(
            "{} has no fused LM head here (a causal LM of the decoder families: Llama, Qwen, Mistral, Gemma, ...); TRL's trainers score tokens through it",
            model.model_name()
        ),
    })?;
    let backbone = model.forward(&ModelInputs {
        labels: None,
        num_items_in_batch: None,
        skip_logits: None,
        logits_to_keep: None,
        backbone_only: true,
        ..*inputs
    })?;
    let hidden = match (backbone.last_hidden_state, backbone.logits) {
        (Some(h), None) => h,
        _ => {
            return Err(Error::InvalidArgument {
                field: "model",
                detail: format!(
                    "{} did not run its backbone alone (ModelInputs::backbone_only)",
                    model.model_name()
                ),
            });
        }
    };
    let size = hidden.size();
    let (t, width) = (size[1], size[2]);
    if labels.size().get(1) != Some(&t) {
        return Err(Error::InvalidArgument {
            field: "labels",
            detail: format!(
                "labels {:?} do not match the hidden states {size:?}",
                labels.size()
            ),
        });
    }
    let hidden = hidden.f_narrow(1, 0, t - 1)?;
    let labels = labels.f_narrow(1, 1, t - 1)?;
    let mask = labels.f_ne(-100)?;
    let out = chunked_logprob(
        &hidden.f_reshape([-1, width])?,
        &head.weight,
        head.bias.as_ref(),
        &labels.f_clamp_min(0)?.f_reshape([-1])?,
        temperature,
        CHUNKED_LOGPROB_CHUNK_SIZE,
        head.final_logit_softcapping,
        head.logit_scale,
        outputs,
    )?;
    let shape = mask.size();
    let unmasked = mask.f_logical_not()?;
    let per_token = |x: Tensor, fill: f64| -> Result<Tensor> {
        Ok(x.f_view(shape.as_slice())?.f_masked_fill(&unmasked, fill)?)
    };
    let optional = |x: Option<Tensor>| x.map(|x| per_token(x, 0.0)).transpose();
    Ok(FusedCausalLMOutput {
        log_probs: per_token(out.log_probs, 0.0)?,
        entropy: optional(out.entropy)?,
        log_sum_sq_probs: optional(out.log_sum_sq_probs)?,
        mean_logits: optional(out.mean_logits)?,
        is_top1: optional(out.is_top1)?,
        label_mask: mask,
    })
}

/// `mask.sum()` as an int64 0-d tensor.
pub(crate) fn count(mask: &Tensor) -> Result<Tensor> {
    Ok(mask.f_sum(Kind::Int64)?)
}

/// TRL's `RepeatSampler`: each prompt `mini_repeat_count` times in a row (a group of
/// generations), the prompts in chunks of `batch_size` repeated `repeat_count` times (the
/// generation reused over several steps); a chunk shorter than `batch_size` is dropped. With
/// `shuffle`, the prompts follow `torch.randperm(n, generator)` of a generator seeded once
/// with `seed`: epoch `e` is its `e + 1`-th permutation (upstream's generator advances one
/// permutation per pass).
///
/// ```
/// use tchtrain_data::Sampler;
/// use tchtrain_trl::RepeatSampler;
/// let s = RepeatSampler::new(2, 3, 2, false, 0);
/// // upstream's docstring: mini_repeat_count=2, batch_size=3, repeat_count=2 over 7 rows
/// assert_eq!(
///     s.indices(7, 0),
///     [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 3, 3, 4, 4, 5, 5]
/// );
/// assert_eq!(s.num_samples(7), 24);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatSampler {
    mini_repeat_count: usize,
    batch_size: usize,
    repeat_count: usize,
    shuffle: bool,
    seed: u64,
}

impl RepeatSampler {
    /// `RepeatSampler(data_source, mini_repeat_count, batch_size, repeat_count, shuffle,
    /// seed)`.
    pub fn new(
        mini_repeat_count: usize,
        batch_size: usize,
        repeat_count: usize,
        shuffle: bool,
        seed: u64,
    ) -> Self {
        Self {
            mini_repeat_count,
            batch_size: batch_size.max(1),
            repeat_count,
            shuffle,
            seed,
        }
    }
}

impl tchtrain_data::Sampler for RepeatSampler {
    fn name(&self) -> &str {
        "repeat"
    }

    fn seed(&self) -> Option<u64> {
        self.shuffle.then_some(self.seed)
    }

    fn indices(&self, len: usize, epoch: u64) -> Vec<usize> {
        let order = if self.shuffle {
            let mut g = tchtrain_collators::TorchGenerator::new(self.seed);
            let mut perm = tchtrain_data::randperm(len, &mut g);
            for _ in 0..epoch {
                perm = tchtrain_data::randperm(len, &mut g);
            }
            perm
        } else {
            (0..len).collect()
        };
        let mut out = Vec::with_capacity(self.num_samples(len));
        for chunk in order.chunks_exact(self.batch_size) {
            for _ in 0..self.repeat_count {
                for &index in chunk {
                    out.extend(std::iter::repeat_n(index, self.mini_repeat_count));
                }
            }
        }
        out
    }

    fn num_samples(&self, len: usize) -> usize {
        (len / self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count
    }
}

/// TRL's `nanstd(tensor, dim, keepdim)`: the standard deviation of the non-NaN values with
/// Bessel's correction (NaN where fewer than two), in upstream's ops.
pub fn nanstd(tensor: &Tensor, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
    let dims: Option<&[i64]> = match &dim {
        Some(d) => Some(std::slice::from_ref(d)),
        None => None,
    };
    let all: Vec<i64> = (0..tensor.dim() as i64).collect();
    let reduce = dims.unwrap_or(&all);
    let mean = tensor.f_nanmean(reduce, true, None::<Kind>)?;
    let variance =
        tensor
            .f_sub(&mean)?
            .f_pow_tensor_scalar(2)?
            .f_nanmean(reduce, true, None::<Kind>)?;
    let count = tensor
        .f_isnan()?
        .f_logical_not()?
        .f_sum_dim_intlist(reduce, true, None::<Kind>)?;
    let correction = count.f_div(&count.f_sub_scalar(1)?)?;
    let correction =
        correction.f_where_self(&count.f_gt(1)?, &correction.f_full_like(f64::NAN)?)?;
    let std = variance.f_mul(&correction)?.f_sqrt()?;
    if keepdim {
        return Ok(std);
    }
    Ok(match dim {
        None => std.f_squeeze()?,
        Some(d) => std.f_squeeze_dim(d)?,
    })
}

/// TRL's `nanmin`: the smallest non-NaN value (NaN when all are).
pub fn nanmin(tensor: &Tensor) -> Result<f64> {
    let valid = tensor.f_masked_select(&tensor.f_isnan()?.f_logical_not()?)?;
    if valid.numel() == 0 {
        return Ok(f64::NAN);
    }
    Ok(f64::try_from(valid.f_min()?)?)
}

/// TRL's `nanmax`: the largest non-NaN value (NaN when all are).
pub fn nanmax(tensor: &Tensor) -> Result<f64> {
    let valid = tensor.f_masked_select(&tensor.f_isnan()?.f_logical_not()?)?;
    if valid.numel() == 0 {
        return Ok(f64::NAN);
    }
    Ok(f64::try_from(valid.f_max()?)?)
}
