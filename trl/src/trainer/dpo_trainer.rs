//! `trl/trainer/dpo_trainer.py`: `DPOTrainer` over the Trainer, and its
//! `DataCollatorForPreference`.
//!
//! The datasets are tables of preference pairs in TRL's formats — implicit prompt (`chosen`,
//! `rejected`: the prompt extracted as their common prefix), explicit prompt (`prompt` +
//! `chosen` / `rejected`), as text or as messages rendered by the tokenizer's chat template
//! (with the row's `tools` and `chat_template_kwargs`) — prepared as `_prepare_dataset`
//! prepares them: EOS appended to text completions, the prompt, prompt + chosen and prompt +
//! rejected tokenized, the completions starting where the tokenizations diverge, rows whose
//! prompt fills `max_length` dropped (`keep_start`). Each batch runs the chosen rows then the
//! rejected rows through the policy's fused LM head ([`fused_lm_head_forward`]): the
//! completions' summed log-probabilities (LD-DPO's `ld_alpha` weighting), the reference's
//! (a frozen reference model, the policy with its adapter disabled, or precomputed before
//! training), the f-divergence scores, the weighted sum of the chosen loss types (WPO's
//! weights with `use_weighting`), and TRL's logged `entropy`, `num_tokens`,
//! `logits/chosen|rejected`, `mean_token_accuracy`, `rewards/chosen|rejected|accuracies|
//! margins`, `logps/chosen|rejected`.
//!
//! With `sync_ref_model`, TR-DPO's reference mixing (`ref = α · policy + (1 - α) · ref` every
//! `ref_model_sync_steps` steps). Refused, naming the field: a model already
//! holding an adapter without `ref_model`, an adapter on `lm_head`, a mixture-of-experts
//! model whose router loss would be added (`router_aux_loss_coef` other than 0), vision
//! datasets, a quantized model with `peft_config`, `padding_free`, `activation_offloading`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};
use tchtrain_collators::{Batch, Column, DataCollator, Feature};
use tchtrain_data::Dataset;
use tchtrain_datasets::Table;
use tchtrain_models::{
    AutoTask, LoadOptions, ModelOutput, PreTrainedModel, PreTrainedTokenizerFast, TrainableModel,
    from_pretrained_dir,
};
use tchtrain_trainer::{PredictionStepOutput, StepContext, Trainer, TrainerHooks, model_inputs};

use crate::data_utils::{
    common_prefix_length, extract_prompt, is_conversational, tokenize_messages,
};
use crate::error::{Error, Result};
use crate::kernels::LogProbOutputs;
use crate::trainer::base_trainer::{
    ModelArg, SharedMetrics, TrainerInputs, TrainerTokens, fused_prediction_step, hook_error,
    ids_column, ids_of, loss_only, pad_batch, row, trainer_input_methods, trl_trainer,
    wrap_with_adapter,
};
use crate::trainer::dpo_config::{DPOConfig, DpoLossType, FDivergenceType};
use crate::trainer::sft_config::TruncationMode;
use crate::trainer::utils::{FusedCausalLMOutput, fused_lm_head_forward};

/// TRL's `DataCollatorForPreference` (the DPO trainer's): each row's `prompt_ids +
/// chosen_ids`, then each row's `prompt_ids + rejected_ids`, truncated to `max_length`
/// (`keep_start` keeps the beginning, `keep_end` the end), padded on the right with
/// `pad_token_id` (to a multiple of `pad_to_multiple_of`), with `attention_mask`,
/// `completion_mask` (1 on the completion's tokens) and, when the first row has them,
/// `ref_chosen_logps` / `ref_rejected_logps` (float32).
#[derive(Debug, Clone)]
pub struct DataCollatorForPreference {
    /// `pad_token_id`.
    pub pad_token_id: i64,
    /// `max_length`.
    pub max_length: Option<usize>,
    /// `truncation_mode`.
    pub truncation_mode: TruncationMode,
    /// `pad_to_multiple_of`.
    pub pad_to_multiple_of: Option<usize>,
}

fn float_column(f: &Feature, index: usize, name: &'static str) -> tchtrain_collators::Result<f32> {
    match f.column(name) {
        Some(Column::Float(v)) => Ok(*v as f32),
        _ => Err(tchtrain_collators::Error::InconsistentFeatures {
            key: name,
            index,
            presence: "lacks",
            other: "does",
        }),
    }
}

impl DataCollatorForPreference {
    fn truncate<T: Clone>(&self, v: Vec<T>) -> Vec<T> {
        match self.max_length {
            Some(max) if v.len() > max => match self.truncation_mode {
                TruncationMode::KeepStart => v[..max].to_vec(),
                TruncationMode::KeepEnd => v[v.len() - max..].to_vec(),
            },
            _ => v,
        }
    }
}

impl DataCollator<Feature> for DataCollatorForPreference {
    fn collate(&mut self, features: &[Feature]) -> tchtrain_collators::Result<Batch> {
        if features.is_empty() {
            return Err(tchtrain_collators::Error::EmptyBatch);
        }
        let mut ids = Vec::with_capacity(2 * features.len());
        let mut completion = Vec::with_capacity(2 * features.len());
        for side in ["chosen_ids", "rejected_ids"] {
            for (i, f) in features.iter().enumerate() {
                let prompt = ids_column(f, i, "prompt_ids")?;
                let answer = ids_column(f, i, side)?;
                let mut row = prompt.to_vec();
                row.extend_from_slice(answer);
                let mut mask = vec![0i64; prompt.len()];
                mask.resize(prompt.len() + answer.len(), 1);
                ids.push(self.truncate(row));
                completion.push(self.truncate(mask));
            }
        }
        let attention: Vec<Vec<i64>> = ids.iter().map(|r| vec![1; r.len()]).collect();
        let mut batch = Batch::new();
        let m = self.pad_to_multiple_of;
        batch.insert("input_ids", pad_batch(&ids, self.pad_token_id, m)?);
        batch.insert("attention_mask", pad_batch(&attention, 0, m)?);
        batch.insert("completion_mask", pad_batch(&completion, 0, m)?);
        for key in ["ref_chosen_logps", "ref_rejected_logps"] {
            if features[0].column(key).is_some() {
                let v = features
                    .iter()
                    .enumerate()
                    .map(|(i, f)| float_column(f, i, key))
                    .collect::<tchtrain_collators::Result<Vec<f32>>>()?;
                batch.insert(key, Tensor::from_slice(&v));
            }
        }
        Ok(batch)
    }
}

/// The prepared rows, shared with the Trainer so that the precomputed reference
/// log-probabilities can be added once it is built (TRL adds them as dataset columns).
struct PreferenceRows(RwLock<Vec<Feature>>);

impl PreferenceRows {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Feature>> {
        match self.0.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Feature>> {
        match self.0.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

impl Dataset for PreferenceRows {
    fn len(&self) -> usize {
        self.read().len()
    }

    fn get(&self, index: usize) -> tchtrain_data::Result<Feature> {
        let rows = self.read();
        rows.get(index)
            .cloned()
            .ok_or(tchtrain_data::Error::IndexOutOfRange {
                index,
                len: rows.len(),
            })
    }
}

/// Where the reference log-probabilities come from.
enum Reference {
    /// A frozen reference model (run in evaluation mode, in the same autocast region).
    Model(Mutex<Box<dyn TrainableModel>>),
    /// The policy with its adapter disabled (peft's `disable_adapter()`).
    DisabledAdapter,
    /// Precomputed before training (the batch's `ref_chosen_logps` / `ref_rejected_logps`).
    Precomputed,
}

/// The DPO trainer's overrides of the Trainer (`compute_loss`, `prediction_step`, `log`).
struct DpoHooks {
    metrics: SharedMetrics,
    reference: Arc<Reference>,
    config: DPOConfig,
    /// `sync_ref_model`: the last multiple of `ref_model_sync_steps` the reference was
    /// mixed at (`None` before the first step this trainer runs).
    synced_through: Mutex<Option<i64>>,
}

fn lock_model(m: &Mutex<Box<dyn TrainableModel>>) -> MutexGuard<'_, Box<dyn TrainableModel>> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// `labels = input_ids.masked_fill(completion_mask == 0, -100)`.
fn completion_labels(inputs: &Batch) -> Result<Tensor> {
    let (ids, mask) = match (inputs.get("input_ids"), inputs.get("completion_mask")) {
        (Some(i), Some(m)) => (i, m),
        _ => {
            return Err(Error::InvalidArgument {
                field: "inputs",
                detail: "the batch needs input_ids and completion_mask (DataCollatorForPreference builds them)".into(),
            });
        }
    };
    Ok(ids.f_masked_fill(&mask.f_eq(0)?, -100)?)
}

/// The policy's or reference's per-sequence log-probabilities from per-token ones: their sum,
/// or with `ld_alpha` the shared part plus `ld_alpha` times the tail.
struct LogpsReducer {
    ld: Option<(f64, Tensor, Tensor)>,
}

impl LogpsReducer {
    fn new(ld_alpha: Option<f64>, shift_mask: &Tensor) -> Result<Self> {
        let Some(alpha) = ld_alpha else {
            return Ok(Self { ld: None });
        };
        let comp_pos = shift_mask.f_cumsum(1, None::<Kind>)?;
        let comp_lens = shift_mask.f_sum_dim_intlist(1, false, None::<Kind>)?;
        let half = comp_lens.size()[0] / 2;
        let chosen = comp_lens.f_narrow(0, 0, half)?;
        let rejected = comp_lens.f_narrow(0, half, half)?;
        let shared = chosen.f_minimum(&rejected)?;
        let shared = Tensor::f_cat(&[&shared, &shared], 0)?.f_unsqueeze(1)?;
        let shared_mask = comp_pos
            .f_gt(0)?
            .f_logical_and(&comp_pos.f_le_tensor(&shared)?)?;
        let tail_mask = comp_pos.f_gt_tensor(&shared)?;
        Ok(Self {
            ld: Some((alpha, shared_mask, tail_mask)),
        })
    }

    fn reduce(&self, per_token: &Tensor) -> Result<Tensor> {
        Ok(match &self.ld {
            None => per_token.f_sum_dim_intlist(1, false, None::<Kind>)?,
            Some((alpha, shared, tail)) => {
                let s = per_token
                    .f_mul(shared)?
                    .f_sum_dim_intlist(1, false, None::<Kind>)?;
                let t = per_token
                    .f_mul(tail)?
                    .f_sum_dim_intlist(1, false, None::<Kind>)?;
                s.f_add(&t.f_mul_scalar(*alpha)?)?
            }
        })
    }
}

fn halves(t: &Tensor) -> Result<(Tensor, Tensor)> {
    let half = t.size()[0] / 2;
    Ok((t.f_narrow(0, 0, half)?, t.f_narrow(0, half, half)?))
}

/// `-F.logsigmoid(x)`.
fn neg_logsigmoid(x: &Tensor) -> Result<Tensor> {
    Ok(x.f_log_sigmoid()?.f_neg()?)
}

impl DpoHooks {
    /// The reference's per-token log-probabilities of the batch (no gradients, in the
    /// accelerator's autocast region).
    fn reference_per_token(
        &self,
        ctx: &StepContext<'_>,
        policy: &dyn TrainableModel,
        inputs: &Batch,
        labels: &Tensor,
    ) -> Result<Tensor> {
        let mut mi = model_inputs(inputs);
        mi.labels = None;
        let outputs = LogProbOutputs::default();
        tch::no_grad(|| -> Result<Tensor> {
            let _autocast = ctx.accelerator.autocast()?;
            match &*self.reference {
                Reference::Model(m) => {
                    let m = lock_model(m);
                    Ok(fused_lm_head_forward(&**m, &mi, labels, outputs)?.log_probs)
                }
                Reference::DisabledAdapter => {
                    policy.set_adapters_disabled(true)?;
                    let out = fused_lm_head_forward(policy, &mi, labels, outputs);
                    policy.set_adapters_disabled(false)?;
                    Ok(out?.log_probs)
                }
                Reference::Precomputed => Err(Error::InvalidArgument {
                    field: "precompute_ref_log_probs",
                    detail: "the batch has no precomputed reference log-probabilities".into(),
                }),
            }
        })
    }

    /// TR-DPO's `SyncRefModelCallback.on_step_end`, run before the next loss instead (the
    /// reference is read nowhere else): at each multiple of `ref_model_sync_steps` optimizer
    /// steps, `ref = α · policy + (1 - α) · ref` parameter by parameter. A run resumed at a
    /// multiple does not mix again there, as upstream's reloaded reference is not.
    fn sync_reference(&self, ctx: &StepContext<'_>, policy: &dyn TrainableModel) -> Result<()> {
        let (true, Reference::Model(reference)) = (self.config.sync_ref_model, &*self.reference)
        else {
            return Ok(());
        };
        let every = self.config.ref_model_sync_steps.max(1) as i64;
        let target = ctx.global_step / every * every;
        let mut synced = match self.synced_through.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match *synced {
            None => *synced = Some(target),
            Some(done) if target > done => {
                let alpha = self.config.ref_model_mixup_alpha;
                let policy_vars = policy.var_store().variables();
                let reference = lock_model(reference);
                tch::no_grad(|| -> Result<()> {
                    for (name, mut r) in reference.var_store().variables() {
                        let p = policy_vars
                            .get(&name)
                            .ok_or_else(|| Error::InvalidArgument {
                                field: "sync_ref_model",
                                detail: format!(
                                    "the policy has no {name} to mix into the reference"
                                ),
                            })?;
                        let _ = r.f_mul_scalar_(1.0 - alpha)?;
                        tchtrain_optim::add_(&mut r, p, alpha)
                            .map_err(|e| Error::Trainer(tchtrain_trainer::Error::Optim(e)))?;
                    }
                    Ok(())
                })?;
                *synced = Some(target);
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// `DPOTrainer._compute_loss`: the loss, the metrics recorded.
    fn loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
    ) -> Result<Tensor> {
        let c = &self.config;
        self.sync_reference(ctx, model)?;
        let training = model.is_training();
        let labels = completion_labels(inputs)?;
        let completion_mask =
            inputs
                .get("completion_mask")
                .ok_or_else(|| Error::InvalidArgument {
                    field: "completion_mask",
                    detail: "missing from the batch".into(),
                })?;
        let seq = completion_mask.size()[1];
        let shift_mask = completion_mask.f_narrow(1, 1, seq - 1)?;
        let mut mi = model_inputs(inputs);
        mi.labels = None;
        let outputs = LogProbOutputs {
            entropy: true,
            log_sum_sq_probs: c.use_weighting,
            mean_logits: true,
            is_top1: true,
        };
        let out: FusedCausalLMOutput = {
            let _autocast = ctx.accelerator.autocast()?;
            fused_lm_head_forward(model, &mi, &labels, outputs)?
        };
        let per_token_logps = &out.log_probs;
        let reducer = LogpsReducer::new(c.ld_alpha, &shift_mask)?;
        let logps = reducer.reduce(per_token_logps)?;
        let (chosen_logps, rejected_logps) = halves(&logps)?;
        let (ref_chosen_logps, ref_rejected_logps) = match &*self.reference {
            Reference::Precomputed => {
                let get = |k: &str| {
                    inputs
                        .get(k)
                        .map(Tensor::shallow_clone)
                        .ok_or_else(|| Error::InvalidArgument {
                            field: "precompute_ref_log_probs",
                            detail: format!("the batch has no `{k}`"),
                        })
                };
                (get("ref_chosen_logps")?, get("ref_rejected_logps")?)
            }
            _ => {
                let per_token = self.reference_per_token(ctx, model, inputs, &labels)?;
                halves(&reducer.reduce(&per_token)?)?
            }
        };
        let chosen_logratios = chosen_logps.f_sub(&ref_chosen_logps)?;
        let rejected_logratios = rejected_logps.f_sub(&ref_rejected_logps)?;
        let (chosen_scores, rejected_scores) = match c.f_divergence_type {
            FDivergenceType::ReverseKl => (
                chosen_logratios.shallow_clone(),
                rejected_logratios.shallow_clone(),
            ),
            FDivergenceType::ForwardKl => {
                let f = |x: &Tensor| -> Result<Tensor> {
                    Ok(x.f_neg()?.f_exp()?.f_neg()?.f_add_scalar(1.0)?)
                };
                (f(&chosen_logratios)?, f(&rejected_logratios)?)
            }
            FDivergenceType::JsDivergence => {
                let f = |x: &Tensor| -> Result<Tensor> {
                    Ok(x.f_log_sigmoid()?.f_add_scalar(std::f64::consts::LN_2)?)
                };
                (f(&chosen_logratios)?, f(&rejected_logratios)?)
            }
            FDivergenceType::AlphaDivergence => {
                let a = c.f_alpha_divergence_coef;
                if (a - 1.0).abs() < 1e-6 {
                    (
                        chosen_logratios.shallow_clone(),
                        rejected_logratios.shallow_clone(),
                    )
                } else {
                    let coef = 1.0 / (a - 1.0);
                    let f = |x: &Tensor| -> Result<Tensor> {
                        let t = x.f_mul_scalar(a - 1.0)?;
                        let dtype = t.kind();
                        let clamp_max = if dtype == Kind::Half { 11.0 } else { 80.0 };
                        let tf = t.f_to_kind(Kind::Float)?.f_clamp_max(clamp_max)?;
                        Ok(tf
                            .f_exp()?
                            .f_sub_scalar(1.0)?
                            .f_to_kind(dtype)?
                            .f_mul_scalar(coef)?)
                    };
                    (f(&chosen_logratios)?, f(&rejected_logratios)?)
                }
            }
        };
        let delta_score = chosen_scores.f_sub(&rejected_scores)?;
        let beta = c.beta;
        let ls = c.label_smoothing;
        let weights = match &c.loss_weights {
            Some(w) => w.clone(),
            None => vec![1.0; c.loss_type.len()],
        };
        let (chosen_mask, rejected_mask) = halves(completion_mask)?;
        let avg = |scores: &Tensor, mask: &Tensor| -> Result<Tensor> {
            Ok(scores.f_div(
                &mask
                    .f_sum_dim_intlist(1, false, None::<Kind>)?
                    .f_clamp_min(1.0)?,
            )?)
        };
        let mut loss: Option<Tensor> = None;
        for (loss_type, weight) in c.loss_type.iter().zip(&weights) {
            // `self.beta * delta_score` and `-self.beta * delta_score`, a new product at each
            // use as upstream writes them (the gradients then add up in upstream's order).
            let bd = || delta_score.f_mul_scalar(beta);
            let nbd = || delta_score.f_mul_scalar(-beta);
            let per_sequence = match loss_type {
                DpoLossType::Sigmoid => neg_logsigmoid(&bd()?)?,
                DpoLossType::Hinge => bd()?.f_neg()?.f_add_scalar(1.0)?.f_relu()?,
                DpoLossType::Ipo => {
                    let d = avg(&chosen_scores, &chosen_mask)?
                        .f_sub(&avg(&rejected_scores, &rejected_mask)?)?;
                    d.f_sub_scalar(1.0 / (2.0 * beta))?.f_pow_tensor_scalar(2)?
                }
                DpoLossType::ExoPair => {
                    let epsilon = Tensor::from(ls as f32);
                    let qw = bd()?.f_sigmoid()?;
                    let log_qw = bd()?.f_log_sigmoid()?;
                    let log_pw = epsilon.f_neg()?.f_log1p()?;
                    let ql = nbd()?.f_sigmoid()?;
                    let log_ql = nbd()?.f_log_sigmoid()?;
                    let log_pl = epsilon.f_log()?;
                    qw.f_mul(&log_qw.f_sub(&log_pw)?)?
                        .f_add(&ql.f_mul(&log_ql.f_sub(&log_pl)?)?)?
                }
                DpoLossType::NcaPair => {
                    let cr = chosen_logratios.f_mul_scalar(beta)?;
                    let rr = rejected_logratios.f_mul_scalar(beta)?;
                    neg_logsigmoid(&cr)?
                        .f_sub(&cr.f_neg()?.f_log_sigmoid()?.f_mul_scalar(0.5)?)?
                        .f_sub(&rr.f_neg()?.f_log_sigmoid()?.f_mul_scalar(0.5)?)?
                }
                DpoLossType::Robust => {
                    let clean = bd()?.f_log_sigmoid()?.f_mul_scalar(-(1.0 - ls))?;
                    let flipped = nbd()?.f_log_sigmoid()?.f_mul_scalar(-ls)?;
                    clean.f_sub(&flipped)?.f_div_scalar(1.0 - 2.0 * ls)?
                }
                DpoLossType::BcoPair => {
                    let cr = chosen_logratios.f_mul_scalar(beta)?;
                    let rr = rejected_logratios.f_mul_scalar(beta)?;
                    neg_logsigmoid(&cr)?.f_sub(&rr.f_neg()?.f_log_sigmoid()?)?
                }
                DpoLossType::SppoHard => {
                    let w = chosen_logratios
                        .f_sub_scalar(0.5 / beta)?
                        .f_pow_tensor_scalar(2)?;
                    let l = rejected_logratios
                        .f_add_scalar(0.5 / beta)?
                        .f_pow_tensor_scalar(2)?;
                    w.f_add(&l)?
                }
                DpoLossType::Aot | DpoLossType::AotUnpaired => {
                    let delta = if *loss_type == DpoLossType::Aot {
                        let lr = chosen_logps.f_sub(&rejected_logps)?;
                        let rlr = ref_chosen_logps.f_sub(&ref_rejected_logps)?;
                        lr.f_sort(0, false)?.0.f_sub(&rlr.f_sort(0, false)?.0)?
                    } else {
                        chosen_logratios
                            .f_sort(0, false)?
                            .0
                            .f_sub(&rejected_logratios.f_sort(0, false)?.0)?
                    };
                    neg_logsigmoid(&delta.f_mul_scalar(beta)?)?
                        .f_mul_scalar(1.0 - ls)?
                        .f_sub(
                            &delta
                                .f_mul_scalar(-beta)?
                                .f_log_sigmoid()?
                                .f_mul_scalar(ls)?,
                        )?
                }
                DpoLossType::ApoZero => {
                    let lc = chosen_logratios
                        .f_mul_scalar(beta)?
                        .f_sigmoid()?
                        .f_neg()?
                        .f_add_scalar(1.0)?;
                    let lr = rejected_logratios.f_mul_scalar(beta)?.f_sigmoid()?;
                    lc.f_add(&lr)?
                }
                DpoLossType::ApoDown => {
                    let lc = chosen_logratios.f_mul_scalar(beta)?.f_sigmoid()?;
                    let lr = chosen_logratios
                        .f_sub(&rejected_logratios)?
                        .f_mul_scalar(beta)?
                        .f_sigmoid()?
                        .f_neg()?
                        .f_add_scalar(1.0)?;
                    lc.f_add(&lr)?
                }
                DpoLossType::Discopop => {
                    let logits = delta_score.f_mul_scalar(beta)?;
                    let modulation = logits.f_div_scalar(c.discopop_tau)?.f_sigmoid()?;
                    let logistic = neg_logsigmoid(&logits)?;
                    let exp = logits.f_neg()?.f_exp()?;
                    logistic
                        .f_mul(&modulation.f_neg()?.f_add_scalar(1.0)?)?
                        .f_add(&exp.f_mul(&modulation)?)?
                }
                DpoLossType::Sft => {
                    let (cm, _) = halves(&shift_mask)?;
                    let (cl, _) = halves(per_token_logps)?;
                    let batch_loss = cl
                        .f_masked_select(&cm.f_to_kind(Kind::Bool)?)?
                        .f_mean(None)?
                        .f_neg()?;
                    batch_loss.f_expand([cl.size()[0]], false)?
                }
                DpoLossType::SigmoidNorm => {
                    let d = avg(&chosen_scores, &chosen_mask)?
                        .f_sub(&avg(&rejected_scores, &rejected_mask)?)?;
                    neg_logsigmoid(&d.f_mul_scalar(beta)?)?
                }
            };
            let per_sequence = if c.use_weighting {
                let lengths = shift_mask
                    .f_sum_dim_intlist(1, false, None::<Kind>)?
                    .f_clamp_min(1)?;
                let sq = FusedCausalLMOutput::required(&out.log_sum_sq_probs, "log_sum_sq_probs")?;
                let aligned = tch::no_grad(|| -> Result<Tensor> {
                    Ok(per_token_logps.f_sub(sq)?.f_mul(&shift_mask)?)
                })?;
                let mean = aligned
                    .f_sum_dim_intlist(1, false, None::<Kind>)?
                    .f_div(&lengths)?;
                let w = mean.f_exp()?;
                let (cw, rw) = halves(&w)?;
                per_sequence.f_mul(&cw.f_mul(&rw)?)?
            } else {
                per_sequence
            };
            let term = per_sequence.f_mean(None)?.f_mul_scalar(*weight)?;
            loss = Some(match loss {
                None => term,
                Some(l) => l.f_add(&term)?,
            });
        }
        let loss = loss.ok_or_else(|| Error::InvalidArgument {
            field: "loss_type",
            detail: "no loss type".into(),
        })?;
        self.record(
            ctx,
            training,
            inputs,
            &out,
            &shift_mask,
            &chosen_logratios,
            &rejected_logratios,
            &chosen_logps,
            &rejected_logps,
        )?;
        Ok(loss)
    }

    /// The logged metrics of one batch, as TRL computes them.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        ctx: &StepContext<'_>,
        training: bool,
        inputs: &Batch,
        out: &FusedCausalLMOutput,
        shift_mask: &Tensor,
        chosen_logratios: &Tensor,
        rejected_logratios: &Tensor,
        chosen_logps: &Tensor,
        rejected_logps: &Tensor,
    ) -> Result<()> {
        let acc = ctx.accelerator;
        let item =
            |t: Tensor| -> Result<f64> { Ok(acc.gather(&t)?.f_sum(t.kind())?.double_value(&[])) };
        tch::no_grad(|| -> Result<()> {
            let entropy = FusedCausalLMOutput::required(&out.entropy, "entropy")?.f_detach()?;
            let entropy_sum = acc
                .gather(&entropy.f_mul(shift_mask)?.f_sum(Kind::Float)?)?
                .f_sum(Kind::Float)?;
            let total_tokens = acc
                .gather(&shift_mask.f_sum(Kind::Int64)?)?
                .f_sum(Kind::Int64)?;
            let entropy = if total_tokens.int64_value(&[]) > 0 {
                entropy_sum.f_div(&total_tokens)?.double_value(&[])
            } else {
                0.0
            };
            let mut tokens_in_batch = None;
            if training {
                let mask = inputs
                    .get("attention_mask")
                    .ok_or_else(|| Error::InvalidArgument {
                        field: "attention_mask",
                        detail: "missing from the batch".into(),
                    })?;
                tokens_in_batch = Some(item(mask.f_sum(Kind::Int64)?)? as i64);
            }
            let mean_logits = FusedCausalLMOutput::required(&out.mean_logits, "mean_logits")?;
            let (cml, rml) = halves(mean_logits)?;
            let (cm, rm) = halves(shift_mask)?;
            let (cmb, rmb) = (cm.f_to_kind(Kind::Bool)?, rm.f_to_kind(Kind::Bool)?);
            let total_chosen_logits = item(cml.f_masked_select(&cmb)?.f_sum(Kind::Float)?)?;
            let total_chosen_tokens = item(cm.f_sum(Kind::Int64)?)?;
            let total_rejected_logits = item(rml.f_masked_select(&rmb)?.f_sum(Kind::Float)?)?;
            let total_rejected_tokens = item(rm.f_sum(Kind::Int64)?)?;
            let avg = |l: f64, n: f64| if n > 0.0 { l / n } else { 0.0 };
            let top1 = FusedCausalLMOutput::required(&out.is_top1, "is_top1")?;
            let (chosen_top1, _) = halves(top1)?;
            let correct = acc
                .gather(&chosen_top1.f_logical_and(&cmb)?.f_sum(Kind::Int64)?)?
                .f_sum(Kind::Int64)?;
            let total = acc.gather(&cm.f_sum(Kind::Int64)?)?.f_sum(Kind::Int64)?;
            let accuracy = if total.int64_value(&[]) > 0 {
                correct.f_div(&total)?.double_value(&[])
            } else {
                0.0
            };
            let beta = self.config.beta;
            let chosen_rewards = chosen_logratios.f_detach()?.f_mul_scalar(beta)?;
            let rejected_rewards = rejected_logratios.f_detach()?.f_mul_scalar(beta)?;
            let mean =
                |t: &Tensor| -> Result<f64> { Ok(acc.gather(t)?.f_mean(None)?.double_value(&[])) };
            let reward_accuracy = mean(
                &chosen_rewards
                    .f_gt_tensor(&rejected_rewards)?
                    .f_to_kind(Kind::Float)?,
            )?;
            let margins = mean(&chosen_rewards.f_sub(&rejected_rewards)?)?;
            let mut state = self.metrics.lock();
            if let Some(n) = tokens_in_batch {
                state.total_train_tokens += n;
            }
            let total_train_tokens = state.total_train_tokens as f64;
            let m = state.mode(training);
            m.push("entropy", entropy);
            m.set("num_tokens", total_train_tokens);
            m.push(
                "logits/chosen",
                avg(total_chosen_logits, total_chosen_tokens),
            );
            m.push(
                "logits/rejected",
                avg(total_rejected_logits, total_rejected_tokens),
            );
            m.push("mean_token_accuracy", accuracy);
            m.push("rewards/chosen", mean(&chosen_rewards)?);
            m.push("rewards/rejected", mean(&rejected_rewards)?);
            m.push("rewards/accuracies", reward_accuracy);
            m.push("rewards/margins", margins);
            m.push("logps/chosen", mean(&chosen_logps.f_detach()?)?);
            m.push("logps/rejected", mean(&rejected_logps.f_detach()?)?);
            Ok(())
        })
    }
}

impl TrainerHooks for DpoHooks {
    fn compute_loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        _num_items_in_batch: Option<&Tensor>,
    ) -> tchtrain_trainer::Result<(Tensor, ModelOutput)> {
        let loss = self.loss(ctx, model, inputs).map_err(hook_error)?;
        Ok(loss_only(loss))
    }

    /// `loss_is_scaled_for_ga = False`: the loss is a per-batch mean.
    fn loss_is_scaled_for_ga(&self) -> Option<bool> {
        Some(false)
    }

    /// TRL's `prediction_step`: the loss; the logits, when asked for, from an extra forward
    /// without the fused head (as TRL recomputes them), the labels the `input_ids`.
    fn prediction_step(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        prediction_loss_only: bool,
    ) -> tchtrain_trainer::Result<PredictionStepOutput> {
        fused_prediction_step(
            ctx,
            model,
            inputs,
            prediction_loss_only,
            "input_ids",
            || self.loss(ctx, model, inputs).map_err(hook_error),
        )
    }

    fn log(
        &self,
        trainer: &mut Trainer,
        logs: Vec<(String, f64)>,
        start_time: Option<Instant>,
    ) -> tchtrain_trainer::Result<()> {
        self.metrics.log(trainer, logs, start_time)
    }
}

trl_trainer!(
    /// TRL's `DPOTrainer`: a [`Trainer`] (reached through `Deref`) whose datasets, collator,
    /// loss and logs are TRL's.
    DPOTrainer
);

/// The arguments of `DPOTrainer(model, ref_model, args, train_dataset, eval_dataset,
/// processing_class, peft_config, ...)`.
pub struct DPOTrainerBuilder {
    model: ModelArg,
    model_init_kwargs: LoadOptions,
    ref_model: Option<Box<dyn PreTrainedModel>>,
    config: DPOConfig,
    tokenizer: PreTrainedTokenizerFast,
    inputs: TrainerInputs,
}

impl DPOTrainer {
    /// `DPOTrainer(model, args=config, processing_class=tokenizer)` with a loaded causal LM;
    /// the reference, datasets and the rest are set on the builder. Without `ref_model`,
    /// `peft_config` or `precompute_ref_log_probs`, the reference must be loaded again: use
    /// [`builder_from_pretrained`](Self::builder_from_pretrained) or give `ref_model`.
    pub fn builder(
        model: Box<dyn PreTrainedModel>,
        config: DPOConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> DPOTrainerBuilder {
        Self::with_model(ModelArg::Model(model), config, tokenizer)
    }

    /// `DPOTrainer(model="path", ...)`: the policy (and, for full fine-tuning without
    /// precomputed log-probabilities, the reference) loaded from the checkpoint at build,
    /// after the seed, as `AutoModelForCausalLM.from_pretrained(path)`.
    pub fn builder_from_pretrained(
        path: impl Into<PathBuf>,
        config: DPOConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> DPOTrainerBuilder {
        Self::with_model(ModelArg::Path(path.into()), config, tokenizer)
    }

    fn with_model(
        model: ModelArg,
        config: DPOConfig,
        tokenizer: PreTrainedTokenizerFast,
    ) -> DPOTrainerBuilder {
        DPOTrainerBuilder {
            model,
            model_init_kwargs: LoadOptions::default(),
            ref_model: None,
            config,
            tokenizer,
            inputs: TrainerInputs::default(),
        }
    }
}

fn load_causal_lm(
    path: &std::path::Path,
    options: &LoadOptions,
) -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(path, AutoTask::CausalLm, Device::Cpu, options)?.model)
}

impl DPOTrainerBuilder {
    /// `model_init_kwargs` (and `quantization_config`): how a model given by path is loaded
    /// (`dtype`, 4- / 8-bit quantization; transformers' defaults otherwise).
    pub fn model_init_kwargs(mut self, options: LoadOptions) -> Self {
        self.model_init_kwargs = options;
        self
    }

    /// `ref_model`: the frozen reference (run in evaluation mode).
    pub fn ref_model(mut self, model: Box<dyn PreTrainedModel>) -> Self {
        self.ref_model = Some(model);
        self
    }

    trainer_input_methods!();

    /// `DPOTrainer.__init__`.
    pub fn build(self) -> Result<DPOTrainer> {
        let Self {
            model,
            model_init_kwargs,
            ref_model,
            mut config,
            tokenizer,
            mut inputs,
        } = self;
        config.post_init()?;
        let train = inputs.take_train()?;
        let refuse = |field: &'static str, detail: &str| Error::InvalidArgument {
            field,
            detail: detail.into(),
        };
        if config.sync_ref_model && inputs.peft_config.is_some() {
            return Err(refuse(
                "sync_ref_model",
                "You passed `sync_ref_model=True` while using a PEFT model, which is currently not supported: the reference is the policy with its adapter disabled, there is no reference model to synchronize. (TRL's message)",
            ));
        }
        tch::manual_seed(config.base.seed as i64);
        let (model, path) = match model {
            ModelArg::Path(p) => (load_causal_lm(&p, &model_init_kwargs)?, Some(p)),
            ModelArg::Model(m) => (m, None),
        };
        if model.output_head().is_none() {
            return Err(Error::InvalidArgument {
                field: "model",
                detail: format!(
                    "{} has no fused LM head here (TRL scores every batch through it): DPO takes the decoder families' causal LMs (Llama, Qwen, Mistral, Gemma, ...)",
                    model.model_name()
                ),
            });
        }
        if model.has_adapter() && ref_model.is_none() {
            return Err(refuse(
                "model",
                "the model already holds an adapter, which TRL copies into a frozen 'ref' adapter: not implemented here; give ref_model, or the base model with peft_config",
            ));
        }
        // The router loss of a mixture-of-experts model.
        let model_config = model.config().to_json_value()?;
        let is_moe = model_config.get("output_router_logits").is_some();
        match (config.router_aux_loss_coef, is_moe) {
            (Some(coef), false) if coef != 0.0 => {
                return Err(Error::InvalidArgument {
                    field: "router_aux_loss_coef",
                    detail: format!(
                        "`router_aux_loss_coef` is set to {coef} but {} is not a Mixture-of-Experts model that returns its router logits, so there is no auxiliary loss to weight. (TRL's message)",
                        model.model_name()
                    ),
                });
            }
            (coef, true) => {
                let coef = coef.unwrap_or_else(|| {
                    model_config
                        .get("router_aux_loss_coef")
                        .and_then(Value::as_f64)
                        .unwrap_or(0.0)
                });
                if coef != 0.0 {
                    return Err(refuse(
                        "router_aux_loss_coef",
                        "the load-balancing loss of a mixture-of-experts model under the fused LM head is not implemented here; set router_aux_loss_coef=0.0",
                    ));
                }
            }
            _ => {}
        }
        let first = row(&train, 0, "train")?;
        if first.contains_key("image") || first.contains_key("images") {
            return Err(refuse(
                "train_dataset",
                "vision datasets (an `image` / `images` column) are not supported here: a vision-language model is not implemented",
            ));
        }
        let tokens = TrainerTokens::resolve(&tokenizer, None, config.pad_token.as_deref())?;
        let mut model = model;
        if model.set_pad_token_id(Some(tokens.pad_token_id)).is_err() {
            // Only the saved config.json carries it for a causal LM.
            log::debug!("the model keeps its config's pad_token_id");
        }
        // The reference.
        let peft = inputs.peft_config.is_some();
        let reference = match (ref_model, peft, config.precompute_ref_log_probs) {
            (Some(r), _, _) => Some(r),
            (None, true, _) | (None, false, true) => None,
            (None, false, false) => match &path {
                // TRL's `ref_model_init_kwargs`: the policy's (its dtype, quantization).
                Some(p) => Some(load_causal_lm(p, &model_init_kwargs)?),
                None => {
                    return Err(refuse(
                        "ref_model",
                        "TRL loads the reference again from the model's path: give ref_model, or build with DPOTrainer::builder_from_pretrained",
                    ));
                }
            },
        };
        let policy = wrap_with_adapter(
            model,
            inputs.peft_config.take(),
            config.base.gradient_checkpointing,
            "DPOTrainer",
            true,
        )?;
        let reference = match reference {
            Some(r) => {
                let mut r: Box<dyn TrainableModel> = r;
                r.set_training(false);
                for (_, v) in r.var_store().variables() {
                    let _ = v.set_requires_grad(false);
                }
                Reference::Model(Mutex::new(r))
            }
            None if config.precompute_ref_log_probs => Reference::Precomputed,
            None => Reference::DisabledAdapter,
        };
        let prep = Preparer {
            tokenizer: &tokenizer,
            eos_token: tokens.eos_token.as_deref(),
            config: &config,
            warned: std::cell::Cell::new(false),
        };
        let train_rows = Arc::new(PreferenceRows(RwLock::new(prep.prepare(&train, "train")?)));
        let eval_rows = match &inputs.eval_dataset {
            Some(t) => Some(Arc::new(PreferenceRows(RwLock::new(
                prep.prepare(t, "eval")?,
            )))),
            None => None,
        };
        let collator = DataCollatorForPreference {
            pad_token_id: tokens.pad_token_id,
            max_length: config.max_length,
            truncation_mode: config.truncation_mode,
            pad_to_multiple_of: config.pad_to_multiple_of,
        };
        let reference = Arc::new(reference);
        let mut builder = Trainer::builder(policy, config.base.clone())
            .processing_class(tokenizer.clone())
            .data_collator(collator.clone())
            .hooks(DpoHooks {
                metrics: SharedMetrics::default(),
                reference: reference.clone(),
                config: config.clone(),
                synced_through: Mutex::new(None),
            })
            .train_dataset(train_rows.clone() as Arc<dyn Dataset>);
        if let Some(rows) = &eval_rows {
            builder = builder.eval_dataset(rows.clone() as Arc<dyn Dataset>);
        }
        let builder = inputs.configure(builder);
        let trainer = builder.build()?;
        if let Reference::Model(m) = &*reference {
            let device = trainer.device();
            lock_model(m).var_store_mut().set_device(device);
        }
        if config.precompute_ref_log_probs {
            let mut pre = Precompute {
                trainer: &trainer,
                reference: &reference,
                collator,
                ld_alpha: config.ld_alpha,
                peft,
            };
            let train_batch = config
                .precompute_ref_batch_size
                .unwrap_or(config.base.per_device_train_batch_size);
            pre.run(&train_rows, train_batch)?;
            if let Some(rows) = &eval_rows {
                let eval_batch = config
                    .precompute_ref_batch_size
                    .unwrap_or(config.base.per_device_eval_batch_size);
                pre.run(rows, eval_batch)?;
            }
        }
        Ok(DPOTrainer { trainer })
    }
}

/// `_precompute_ref_logps`: the reference's log-probabilities of every row, in batches of
/// `batch_size` in order, added to the rows.
struct Precompute<'a> {
    trainer: &'a Trainer,
    reference: &'a Reference,
    collator: DataCollatorForPreference,
    ld_alpha: Option<f64>,
    peft: bool,
}

impl Precompute<'_> {
    fn run(&mut self, rows: &PreferenceRows, batch_size: usize) -> Result<()> {
        let n = rows.len();
        let mut values = Vec::with_capacity(n);
        let device = self.trainer.device();
        for start in (0..n).step_by(batch_size.max(1)) {
            let features: Vec<Feature> = rows.read()[start..(start + batch_size).min(n)].to_vec();
            let batch = self
                .collator
                .collate(&features)
                .map_err(|e| Error::Trainer(tchtrain_trainer::Error::Collator(e)))?;
            let mut on_device = Batch::new();
            for (k, v) in batch.iter() {
                on_device.insert(k, v.f_to_device(device)?);
            }
            let labels = completion_labels(&on_device)?;
            let mask = on_device
                .get("completion_mask")
                .ok_or_else(|| Error::InvalidArgument {
                    field: "completion_mask",
                    detail: "missing from the batch".into(),
                })?;
            let seq = mask.size()[1];
            let shift = mask.f_narrow(1, 1, seq - 1)?;
            let mut mi = model_inputs(&on_device);
            mi.labels = None;
            let per_token = tch::no_grad(|| -> Result<Tensor> {
                let _autocast = self.trainer.accelerator().autocast()?;
                let outputs = LogProbOutputs::default();
                Ok(match self.reference {
                    Reference::Model(m) => {
                        fused_lm_head_forward(&**lock_model(m), &mi, &labels, outputs)?.log_probs
                    }
                    _ => {
                        let policy = self.trainer.model();
                        if self.peft {
                            policy.set_adapters_disabled(true)?;
                        }
                        let out = fused_lm_head_forward(policy, &mi, &labels, outputs);
                        if self.peft {
                            policy.set_adapters_disabled(false)?;
                        }
                        out?.log_probs
                    }
                })
            })?;
            let logps = LogpsReducer::new(self.ld_alpha, &shift)?.reduce(&per_token)?;
            let (c, r) = halves(&logps)?;
            let (c, r) = (Vec::<f32>::try_from(&c)?, Vec::<f32>::try_from(&r)?);
            values.extend(c.into_iter().zip(r));
        }
        let mut rows = rows.write();
        for (f, (c, r)) in rows.iter_mut().zip(values) {
            f.columns
                .insert("ref_chosen_logps".into(), Column::Float(f64::from(c)));
            f.columns
                .insert("ref_rejected_logps".into(), Column::Float(f64::from(r)));
        }
        Ok(())
    }
}

/// `_prepare_dataset`'s state.
struct Preparer<'a> {
    tokenizer: &'a PreTrainedTokenizerFast,
    eos_token: Option<&'a str>,
    config: &'a DPOConfig,
    /// TRL's `logger.warning_once`.
    warned: std::cell::Cell<bool>,
}

impl Preparer<'_> {
    fn bad(&self, dataset: &str, row: usize, detail: impl Into<String>) -> Error {
        Error::Dataset {
            dataset: dataset.into(),
            row,
            detail: detail.into(),
        }
    }

    /// `tokenize_fn`: the prompt, prompt + chosen and prompt + rejected tokenized; the
    /// completions start where the tokenizations diverge.
    fn tokenize(
        &self,
        example: &Map<String, Value>,
        dataset: &str,
        i: usize,
    ) -> Result<(Vec<i64>, Vec<i64>, Vec<i64>)> {
        let prompt = example
            .get("prompt")
            .ok_or_else(|| self.bad(dataset, i, "the row has no `prompt`"))?;
        let side = |key: &str| -> Result<&Value> {
            example
                .get(key)
                .ok_or_else(|| self.bad(dataset, i, format!("the row has no `{key}`")))
        };
        let (chosen, rejected) = (side("chosen")?, side("rejected")?);
        let (prompt_ids, pc, pr) = if is_conversational(example) {
            let join = |c: &Value| -> Result<Value> {
                match (prompt, c) {
                    (Value::Array(p), Value::Array(c)) => {
                        let mut m = p.clone();
                        m.extend(c.iter().cloned());
                        Ok(Value::Array(m))
                    }
                    _ => Err(self.bad(
                        dataset,
                        i,
                        "`prompt`, `chosen` and `rejected` must all be lists of messages",
                    )),
                }
            };
            (
                tokenize_messages(self.tokenizer, prompt, example, true, false)?.0,
                tokenize_messages(self.tokenizer, &join(chosen)?, example, false, false)?.0,
                tokenize_messages(self.tokenizer, &join(rejected)?, example, false, false)?.0,
            )
        } else {
            let text = |v: &Value, k: &str| -> Result<String> {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.bad(dataset, i, format!("`{k}` is not a string")))
            };
            let p = text(prompt, "prompt")?;
            (
                self.tokenizer.encode(&p, true)?,
                self.tokenizer
                    .encode(&(p.clone() + &text(chosen, "chosen")?), true)?,
                self.tokenizer
                    .encode(&(p + &text(rejected, "rejected")?), true)?,
            )
        };
        let prompt_len =
            common_prefix_length(&prompt_ids, &pc).min(common_prefix_length(&prompt_ids, &pr));
        if prompt_len < prompt_ids.len() && !self.warned.replace(true) {
            log::warn!(
                "{dataset} dataset, row {i}: the tokenized prompt is not a prefix of the tokenized prompt+completion, usually because the chat template renders the prompt alone differently or because tokens merge across the boundary; the completion starts where they diverge. (TRL's warning, shown once)"
            );
        }
        Ok((
            prompt_ids[..prompt_len].to_vec(),
            pc[prompt_len..].to_vec(),
            pr[prompt_len..].to_vec(),
        ))
    }

    /// `_prepare_dataset(dataset, processing_class, args, name)`.
    fn prepare(&self, table: &Table, dataset: &str) -> Result<Vec<Feature>> {
        let first = row(table, 0, dataset)?;
        let processed = ["prompt_ids", "chosen_ids", "rejected_ids"]
            .iter()
            .all(|c| first.contains_key(*c));
        let extract = !first.contains_key("prompt");
        let mut first_conversational = None;
        let mut out = Vec::with_capacity(table.len());
        for i in 0..table.len() {
            let mut example = row(table, i, dataset)?;
            let (p, c, r) = if processed {
                let get = |k: &str| {
                    ids_of(example.get(k))
                        .ok_or_else(|| self.bad(dataset, i, format!("`{k}` is not a list of ids")))
                };
                (get("prompt_ids")?, get("chosen_ids")?, get("rejected_ids")?)
            } else {
                if extract {
                    let (chosen, rejected) = match (example.get("chosen"), example.get("rejected"))
                    {
                        (Some(c), Some(r)) => (c, r),
                        _ => {
                            return Err(self.bad(
                                dataset,
                                i,
                                "the row needs `chosen` and `rejected`",
                            ));
                        }
                    };
                    let (p, c, r) = extract_prompt(chosen, rejected).ok_or_else(|| {
                        self.bad(
                            dataset,
                            i,
                            "`chosen` and `rejected` have no prompt to extract (both lists of messages, or both text, with a common start)",
                        )
                    })?;
                    example.insert("prompt".into(), p);
                    example.insert("chosen".into(), c);
                    example.insert("rejected".into(), r);
                }
                // `add_eos`, decided on the first (extracted) row.
                let conversational =
                    *first_conversational.get_or_insert_with(|| is_conversational(&example));
                if !conversational && let Some(eos) = self.eos_token {
                    for key in ["chosen", "rejected"] {
                        match example.get_mut(key) {
                            Some(Value::String(s)) => {
                                if !s.ends_with(eos) {
                                    s.push_str(eos);
                                }
                            }
                            _ => {
                                return Err(self.bad(
                                    dataset,
                                    i,
                                    format!("`{key}` is not a string"),
                                ));
                            }
                        }
                    }
                }
                self.tokenize(&example, dataset, i)?
            };
            if let Some(max) = self.config.max_length
                && self.config.truncation_mode == TruncationMode::KeepStart
                && p.len() >= max
            {
                continue;
            }
            out.push(
                Feature::default()
                    .with_column("prompt_ids", Column::Ids(p))
                    .with_column("chosen_ids", Column::Ids(c))
                    .with_column("rejected_ids", Column::Ids(r)),
            );
        }
        Ok(out)
    }
}
