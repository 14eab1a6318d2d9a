//! Upstream's `GenerationMixin.generate` (`generation/utils.py` of transformers 5.23) for
//! decoder-only and encoder-decoder models: greedy decoding and multinomial sampling
//! (`_sample`), and beam search (`_beam_search`, in `beam_search.rs`).
//!
//! An encoder-decoder model (T5) runs its encoder once on the prompt
//! (`_prepare_encoder_decoder_kwargs_for_generation`), then decodes from
//! `decoder_start_token_id` (`_prepare_decoder_input_ids_for_generation`): the lengths, the
//! processors and the returned sequences are the decoder's.
//!
//! The first step runs the model on the prompt with upstream's `position_ids` (the attention
//! mask's running count, padding at 0), its attention mask (dropped when it is all ones) and
//! `logits_to_keep = 1`. With `use_cache` (the default) the keys and values go into a
//! [`DynamicCache`] and each later step runs the new token alone, as upstream's; with
//! `use_cache=False`, or a model without a cache, each step runs
//! the whole sequence again, as upstream's `use_cache=False`. Either way the same ops as
//! upstream's, in the same order.

use tch::{Kind, Tensor};

use super::configuration_utils::GenerationConfig;
use super::logits_process::logits_processors;
use crate::cache_utils::DynamicCache;
use crate::modeling_utils::{ModelInputs, TrainableModel};
use crate::{Error, Result};

/// What `generate` returns: upstream's `GenerateDecoderOnlyOutput` (the sequences, and the
/// processed scores of each step with `output_scores` and `return_dict_in_generate`).
#[derive(Debug)]
pub struct GenerateOutput {
    /// Prompt and new tokens `[batch * num_return_sequences, length]` (shorter than
    /// `max_length` when every row ended).
    pub sequences: Tensor,
    /// The processed scores of each step `[batch * num_return_sequences, vocab]` (float32;
    /// beam search: the processed log-probabilities of every beam, `[batch * num_beams,
    /// vocab]`).
    pub scores: Vec<Tensor>,
    /// Beam search's `sequences_scores`: each returned hypothesis's score `[batch *
    /// num_return_sequences]`.
    pub sequences_scores: Option<Tensor>,
}

/// What the decoding steps carry from one forward to the next (upstream's `model_kwargs`):
/// the positions and attention mask of the whole sequence so far, and the cache; for an
/// encoder-decoder model, the encoder's last hidden state and padding mask instead of the
/// positions and mask.
pub(super) struct Decoding {
    pub position_ids: Tensor,
    pub mask: Option<Tensor>,
    pub cache: Option<DynamicCache>,
    pub encoder: Option<(Tensor, Tensor)>,
}

impl Decoding {
    /// One forward on `ids` (the whole sequence so far; with a filled cache, its newest
    /// token alone) with `logits_to_keep = 1`, then the positions and mask grown by one
    /// (`_update_model_kwargs_for_generation`); returns the last position's logits as a
    /// float32 copy on the inputs' device, as upstream's.
    pub(super) fn step(&mut self, model: &dyn TrainableModel, ids: &Tensor) -> Result<Tensor> {
        if let Some((hidden, mask)) = &self.encoder {
            // The decoder on its newest token (the whole of them without a filled cache).
            let step_ids = match &self.cache {
                Some(c) if c.get_seq_length() > 0 => ids.f_narrow(1, ids.size()[1] - 1, 1)?,
                _ => ids.shallow_clone(),
            };
            let out = model.forward(&ModelInputs {
                decoder_input_ids: Some(&step_ids),
                encoder_outputs: Some(hidden),
                attention_mask: Some(mask),
                past_key_values: self.cache.as_ref(),
                ..ModelInputs::default()
            })?;
            let logits = out.logits()?;
            return Ok(logits
                .f_select(1, logits.size()[1] - 1)?
                .f_to_dtype(Kind::Float, false, true)?
                .f_to_device(ids.device())?);
        }
        let positions = &self.position_ids;
        let (step_ids, step_positions) = match &self.cache {
            Some(c) if c.get_seq_length() > 0 => (
                ids.f_narrow(1, ids.size()[1] - 1, 1)?,
                positions.f_narrow(-1, positions.size()[1] - 1, 1)?,
            ),
            _ => (ids.shallow_clone(), positions.shallow_clone()),
        };
        let out = model.forward(&ModelInputs {
            input_ids: Some(&step_ids),
            attention_mask: self.mask.as_ref(),
            position_ids: Some(&step_positions),
            logits_to_keep: Some(1),
            past_key_values: self.cache.as_ref(),
            ..ModelInputs::default()
        })?;
        let last_position = positions.f_narrow(-1, positions.size()[1] - 1, 1)?;
        self.position_ids = Tensor::f_cat(&[positions, &(last_position + 1)], -1)?;
        if let Some(m) = &self.mask {
            let ones = Tensor::f_ones([m.size()[0], 1], (m.kind(), m.device()))?;
            self.mask = Some(Tensor::f_cat(&[m, &ones], -1)?);
        }
        let logits = out.logits()?;
        Ok(logits
            .f_select(1, logits.size()[1] - 1)?
            .f_to_dtype(Kind::Float, false, true)?
            .f_to_device(ids.device())?)
    }
}

/// Upstream's `model.generate(input_ids, attention_mask=..., generation_config=...)` for a
/// causal LM or an encoder-decoder model, in `torch.no_grad()`. `config` is the merged configuration (the model's
/// `generation_config` updated with the call's arguments); `max_position_embeddings` caps the
/// default length as upstream's does. The model is used in the mode it is in (upstream's
/// `generate` does not switch to evaluation either).
pub fn generate(
    model: &dyn TrainableModel,
    input_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &GenerationConfig,
    max_position_embeddings: Option<i64>,
) -> Result<GenerateOutput> {
    config.validate()?;
    if !model.is_causal_lm() && !model.is_encoder_decoder() {
        return Err(Error::InvalidArgument {
            field: "model",
            detail: format!(
                "{} is neither a causal language model nor an encoder-decoder model: it has no language-modeling head to generate with",
                model.model_name()
            ),
        });
    }
    let size = input_ids.size();
    if size.len() != 2 || size[1] == 0 || input_ids.kind() != Kind::Int64 {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: format!(
                "expected int64 token ids [batch, length > 0], got {:?} {:?}",
                input_ids.kind(),
                size
            ),
        });
    }
    if let Some(m) = attention_mask.filter(|m| m.size() != size) {
        return Err(Error::InvalidInput {
            name: "attention_mask",
            detail: format!("shape {:?} differs from input_ids' {size:?}", m.size()),
        });
    }
    // The caching CPU allocator: each step allocates the same large buffers (the cache's
    // grown keys, the logits), which glibc would map and fault in anew every time.
    let _cache = tchtrain_sys::cpu_cache::CpuMemoryCache::from_env();
    tch::no_grad(|| {
        generate_inner(
            model,
            input_ids,
            attention_mask,
            config,
            max_position_embeddings,
        )
    })
}

fn generate_inner(
    model: &dyn TrainableModel,
    input_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &GenerationConfig,
    max_position_embeddings: Option<i64>,
) -> Result<GenerateOutput> {
    let batch = input_ids.size()[0];
    let device = input_ids.device();
    let encoder_decoder = model.is_encoder_decoder();
    // `_prepare_special_tokens`: the pad token defaults to the first end-of-sequence id.
    let eos: Vec<i64> = config.eos_token_id.clone().unwrap_or_default();
    let pad = config.pad_token_id.or_else(|| eos.first().copied());
    if config.pad_token_id.is_none() && pad.is_some() && batch > 1 && attention_mask.is_none() {
        log::warn!(
            "Setting `pad_token_id` to `eos_token_id`:{} for open-end generation.",
            eos[0]
        );
    }
    // `_prepare_attention_mask_for_generation`: inferred from the pad token where the
    // prompt holds it and it is not an end-of-sequence id.
    let mask = match attention_mask {
        Some(m) => m.f_to_kind(Kind::Int64)?,
        None => match pad {
            Some(p) if !eos.contains(&p) && bool::try_from(input_ids.f_eq(p)?.f_any()?)? => {
                input_ids.f_ne(p)?.f_to_kind(Kind::Int64)?
            }
            _ => Tensor::f_ones(input_ids.size(), (Kind::Int64, device))?,
        },
    };
    if encoder_decoder {
        return encoder_decoder_generate(model, input_ids, mask, config, &eos, pad);
    }
    let prompt_len = input_ids.size()[1];
    if batch > 1
        && pad.is_some()
        && bool::try_from(mask.f_select(1, prompt_len - 1)?.f_eq(0)?.f_any()?)?
    {
        log::warn!(
            "A decoder-only architecture is being used, but right-padding was detected! For correct generation results, please set `padding_side='left'` when initializing the tokenizer."
        );
    }
    // Positions: the mask's running count, 0 on padding.
    let mut position_ids = mask
        .f_cumsum(-1, Kind::Int64)?
        .f_sub_scalar(1)?
        .f_masked_fill(&mask.f_eq(0)?, 0)?;
    // An all-ones mask is dropped (the model then runs its causal attention alone).
    let mask = if bool::try_from(mask.f_eq(1)?.f_all()?)? {
        None
    } else {
        Some(mask)
    };
    if mask.is_none() && attention_mask.is_none() {
        position_ids = Tensor::f_arange(prompt_len, (Kind::Int64, device))?.unsqueeze(0);
    }
    let padding_lengths = match &mask {
        Some(m) => Some(m.f_ne(0)?.f_to_kind(Kind::Int)?.f_argmax(1, false)?),
        None => None,
    };
    let prompt = Prompt {
        ids: input_ids.shallow_clone(),
        position_ids,
        mask,
        padding_lengths,
        encoder: None,
        extra_processors: Vec::new(),
    };
    decode(model, prompt, config, &eos, pad, max_position_embeddings)
}

/// The decoder's starting point: its prompt ids (and for a decoder-only model their
/// positions, mask and left-padding lengths; for an encoder-decoder model the encoder's
/// output and mask), one row per prompt.
struct Prompt {
    ids: Tensor,
    position_ids: Tensor,
    mask: Option<Tensor>,
    padding_lengths: Option<Tensor>,
    encoder: Option<(Tensor, Tensor)>,
    /// Processors a model's own `generate` adds after the configuration's (Whisper's).
    extra_processors: Vec<super::logits_process::LogitsProcessor>,
}

/// An encoder-decoder model's `generate`: the encoder on the prompt (with its mask), then
/// the decoder from `decoder_start_token_id` (else `bos_token_id`, upstream's
/// `_get_decoder_start_token_id`).
fn encoder_decoder_generate(
    model: &dyn TrainableModel,
    input_ids: &Tensor,
    mask: Tensor,
    config: &GenerationConfig,
    eos: &[i64],
    pad: Option<i64>,
) -> Result<GenerateOutput> {
    let start = config
        .decoder_start_token_id
        .or(config.bos_token_id)
        .ok_or_else(|| Error::InvalidArgument {
            field: "decoder_start_token_id",
            detail: "`decoder_start_token_id` or `bos_token_id` has to be defined for encoder-decoder generation. (upstream's message); set it in the generation config".into(),
        })?;
    let batch = input_ids.size()[0];
    let device = input_ids.device();
    let hidden = model.encode(input_ids, Some(&mask))?;
    let ids = Tensor::f_full([batch, 1], start, (Kind::Int64, device))?;
    let prompt = Prompt {
        position_ids: Tensor::f_zeros([batch, 1], (Kind::Int64, device))?,
        ids,
        mask: None,
        padding_lengths: None,
        encoder: Some((hidden, mask)),
        extra_processors: Vec::new(),
    };
    decode(model, prompt, config, eos, pad, None)
}

/// An encoder-decoder model's decoding from `decoder_input_ids` `[batch, prompt]` over the
/// encoder's last hidden state (what a model's own `generate` hands to upstream's
/// `GenerationMixin.generate` with `encoder_outputs` and `decoder_input_ids`), with
/// `extra_processors` after the configuration's.
pub(crate) fn generate_from_encoder(
    model: &dyn TrainableModel,
    encoder_hidden: Tensor,
    decoder_input_ids: Tensor,
    config: &GenerationConfig,
    extra_processors: Vec<super::logits_process::LogitsProcessor>,
) -> Result<GenerateOutput> {
    config.validate()?;
    let eos: Vec<i64> = config.eos_token_id.clone().unwrap_or_default();
    let pad = config.pad_token_id.or_else(|| eos.first().copied());
    let (batch, enc_seq) = (encoder_hidden.size()[0], encoder_hidden.size()[1]);
    let device = decoder_input_ids.device();
    let mask = Tensor::f_ones([batch, enc_seq], (Kind::Int64, device))?;
    let prompt = Prompt {
        position_ids: Tensor::f_zeros([batch, 1], (Kind::Int64, device))?,
        ids: decoder_input_ids,
        mask: None,
        padding_lengths: None,
        encoder: Some((encoder_hidden, mask)),
        extra_processors,
    };
    decode(model, prompt, config, &eos, pad, None)
}

/// Greedy decoding, sampling or beam search from `prompt`.
fn decode(
    model: &dyn TrainableModel,
    prompt: Prompt,
    config: &GenerationConfig,
    eos: &[i64],
    pad: Option<i64>,
    max_position_embeddings: Option<i64>,
) -> Result<GenerateOutput> {
    let Prompt {
        ids,
        mut position_ids,
        mut mask,
        padding_lengths,
        mut encoder,
        extra_processors,
    } = prompt;
    let (batch, prompt_len) = (ids.size()[0], ids.size()[1]);
    let device = ids.device();
    // `_expand_inputs_for_generation`: a row per beam, or per returned sequence.
    let beams = config.num_beams.unwrap_or(1);
    let expand = if beams > 1 {
        beams
    } else {
        config.num_return_sequences.unwrap_or(1)
    };
    let expand_rows = |t: &Tensor| -> Result<Tensor> {
        if expand == 1 || t.size()[0] != batch {
            Ok(t.shallow_clone())
        } else {
            Ok(t.f_repeat_interleave_self_int(expand, 0, None)?)
        }
    };
    let mut ids = expand_rows(&ids)?;
    position_ids = expand_rows(&position_ids)?;
    mask = mask.as_ref().map(&expand_rows).transpose()?;
    let padding_lengths = padding_lengths.as_ref().map(&expand_rows).transpose()?;
    encoder = encoder
        .map(|(h, m)| Ok::<_, Error>((expand_rows(&h)?, expand_rows(&m)?)))
        .transpose()?;
    let rows = ids.size()[0];

    // Lengths (`_prepare_generated_length`, `_validate_generated_length`).
    let max_length = match (config.max_new_tokens, config.max_length) {
        (Some(n), given) => {
            if given.is_some() {
                log::warn!(
                    "Both `max_new_tokens` (={n}) and `max_length`(={}) seem to have been set. `max_new_tokens` will take precedence.",
                    given.unwrap_or_default()
                );
            }
            n + prompt_len
        }
        (None, Some(m)) => m,
        (None, None) => {
            log::warn!(
                "Using the model-agnostic default `max_length` (={}) to control the generation length. We recommend setting `max_new_tokens` to control the maximum length of the generation.",
                20 + prompt_len
            );
            match max_position_embeddings {
                Some(cap) => (20 + prompt_len).min(cap),
                None => 20 + prompt_len,
            }
        }
    };
    if prompt_len >= max_length {
        return Err(Error::InvalidArgument {
            field: "max_length",
            detail: format!(
                "Input length of input_ids is {prompt_len}, but `max_length` is set to {max_length}. This can lead to unexpected behavior. You should consider increasing `max_length` or, better yet, setting `max_new_tokens`."
            ),
        });
    }
    let mut resolved = config.clone();
    if let Some(n) = config.min_new_tokens {
        resolved.min_length = Some(n + prompt_len);
    }
    let mut processors = logits_processors(
        &resolved,
        prompt_len,
        eos,
        padding_lengths.as_ref(),
        max_length,
    );
    processors.extend(extra_processors);
    let sampling = config.do_sample == Some(true);
    let keep_scores =
        config.output_scores == Some(true) && config.return_dict_in_generate == Some(true);

    let use_cache = config.use_cache != Some(false) && model.supports_cache();
    let decoding = Decoding {
        position_ids,
        mask,
        cache: use_cache.then(DynamicCache::new),
        encoder,
    };
    if beams > 1 {
        let out = super::beam_search::beam_search(
            model,
            &ids,
            decoding,
            &processors,
            &super::beam_search::BeamSettings {
                num_beams: beams,
                max_length,
                eos,
                pad,
                do_sample: sampling,
                length_penalty: config.length_penalty.unwrap_or(1.0),
                early_stopping: config.early_stopping.unwrap_or_default(),
                num_return_sequences: config.num_return_sequences.unwrap_or(1),
                keep_scores,
            },
        )?;
        return Ok(GenerateOutput {
            sequences: out.sequences,
            scores: out.scores,
            sequences_scores: keep_scores.then_some(out.sequences_scores),
        });
    }
    let eos_ids = Tensor::f_from_slice(eos)?.f_to_device(device)?;
    let mut unfinished = Tensor::f_ones([rows], (Kind::Int64, device))?;
    let mut scores = Vec::new();
    let mut decoding = decoding;
    loop {
        let mut step_scores = decoding.step(model, &ids)?;
        for p in &processors {
            step_scores = p.process(&ids, step_scores)?;
        }
        let next = if sampling {
            step_scores
                .f_softmax(-1, Kind::Float)?
                .f_multinomial(1, false)?
                .f_squeeze_dim(1)?
        } else {
            step_scores.f_argmax(-1, false)?
        };
        if keep_scores {
            scores.push(step_scores);
        }
        let next = match (eos.is_empty(), pad) {
            (false, Some(pad)) => (&next * &unfinished) + (1 - &unfinished) * pad,
            _ => next,
        };
        ids = Tensor::f_cat(&[&ids, &next.unsqueeze(1)], -1)?;
        let cur_len = ids.size()[1];
        let mut done = Tensor::f_full(
            [rows],
            i64::from(cur_len >= max_length),
            (Kind::Bool, device),
        )?;
        if !eos.is_empty() {
            done = done.f_logical_or(&Tensor::f_isin(&next, &eos_ids, false, false)?)?;
        }
        unfinished = unfinished
            .f_logical_and(&done.f_logical_not()?)?
            .f_to_kind(Kind::Int64)?;
        if i64::try_from(unfinished.f_max()?)? == 0 {
            break;
        }
    }
    Ok(GenerateOutput {
        sequences: ids,
        scores,
        sequences_scores: None,
    })
}
