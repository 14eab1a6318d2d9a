//! `DataCollatorForLanguageModeling`: causal-LM labels, or BERT-style masking
//! (80% `[MASK]`, 10% random token, 10% unchanged by default), token- or whole-word-level,
//! with upstream's seeded generator reproduced bit for bit.

use tch::{Device, Kind, Tensor};

use crate::batch::Batch;
use crate::data_collator::DataCollator;
use crate::error::{Error, Result};
use crate::padding::{PaddingStrategy, pad_features, round_up, stack_i64};
use crate::tokenizer_info::TokenizerInfo;
use crate::torch_generator::TorchGenerator;
use crate::whole_word_mask::{whole_word_ids, whole_word_mask};
use tchtrain_datasets::Feature;

/// The options of upstream's `DataCollatorForLanguageModeling` (defaults equal upstream's).
#[derive(Debug, Clone, PartialEq)]
pub struct LanguageModelingOptions {
    /// Masked LM (`true`) or causal LM labels (`false`: labels = inputs, padding -100).
    pub mlm: bool,
    /// Mask whole words (needs `offset_mapping`); forces `mask_replace_prob = 1`.
    pub whole_word_mask: bool,
    /// Probability that a (non-special) token is selected for prediction.
    pub mlm_probability: f64,
    /// Probability that a selected token is replaced by the mask token.
    pub mask_replace_prob: f64,
    /// Probability that a selected token is replaced by a random token.
    pub random_replace_prob: f64,
    /// Round the padded length up to a multiple of this.
    pub pad_to_multiple_of: Option<usize>,
    /// Seed of the collator's own generator (`torch.Generator().manual_seed(seed)`);
    /// `None` draws from libtorch's global generator (`tch::manual_seed`).
    pub seed: Option<u64>,
}

impl Default for LanguageModelingOptions {
    fn default() -> Self {
        Self {
            mlm: true,
            whole_word_mask: false,
            mlm_probability: 0.15,
            mask_replace_prob: 0.8,
            random_replace_prob: 0.1,
            pad_to_multiple_of: None,
            seed: None,
        }
    }
}

/// Where the masking draws come from.
#[derive(Debug, Clone)]
enum Rng {
    /// libtorch's global CPU generator, through tch (upstream with `seed=None`).
    Global,
    /// The collator's own generator (upstream with `seed=...`).
    Seeded(TorchGenerator),
}

impl Rng {
    fn bernoulli(&mut self, probabilities: &[f32]) -> Result<Vec<bool>> {
        match self {
            Rng::Seeded(g) => Ok(g.bernoulli_matrix(probabilities)),
            Rng::Global => {
                let p = Tensor::f_from_slice(probabilities)?;
                let draws = p.f_bernoulli()?.f_to_kind(Kind::Bool)?;
                Ok(Vec::<bool>::try_from(&draws)?)
            }
        }
    }

    fn randint(&mut self, high: i64, shape: [i64; 2]) -> Result<Vec<i64>> {
        match self {
            Rng::Seeded(g) => Ok((0..shape[0] * shape[1]).map(|_| g.randint(high)).collect()),
            Rng::Global => {
                let t = Tensor::f_randint(high, shape, (Kind::Int64, Device::Cpu))?;
                Ok(Vec::<i64>::try_from(&t.f_reshape([-1])?)?)
            }
        }
    }
}

/// Language-modeling collator (upstream's `DataCollatorForLanguageModeling`).
///
/// Pads rows to the longest (and `pad_to_multiple_of`), then either
/// * `mlm = false`: `labels` = `input_ids` with pad tokens set to -100, or
/// * `mlm = true`: selects tokens with `mlm_probability` (never special tokens, from the
///   row's `special_tokens_mask` or the tokenizer's special ids), sets `labels` to -100
///   elsewhere, and replaces selected inputs by the mask token (`mask_replace_prob`), a
///   random token (`random_replace_prob`), or leaves them.
///
/// With `seed` the draws are those of upstream's `torch.Generator().manual_seed(seed)`,
/// advancing across batches: the same rows give the same masks as upstream, batch after
/// batch. Without a seed they come from libtorch's global generator, like upstream's
/// global `torch` RNG (same masks after the same `tch::manual_seed`).
///
/// ```
/// use tchtrain_collators::{DataCollator, DataCollatorForLanguageModeling, Feature, LanguageModelingOptions, TokenizerInfo};
/// let tokenizer = TokenizerInfo {
///     pad_token_id: Some(0), mask_token_id: Some(103), vocab_size: 30522,
///     all_special_ids: [0, 101, 102, 103].into(), ..Default::default()
/// };
/// let options = LanguageModelingOptions { seed: Some(42), ..Default::default() };
/// let mut collator = DataCollatorForLanguageModeling::new(tokenizer, options)?;
/// let batch = collator.collate(&[Feature::new(vec![101, 2023, 2003, 1037, 3231, 102])])?;
/// assert_eq!(batch.keys().collect::<Vec<_>>(), ["input_ids", "attention_mask", "labels"]);
/// # Ok::<(), tchtrain_collators::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct DataCollatorForLanguageModeling {
    tokenizer: TokenizerInfo,
    options: LanguageModelingOptions,
    rng: Option<Rng>,
}

fn check_probability(name: &'static str, value: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&value) {
        return Err(Error::InvalidProbability { name, value });
    }
    Ok(())
}

impl DataCollatorForLanguageModeling {
    /// Checks the options as upstream's `__post_init__` does (mask token present for
    /// MLM, probabilities in `[0, 1]`, `mask_replace_prob + random_replace_prob <= 1`,
    /// whole-word masking only with MLM) and, for whole-word masking, sets
    /// `mask_replace_prob = 1` and `random_replace_prob = 0` as upstream does.
    pub fn new(tokenizer: TokenizerInfo, mut options: LanguageModelingOptions) -> Result<Self> {
        if options.mlm {
            if tokenizer.mask_token_id.is_none() {
                return Err(Error::NoMaskToken);
            }
            check_probability("mlm_probability", options.mlm_probability)?;
        } else if options.whole_word_mask {
            return Err(Error::WholeWordMaskWithoutMlm);
        }
        if options.mask_replace_prob + options.random_replace_prob > 1.0 {
            return Err(Error::ReplaceProbabilitiesExceedOne {
                mask_replace_prob: options.mask_replace_prob,
                random_replace_prob: options.random_replace_prob,
            });
        }
        check_probability("mask_replace_prob", options.mask_replace_prob)?;
        check_probability("random_replace_prob", options.random_replace_prob)?;
        if options.pad_to_multiple_of == Some(0) {
            return Err(Error::ZeroPadToMultipleOf);
        }
        if options.whole_word_mask {
            options.mask_replace_prob = 1.0;
            options.random_replace_prob = 0.0;
        }
        Ok(Self {
            tokenizer,
            options,
            rng: None,
        })
    }

    /// The options in effect.
    pub fn options(&self) -> &LanguageModelingOptions {
        &self.options
    }

    /// The tokenizer facts in use.
    pub fn tokenizer(&self) -> &TokenizerInfo {
        &self.tokenizer
    }

    fn rng(&mut self) -> &mut Rng {
        let seed = self.options.seed;
        self.rng.get_or_insert_with(|| match seed {
            Some(s) => Rng::Seeded(TorchGenerator::new(s)),
            None => Rng::Global,
        })
    }

    /// Upstream's `torch_mask_tokens` on padded rows: returns `(inputs, labels)` as
    /// `[rows, len]` int64 tensors. `special_tokens_mask` defaults to the tokenizer's
    /// special ids; `offset_mapping` is needed for whole-word masking.
    pub fn torch_mask_tokens(
        &mut self,
        input_ids: &[Vec<i64>],
        special_tokens_mask: Option<&[Vec<i64>]>,
        offset_mapping: Option<&[Vec<(i64, i64)>]>,
    ) -> Result<(Tensor, Tensor)> {
        let rows = input_ids.len();
        let stacked = stack_i64("input_ids", input_ids)?;
        let len = stacked.size()[1] as usize;
        let mut inputs: Vec<i64> = input_ids.iter().flatten().copied().collect();
        let mut labels = inputs.clone();
        let special: Vec<i64> = match special_tokens_mask {
            Some(m) => m.iter().flatten().copied().collect(),
            None => input_ids
                .iter()
                .flat_map(|r| self.tokenizer.special_tokens_mask(r))
                .collect(),
        };
        let opts = self.options.clone();
        let p = opts.mlm_probability as f32;
        let (no_mask, word_ids): (Vec<bool>, Option<Vec<i64>>) = if opts.whole_word_mask {
            let offsets = offset_mapping.ok_or(Error::MissingOffsetMapping { index: 0 })?;
            let (word_ids, no_mask) = whole_word_ids(offsets, &special, len);
            (no_mask, Some(word_ids))
        } else {
            (special.iter().map(|&s| s != 0).collect(), None)
        };
        let probabilities: Vec<f32> = no_mask.iter().map(|&n| if n { 0.0 } else { p }).collect();
        let mut masked = self.rng().bernoulli(&probabilities)?;
        if let Some(word_ids) = &word_ids {
            masked = whole_word_mask(word_ids, &masked, len);
        }
        for (label, &m) in labels.iter_mut().zip(&masked) {
            if !m {
                *label = -100;
            }
        }
        let n = inputs.len();
        let replace = vec![opts.mask_replace_prob as f32; n];
        let replaced: Vec<bool> = self
            .rng()
            .bernoulli(&replace)?
            .into_iter()
            .zip(&masked)
            .map(|(r, &m)| r && m)
            .collect();
        let mask_id = self.tokenizer.mask_token_id.ok_or(Error::NoMaskToken)?;
        for (input, &r) in inputs.iter_mut().zip(&replaced) {
            if r {
                *input = mask_id;
            }
        }
        if !(opts.mask_replace_prob == 1.0 || opts.random_replace_prob == 0.0) {
            let scaled = (opts.random_replace_prob / (1.0 - opts.mask_replace_prob)) as f32;
            let random_draw = self.rng().bernoulli(&vec![scaled; n])?;
            let vocab = self.tokenizer.vocab_size;
            let words = self.rng().randint(vocab, [rows as i64, len as i64])?;
            for i in 0..n {
                if random_draw[i] && masked[i] && !replaced[i] {
                    inputs[i] = words[i];
                }
            }
        }
        let shape = [rows as i64, len as i64];
        Ok((
            Tensor::f_from_slice(&inputs)?.f_reshape(shape)?,
            Tensor::f_from_slice(&labels)?.f_reshape(shape)?,
        ))
    }

    fn finish(
        &mut self,
        mut batch: Batch,
        input_ids: &[Vec<i64>],
        special: Option<Vec<Vec<i64>>>,
        offsets: Option<Vec<Vec<(i64, i64)>>>,
    ) -> Result<Batch> {
        batch.remove("special_tokens_mask");
        batch.remove("offset_mapping");
        if self.options.mlm {
            let (inputs, labels) =
                self.torch_mask_tokens(input_ids, special.as_deref(), offsets.as_deref())?;
            batch.insert("input_ids", inputs);
            batch.insert("labels", labels);
        } else {
            let ids = batch.get("input_ids").ok_or(Error::EmptyBatch)?;
            let labels = match self.tokenizer.pad_token_id {
                Some(pad) => ids.f_masked_fill(&ids.f_eq(pad)?, -100)?,
                None => ids.f_detach_copy()?,
            };
            batch.insert("labels", labels);
        }
        Ok(batch)
    }
}

impl DataCollator for DataCollatorForLanguageModeling {
    /// Rows with fields (upstream's dict examples): padded with `tokenizer.pad`, so the
    /// batch has `attention_mask`; rows' own `labels` are ignored.
    fn collate(&mut self, features: &[Feature]) -> Result<Batch> {
        let refs: Vec<&Feature> = features.iter().collect();
        let mut rows = pad_features(
            &refs,
            &self.tokenizer,
            PaddingStrategy::Longest,
            None,
            self.options.pad_to_multiple_of,
        )?;
        if self.options.whole_word_mask
            && let Some(index) = features.iter().position(|f| f.offset_mapping.is_none())
        {
            return Err(Error::MissingOffsetMapping { index });
        }
        let special = rows.special_tokens_mask.take();
        let offsets = rows.offset_mapping.take();
        let input_ids = rows.input_ids.clone();
        let batch = rows.into_batch()?;
        self.finish(batch, &input_ids, special, offsets)
    }
}

impl DataCollator<Vec<i64>> for DataCollatorForLanguageModeling {
    /// Rows of bare token ids (upstream's list examples, `_torch_collate_batch`): the batch
    /// has only `input_ids` and `labels`; padding happens only when lengths differ or are
    /// not a multiple of `pad_to_multiple_of`.
    fn collate(&mut self, examples: &[Vec<i64>]) -> Result<Batch> {
        let first = examples.first().ok_or(Error::EmptyBatch)?.len();
        let same = examples.iter().all(|e| e.len() == first);
        let multiple = self.options.pad_to_multiple_of;
        let padded: Vec<Vec<i64>> = if same && round_up(first, multiple)? == first {
            examples.to_vec()
        } else {
            let pad = self.tokenizer.pad_token_id.ok_or(Error::NoPadToken)?;
            let max = examples.iter().map(Vec::len).max().unwrap_or(0);
            let target = round_up(max, multiple)?;
            examples
                .iter()
                .map(|e| {
                    let fill = std::iter::repeat_n(pad, target - e.len());
                    match self.tokenizer.padding_side {
                        crate::padding::PaddingSide::Right => {
                            e.iter().copied().chain(fill).collect()
                        }
                        crate::padding::PaddingSide::Left => {
                            fill.chain(e.iter().copied()).collect()
                        }
                    }
                })
                .collect()
        };
        if self.options.whole_word_mask {
            return Err(Error::MissingOffsetMapping { index: 0 });
        }
        let mut batch = Batch::new();
        batch.insert("input_ids", stack_i64("input_ids", &padded)?);
        self.finish(batch, &padded, None, None)
    }
}
