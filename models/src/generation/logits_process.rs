//! Upstream's logits processors and warpers (`generation/logits_process.py` of transformers
//! 5.23) that greedy decoding and sampling use here, op for op on float32 scores `[batch,
//! vocab]`, and `_get_logits_processor`'s order: repetition penalty, no-repeat n-grams,
//! minimum length, minimum new tokens, forced BOS / EOS tokens,
//! suppressed tokens, tokens suppressed at the first position, then (sampling only)
//! temperature, top-k, top-p, min-p.

use tch::{Kind, Tensor};

use super::configuration_utils::GenerationConfig;
use crate::Result;

/// One processor.
#[derive(Debug)]
pub enum LogitsProcessor {
    /// `RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length)`: every token id of
    /// a row (but its leading padding) scored `s * p` where negative, `s / p` otherwise.
    RepetitionPenalty {
        /// The penalty.
        penalty: f64,
        /// Each row's leading padding `[batch]`, left out.
        prompt_ignore_length: Option<Tensor>,
    },
    /// `NoRepeatNGramLogitsProcessor(n)`: the token that would repeat an n-gram is banned.
    NoRepeatNGram(i64),
    /// `MinLengthLogitsProcessor(min_length, eos)`: the end-of-sequence ids banned while the
    /// sequence (prompt included) is shorter.
    MinLength {
        /// `min_length`.
        min_length: i64,
        /// The end-of-sequence ids.
        eos: Vec<i64>,
    },
    /// `MinNewTokensLengthLogitsProcessor(prompt_length_to_skip, min_new_tokens, eos)`.
    MinNewTokens {
        /// The prompt's width.
        prompt_length_to_skip: i64,
        /// `min_new_tokens`.
        min_new_tokens: i64,
        /// The end-of-sequence ids.
        eos: Vec<i64>,
    },
    /// `ForcedBOSTokenLogitsProcessor(id)`: at length 1 (the decoder start alone) every
    /// score -inf but `id`'s, 0.
    ForcedBos(i64),
    /// `ForcedEOSTokenLogitsProcessor(max_length, ids)`: at length `max_length - 1` every
    /// score -inf but the ids', 0.
    ForcedEos {
        /// The generation's `max_length`.
        max_length: i64,
        /// The forced ids.
        ids: Vec<i64>,
    },
    /// `SuppressTokensLogitsProcessor(ids)`: the ids' scores -inf at every step.
    SuppressTokens(Vec<i64>),
    /// `SuppressTokensAtBeginLogitsProcessor(ids, begin_index)`: the ids' scores -inf when
    /// the sequence is `begin_index` long (the first generated position).
    SuppressTokensAtBegin {
        /// The suppressed ids.
        ids: Vec<i64>,
        /// The sequence length at which they are suppressed.
        begin_index: i64,
    },
    /// `TemperatureLogitsWarper(t)`: `scores / t`.
    Temperature(f64),
    /// `TopKLogitsWarper(k)`: below the k-th score removed (ties kept).
    TopK(i64),
    /// `TopPLogitsWarper(p, min_tokens_to_keep)`: the smallest-probability tail summing to at
    /// most `1 - p` removed (the `min_keep` most probable tokens always kept).
    TopP {
        /// `top_p`.
        p: f64,
        /// `min_tokens_to_keep`.
        min_keep: i64,
    },
    /// `MinPLogitsWarper(p, min_tokens_to_keep)`: probabilities under `p` times the largest
    /// removed.
    MinP {
        /// `min_p`.
        p: f64,
        /// `min_tokens_to_keep`.
        min_keep: i64,
    },
}

/// `filter_value`.
const REMOVED: f64 = f64::NEG_INFINITY;

/// `torch.isin(arange(vocab), ids)`.
fn vocab_mask(scores: &Tensor, ids: &[i64]) -> Result<Tensor> {
    let vocab = Tensor::f_arange(scores.size()[1], (Kind::Int64, scores.device()))?;
    let ids = Tensor::f_from_slice(ids)?.f_to_device(scores.device())?;
    Ok(Tensor::f_isin(&vocab, &ids, false, false)?)
}

/// `torch.full_like(scores, -inf)` with the `ids` columns set to 0.
fn forced(scores: &Tensor, ids: &[i64]) -> Result<Tensor> {
    let mut out = scores.f_full_like(REMOVED)?;
    let index = Tensor::f_from_slice(ids)?.f_to_device(scores.device())?;
    let _ = out.f_index_fill_(1, &index, 0.0)?;
    Ok(out)
}

impl LogitsProcessor {
    /// `processor(input_ids, scores)`.
    pub fn process(&self, input_ids: &Tensor, scores: Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::SuppressTokens(ids) => {
                let mask = vocab_mask(&scores, ids)?;
                let inf = Tensor::f_scalar_tensor(REMOVED, (scores.kind(), scores.device()))?;
                inf.f_where_self(&mask, &scores)?
            }
            Self::SuppressTokensAtBegin { ids, begin_index } => {
                if input_ids.size()[1] == *begin_index {
                    let mask = vocab_mask(&scores, ids)?;
                    let inf = Tensor::f_scalar_tensor(REMOVED, (scores.kind(), scores.device()))?;
                    inf.f_where_self(&mask, &scores)?
                } else {
                    scores
                }
            }
            Self::RepetitionPenalty {
                penalty,
                prompt_ignore_length,
            } => {
                let vocab = scores.size()[1];
                let ids = match prompt_ignore_length {
                    Some(pil) => {
                        let positions = Tensor::f_arange(
                            input_ids.size()[1],
                            (Kind::Int64, input_ids.device()),
                        )?;
                        let ignored = positions.unsqueeze(0).f_lt_tensor(&pil.unsqueeze(1))?;
                        input_ids.f_masked_fill(&ignored, vocab)?
                    }
                    None => input_ids.shallow_clone(),
                };
                let ids = ids.f_clamp_max(vocab)?;
                let padded = scores.f_constant_pad_nd([0, 1])?;
                let score = padded.f_gather(1, &ids, false)?;
                // `torch.where(score < 0, score * p, score / p)`.
                let score =
                    (&score * *penalty).f_where_self(&score.f_lt(0.0)?, &(&score / *penalty))?;
                padded.f_scatter(1, &ids, &score)?.f_narrow(1, 0, vocab)?
            }
            Self::NoRepeatNGram(n) => {
                let cur_len = input_ids.size()[1];
                if cur_len < *n {
                    return Ok(scores);
                }
                let prefix = input_ids.f_narrow(1, cur_len + 1 - n, n - 1)?;
                let windows = input_ids.f_unfold(1, *n, 1)?;
                let matches = windows
                    .f_narrow(-1, 0, n - 1)?
                    .f_eq_tensor(&prefix.unsqueeze(1))?
                    .f_all_dims(&[-1i64][..], false)?;
                let vocab = scores.size()[1];
                let last = windows.f_select(-1, n - 1)?.f_clamp_max(vocab)?;
                let spare = Tensor::f_full_like(&last, vocab)?;
                let index = last.f_where_self(&matches, &spare)?;
                let banned =
                    Tensor::f_zeros([scores.size()[0], vocab + 1], (Kind::Bool, scores.device()))?
                        .f_scatter_value(1, &index, 1)?;
                scores.f_masked_fill(&banned.f_narrow(1, 0, vocab)?, REMOVED)?
            }
            Self::MinLength { min_length, eos } => {
                if input_ids.size()[1] < *min_length {
                    let mask = vocab_mask(&scores, eos)?;
                    scores.f_masked_fill(&mask, REMOVED)?
                } else {
                    scores
                }
            }
            Self::MinNewTokens {
                prompt_length_to_skip,
                min_new_tokens,
                eos,
            } => {
                if input_ids.size()[1] - prompt_length_to_skip < *min_new_tokens {
                    let mask = vocab_mask(&scores, eos)?;
                    scores.f_masked_fill(&mask, REMOVED)?
                } else {
                    scores
                }
            }
            Self::ForcedBos(id) => {
                if input_ids.size()[1] == 1 {
                    forced(&scores, &[*id])?
                } else {
                    scores
                }
            }
            Self::ForcedEos { max_length, ids } => {
                if input_ids.size()[1] == max_length - 1 {
                    forced(&scores, ids)?
                } else {
                    scores
                }
            }
            Self::Temperature(t) => scores.f_div_scalar(*t)?,
            Self::TopK(k) => {
                let k = (*k).min(scores.size()[1]);
                let (values, _) = scores.f_topk(k, -1, true, true)?;
                let kth = values.f_narrow(-1, k - 1, 1)?;
                let remove = scores.f_lt_tensor(&kth)?;
                scores.f_masked_fill(&remove, REMOVED)?
            }
            Self::TopP { p, min_keep } => {
                let (sorted, indices) = scores.f_sort(-1, false)?;
                let cumulative = sorted
                    .f_softmax(-1, Kind::Float)?
                    .f_cumsum(-1, None::<Kind>)?;
                let remove = cumulative.f_le(1.0 - *p)?;
                let vocab = remove.size()[1];
                let keep = (*min_keep).min(vocab);
                let _ = remove.f_narrow(1, vocab - keep, keep)?.f_fill_(0)?;
                let remove = remove.f_scatter(1, &indices, &remove)?;
                scores.f_masked_fill(&remove, REMOVED)?
            }
            Self::MinP { p, min_keep } => {
                let probs = scores.f_softmax(-1, Kind::Float)?;
                let top = probs.f_amax(&[-1i64][..], true)?;
                let remove = probs.f_lt_tensor(&(top * *p))?;
                let k = (*min_keep).min(probs.size()[1]);
                let (_, keep) = probs.f_topk(k, -1, true, true)?;
                let remove = remove.f_scatter_value(-1, &keep, 0)?;
                scores.f_masked_fill(&remove, REMOVED)?
            }
        })
    }
}

/// Upstream's `_get_logits_processor` for greedy decoding and sampling: the processors
/// `config` asks for, in upstream's order. `prompt_len` is the input's width (padding
/// included), `padding_lengths` each row's leading padding when the mask has any,
/// `max_length` the generation's resolved length.
pub fn logits_processors(
    config: &GenerationConfig,
    prompt_len: i64,
    eos: &[i64],
    padding_lengths: Option<&Tensor>,
    max_length: i64,
) -> Vec<LogitsProcessor> {
    let mut out = Vec::new();
    if let Some(p) = config.repetition_penalty.filter(|p| *p != 1.0) {
        out.push(LogitsProcessor::RepetitionPenalty {
            penalty: p,
            prompt_ignore_length: padding_lengths.map(Tensor::shallow_clone),
        });
    }
    if let Some(n) = config.no_repeat_ngram_size.filter(|n| *n > 0) {
        out.push(LogitsProcessor::NoRepeatNGram(n));
    }
    if !eos.is_empty() {
        if let Some(min_length) = config.min_length.filter(|m| *m > 0) {
            out.push(LogitsProcessor::MinLength {
                min_length,
                eos: eos.to_vec(),
            });
        }
        if let Some(min_new_tokens) = config.min_new_tokens.filter(|m| *m > 0) {
            out.push(LogitsProcessor::MinNewTokens {
                prompt_length_to_skip: prompt_len,
                min_new_tokens,
                eos: eos.to_vec(),
            });
        }
    }
    if let Some(id) = config.forced_bos_token_id {
        out.push(LogitsProcessor::ForcedBos(id));
    }
    if let Some(ids) = &config.forced_eos_token_id {
        out.push(LogitsProcessor::ForcedEos {
            max_length,
            ids: ids.clone(),
        });
    }
    if let Some(ids) = &config.suppress_tokens {
        out.push(LogitsProcessor::SuppressTokens(ids.clone()));
    }
    if let Some(ids) = &config.begin_suppress_tokens {
        // One past a lone decoder start when a BOS token is forced after it.
        let begin_index = if prompt_len > 1 || config.forced_bos_token_id.is_none() {
            prompt_len
        } else {
            prompt_len + 1
        };
        out.push(LogitsProcessor::SuppressTokensAtBegin {
            ids: ids.clone(),
            begin_index,
        });
    }
    if config.do_sample == Some(true) {
        // Beam sampling keeps one token past the end-of-sequence ids.
        let min_keep = if config.num_beams.unwrap_or(1) > 1 {
            if eos.is_empty() {
                2
            } else {
                eos.len() as i64 + 1
            }
        } else {
            1
        };
        if let Some(t) = config.temperature.filter(|t| *t != 1.0) {
            out.push(LogitsProcessor::Temperature(t));
        }
        // `top_k` defaults to 50 (`_get_default_generation_params`): sampling keeps the 50
        // best tokens unless told otherwise.
        if let Some(k) = Some(config.top_k.unwrap_or(50)).filter(|k| *k != 0) {
            out.push(LogitsProcessor::TopK(k.max(min_keep)));
        }
        if let Some(p) = config.top_p.filter(|p| *p < 1.0) {
            out.push(LogitsProcessor::TopP { p, min_keep });
        }
        if let Some(p) = config.min_p {
            out.push(LogitsProcessor::MinP { p, min_keep });
        }
    }
    out
}
