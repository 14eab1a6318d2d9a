//! The `PreTrainedModel` trait the Trainer drives, its inputs and outputs
//! (upstream `modeling_utils.PreTrainedModel` and `modeling_outputs`).

use std::path::Path;

use tch::{Tensor, nn::VarStore};

use crate::Result;
use crate::configuration_utils::PretrainedConfig;
use crate::loading::{self, LoadingInfo};

/// The keyword arguments of upstream's `model(**batch)`: every tensor is optional but
/// `input_ids`, as in upstream's forward signatures.
#[derive(Debug, Default, Clone, Copy)]
pub struct ModelInputs<'a> {
    /// `pixel_values` `[batch, channels, height, width]` (a vision model's input).
    pub pixel_values: Option<&'a Tensor>,
    /// `input_features` `[batch, num_mel_bins, frames]` (a speech model's input: Whisper's
    /// log-mel spectrogram).
    pub input_features: Option<&'a Tensor>,
    /// Token ids `[batch, seq]` (int64).
    pub input_ids: Option<&'a Tensor>,
    /// 1 for tokens to attend to, 0 for padding `[batch, seq]`.
    pub attention_mask: Option<&'a Tensor>,
    /// Segment ids `[batch, seq]` (BERT, GPT-2).
    pub token_type_ids: Option<&'a Tensor>,
    /// Positions `[batch, seq]`; default `0..seq`.
    pub position_ids: Option<&'a Tensor>,
    /// Labels; when given, the output carries the loss.
    pub labels: Option<&'a Tensor>,
    /// Question answering: the token index where each row's answer starts `[batch]`
    /// (int64); with `end_positions`, the output carries the loss.
    pub start_positions: Option<&'a Tensor>,
    /// Question answering: the token index where each row's answer ends `[batch]`.
    pub end_positions: Option<&'a Tensor>,
    /// Number of label items in the whole accumulation window (and across ranks): the
    /// loss is summed and divided by it, as upstream's `num_items_in_batch`.
    pub num_items_in_batch: Option<&'a Tensor>,
    /// Upstream's `skip_logits` (Liger's fused linear cross-entropy): compute the loss
    /// without the logits; `None` lets the model decide (in training, with labels).
    pub skip_logits: Option<bool>,
    /// Upstream's `logits_to_keep` (causal LMs): the logits of the last `n` positions only
    /// (the head runs on those hidden states); `None` or 0: every position.
    pub logits_to_keep: Option<i64>,
    /// Upstream's `past_key_values` (decoder-only models): the keys / values of the tokens
    /// before `input_ids`, which the forward appends to; `attention_mask` then covers the
    /// cached tokens and the new ones.
    pub past_key_values: Option<&'a crate::DynamicCache>,
    /// Encoder-decoder models: the decoder's token ids `[batch, target_len]`; without them
    /// the model shifts `labels` right (`prepare_decoder_input_ids_from_labels`).
    pub decoder_input_ids: Option<&'a Tensor>,
    /// Encoder-decoder models: the decoder's padding mask (causal masking is added).
    pub decoder_attention_mask: Option<&'a Tensor>,
    /// Encoder-decoder models: the encoder's last hidden state `[batch, seq, d_model]`
    /// (upstream's `encoder_outputs`), which then does not run again; `attention_mask`
    /// stays the encoder's padding mask.
    pub encoder_outputs: Option<&'a Tensor>,
    /// Runs the backbone alone (TRL's fused LM head calls `model.base_model(...)` and projects
    /// through the head itself): the output's `last_hidden_state` is the backbone's (after
    /// its final norm), without logits or loss. Only the models with an
    /// [`output_head`](TrainableModel::output_head) take it; the others refuse it.
    pub backbone_only: bool,
}

impl<'a> ModelInputs<'a> {
    /// Inputs with only `input_ids`.
    pub fn new(input_ids: &'a Tensor) -> Self {
        Self {
            input_ids: Some(input_ids),
            ..Self::default()
        }
    }

    pub(crate) fn ids(&self) -> Result<&'a Tensor> {
        self.input_ids
            .ok_or(crate::Error::MissingInput { name: "input_ids" })
    }
}

/// What a forward pass returns (upstream's `CausalLMOutput`, `SequenceClassifierOutput`,
/// `BaseModelOutputWithPooling`, ... folded into one struct).
#[derive(Debug)]
pub struct ModelOutput {
    /// The loss when labels were given.
    pub loss: Option<Tensor>,
    /// Logits of the head; for base models, the last hidden state. `None` when the loss was
    /// computed without them (Liger's fused linear cross-entropy in training, or
    /// `skip_logits`: upstream's `logits=None`).
    pub logits: Option<Tensor>,
    /// The last hidden state of the base model.
    pub last_hidden_state: Option<Tensor>,
    /// The pooled output (BERT's pooler) when the model has one.
    pub pooler_output: Option<Tensor>,
    /// A mixture-of-experts causal LM's load-balancing loss (`aux_loss`, unscaled) when
    /// `output_router_logits`; the `loss` already includes `router_aux_loss_coef` times it.
    pub aux_loss: Option<Tensor>,
}

impl ModelOutput {
    /// The logits; an error saying why when the forward skipped them.
    pub fn logits(&self) -> Result<&Tensor> {
        self.logits.as_ref().ok_or(crate::Error::LogitsSkipped)
    }

    /// A question-answering head's `(start_logits, end_logits)`, each `[batch, seq]`:
    /// such a head's [`ModelOutput::logits`] is upstream's `qa_outputs` result
    /// `[batch, seq, 2]` before its `split(1, dim=-1)`.
    pub fn start_end_logits(&self) -> Result<(Tensor, Tensor)> {
        let logits = self.logits()?;
        match logits.size().as_slice() {
            [_, _, 2] => Ok((logits.f_select(2, 0)?, logits.f_select(2, 1)?)),
            got => Err(crate::Error::OutputShape {
                what: "question-answering logits",
                expected: "[batch, seq, 2]",
                got: got.to_vec(),
            }),
        }
    }
}

/// A causal LM's output head as TRL's fused LM head reads it: `get_output_embeddings()`'s
/// weight and bias, and the text config's logit transform (`logits · logit_scale`, then
/// `cap · tanh(· / cap)` with `final_logit_softcapping`).
#[derive(Debug)]
pub struct OutputHead {
    /// The head's weight `[vocab, hidden]` (the input embeddings when tied).
    pub weight: Tensor,
    /// The head's bias `[vocab]`, when it has one.
    pub bias: Option<Tensor>,
    /// The factor the logits are multiplied by (Granite's `1 / logits_scaling`; 1 for most).
    pub logit_scale: f64,
    /// `final_logit_softcapping` (Gemma 2 / 3).
    pub final_logit_softcapping: Option<f64>,
}

/// The kind of labels a classification head takes, for the Trainer's check of the training
/// rows before the first step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelCheck {
    /// One class id per row in `0..num_labels` (`...ForSequenceClassification` with single
    /// labels).
    Sequence {
        /// The head's number of classes.
        num_labels: i64,
    },
    /// One tag per token in `0..num_labels`, or -100 (`...ForTokenClassification`).
    Token {
        /// The head's number of classes.
        num_labels: i64,
    },
}

/// A linear layer of a model (upstream's `nn.Linear`, or GPT-2's `Conv1D`), as LoRA targets
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearModule {
    /// The module's name (`model.layers.0.self_attn.q_proj`).
    pub name: String,
    /// Input features.
    pub in_features: i64,
    /// Output features.
    pub out_features: i64,
    /// GPT-2's `Conv1D` (weight stored `[in, out]`).
    pub conv1d: bool,
}

/// Upstream's `slice_logits_to_keep`: the last `n` positions of `hidden` `[batch, seq, d]`
/// (`None` when every position is kept: `None` or 0).
pub(crate) fn keep_last_positions(hidden: &Tensor, n: Option<i64>) -> Result<Option<Tensor>> {
    match n.filter(|n| *n > 0) {
        Some(n) => {
            let seq = hidden.size()[1];
            Ok(Some(hidden.f_narrow(1, seq - n.min(seq), n.min(seq))?))
        }
        None => Ok(None),
    }
}

/// The names of `vs`'s trainable variables in creation order (the models keep it equal to
/// upstream's registration order: `named_parameters()`'s order, which upstream's optimizer
/// state is numbered by).
pub fn ordered_variable_names(vs: &VarStore) -> Vec<String> {
    let by_ptr: std::collections::HashMap<usize, String> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (t.data_ptr() as usize, n))
        .collect();
    vs.trainable_variables()
        .iter()
        .filter_map(|t| by_ptr.get(&(t.data_ptr() as usize)).cloned())
        .collect()
}

/// An attention mask must be `[batch, seq]` (the encoder's, under `name`).
pub(crate) fn check_mask_shape(
    mask: Option<&Tensor>,
    name: &'static str,
    batch: i64,
    seq: i64,
) -> Result<()> {
    match mask {
        Some(m) if m.size() != [batch, seq] => Err(crate::Error::InvalidInput {
            name,
            detail: format!("shape {:?}, expected [{batch}, {seq}]", m.size()),
        }),
        _ => Ok(()),
    }
}

/// What an encoder-decoder model's forward resolves before its decoder runs (upstream's
/// `...ForConditionalGeneration.forward`).
pub(crate) struct Seq2SeqInputs {
    /// The encoder's last hidden state: `encoder_outputs` as given, or the encoder run on
    /// `input_ids`.
    pub encoder_hidden: Tensor,
    /// The labels, on the model's device.
    pub labels: Option<Tensor>,
    /// The decoder's ids: as given, else the labels shifted right (`shift`), else (BART's
    /// denoising default, `shift_inputs`) the inputs shifted.
    pub decoder_input_ids: Tensor,
}

/// Resolves [`Seq2SeqInputs`] for `model` (its name in messages): `logits_to_keep` refused,
/// the encoder mask's shape and the decoder ids' batch checked.
pub(crate) fn seq2seq_inputs(
    inputs: &ModelInputs<'_>,
    device: tch::Device,
    model: &str,
    run_encoder: impl FnOnce(&Tensor, Option<&Tensor>) -> Result<Tensor>,
    shift: impl Fn(&Tensor) -> Result<Tensor>,
    shift_inputs: bool,
) -> Result<Seq2SeqInputs> {
    if inputs.logits_to_keep.is_some_and(|n| n > 0) {
        return Err(crate::Error::InvalidArgument {
            field: "logits_to_keep",
            detail: format!(
                "{model}'s forward takes no logits_to_keep (upstream's neither); leave it unset"
            ),
        });
    }
    let encoder_hidden = match inputs.encoder_outputs {
        Some(h) => h.f_to_device(device)?,
        None => run_encoder(inputs.ids()?, inputs.attention_mask)?,
    };
    let (batch, enc_seq) = (encoder_hidden.size()[0], encoder_hidden.size()[1]);
    check_mask_shape(inputs.attention_mask, "attention_mask", batch, enc_seq)?;
    let labels = inputs.labels.map(|l| l.f_to_device(device)).transpose()?;
    let decoder_input_ids = match (inputs.decoder_input_ids, &labels, inputs.input_ids) {
        (Some(d), _, _) => d.f_to_device(device)?,
        (None, Some(l), _) => shift(l)?,
        (None, None, Some(ids)) if shift_inputs => shift(&ids.f_to_device(device)?)?,
        _ => {
            return Err(crate::Error::MissingInput {
                name: "decoder_input_ids",
            });
        }
    };
    if decoder_input_ids.dim() != 2 || decoder_input_ids.size()[0] != batch {
        return Err(crate::Error::InvalidInput {
            name: "decoder_input_ids",
            detail: format!(
                "shape {:?}: expected [batch, target_len] with the encoder's batch of {batch}",
                decoder_input_ids.size()
            ),
        });
    }
    Ok(Seq2SeqInputs {
        encoder_hidden,
        labels,
        decoder_input_ids,
    })
}

/// The `TrainableModel` methods an encoder-decoder model with a language-modeling head
/// (`lm_head`) shares: it has a cache, runs its encoder alone (`run_encoder`), shifts labels
/// as `decoder_start_of` says; activation checkpointing of its blocks is refused (not
/// implemented here; upstream supports it).
macro_rules! encoder_decoder_plumbing {
    () => {
        fn activation_checkpointing_enable(
            &mut self,
            settings: $crate::ActivationCheckpointing,
        ) -> $crate::Result<()> {
            let _ = settings;
            Err($crate::Error::InvalidArgument {
                field: "activation_checkpointing",
                detail: format!(
                    "{}: activation checkpointing of its blocks is not implemented here yet (upstream supports it); train without --activation_checkpointing",
                    $crate::PreTrainedModel::architecture(self)
                ),
            })
        }
        fn supports_cache(&self) -> bool {
            true
        }
        /// The encoder runs padding-free (its blocks on the real tokens of
        /// `attention_mask`; the decoder reads its output through the cross-attention,
        /// whose mask hides the padding); the decoder runs padded.
        fn set_padding_free(&mut self, on: bool) -> $crate::Result<()> {
            self.padding_free = on;
            Ok(())
        }
        fn is_encoder_decoder(&self) -> bool {
            true
        }
        fn decoder_start(&self) -> $crate::Result<Option<tchtrain_collators::DecoderStart>> {
            self.decoder_start_of().map(Some)
        }
        fn encode(
            &self,
            input_ids: &tch::Tensor,
            attention_mask: Option<&tch::Tensor>,
        ) -> $crate::Result<tch::Tensor> {
            self.run_encoder(input_ids, attention_mask)
        }
        fn output_embeddings(&self) -> Option<String> {
            Some("lm_head".into())
        }
    };
}
pub(crate) use encoder_decoder_plumbing;

/// [`TrainableModel::linear_modules`]' default.
pub(crate) fn linear_modules_of<M: TrainableModel + ?Sized>(model: &M) -> Vec<LinearModule> {
    let vs = model.var_store();
    let vars = vs.variables();
    let tied: Vec<String> = model.tied_weights().into_iter().map(|(k, _)| k).collect();
    // A quantized part's `weight` holds its codes: its shape is the float weight's.
    let quantized: std::collections::HashMap<String, Vec<i64>> = model
        .context()
        .quant_slots()
        .into_iter()
        .filter_map(|(name, slot)| slot.with(|q| q.map(|q| (name, q.shape()))))
        .collect();
    ordered_variable_names(vs)
        .into_iter()
        .filter_map(|n| {
            let module = n.strip_suffix(".weight")?;
            let size = match quantized.get(module) {
                Some(shape) => shape.clone(),
                None => vars.get(&n)?.size(),
            };
            if size.len() != 2 || model.is_embedding_weight(&n) || tied.contains(&n) {
                return None;
            }
            Some(LinearModule {
                name: module.to_string(),
                in_features: size[1],
                out_features: size[0],
                conv1d: false,
            })
        })
        .collect()
}

/// What the Trainer needs from a model: its variables, train / eval mode and a forward pass
/// (which computes the loss when the inputs carry labels), plus the facts upstream's Trainer
/// reads off a model, as default methods a model overrides where they differ
/// (`modeling_utils.PreTrainedModel`'s `loss_type`, `accepts_loss_kwargs`,
/// `num_parameters`, `_tied_weights_keys`, and the module types behind weight decay).
///
/// A user's own model implements this (the six required methods) and trains with
/// `Trainer::builder` like any hub model; see `examples/src/bin/custom_model.rs`.
pub trait TrainableModel: Send {
    /// The state the model's parts share ([`tchtrain_nn::Context`]): the layer hooks, the
    /// underflow / overflow tracer, NEFTune and the LoRA slots are set through it. A model
    /// without parts of `tchtrain-nn` holds a `Context::new()` that nothing reads.
    fn context(&self) -> &tchtrain_nn::Context;
    /// The variables, named as the model's `state_dict` keys.
    fn var_store(&self) -> &VarStore;
    /// Mutable access to the variables (dtype / device moves, loading).
    fn var_store_mut(&mut self) -> &mut VarStore;
    /// Whether dropout is active (upstream `model.training`).
    fn is_training(&self) -> bool;
    /// Switches between training (dropout applied) and evaluation mode.
    fn set_training(&mut self, training: bool);
    /// Runs the model; with labels, the output carries the loss.
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput>;

    /// Upstream `activation_checkpointing_enable(kwargs, every_n_layers, offload)`: from now
    /// on, in training mode, the layers `settings` selects run without keeping their
    /// activations and are recomputed in the backward (losses and gradients unchanged). A
    /// model without layers to checkpoint refuses, with upstream's message.
    fn activation_checkpointing_enable(
        &mut self,
        settings: crate::ActivationCheckpointing,
    ) -> Result<()> {
        let _ = settings;
        Err(crate::Error::InvalidArgument {
            field: "activation_checkpointing",
            detail: format!(
                "{} does not support activation checkpointing. (upstream's message); train without --activation_checkpointing",
                self.model_name()
            ),
        })
    }

    /// The variables that are upstream buffers (`register_buffer`: BART's
    /// `final_logits_bias`), not parameters: FSDP2's `param_dtype` leaves them as they are,
    /// FSDP1's `buffer_dtype` casts them. Empty for a model without buffers.
    fn buffer_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether trainable adapters sit on the model (a [`PeftModel`](crate::PeftModel)): what
    /// the Trainer requires of a quantized model.
    fn has_adapter(&self) -> bool {
        false
    }

    /// peft's `disable_adapter()`: while `disabled`, the forward runs the base model without
    /// its adapters (TRL's reference model of adapter-based DPO / GRPO). A model without
    /// adapters refuses, naming the fix.
    fn set_adapters_disabled(&self, disabled: bool) -> Result<()> {
        let _ = disabled;
        Err(crate::Error::InvalidArgument {
            field: "disable_adapter",
            detail: format!(
                "{} has no adapter to disable: wrap it with get_peft_model first",
                self.model_name()
            ),
        })
    }

    /// Records the `quantization_config` a 4-bit load used in the model's `config.json`
    /// (transformers writes it when it saves a quantized model). Models that cannot be
    /// loaded in 4 bits here refuse, naming the fix.
    fn set_quantization_config(&mut self, config: Option<serde_json::Value>) -> Result<()> {
        let _ = config;
        Err(crate::Error::InvalidArgument {
            field: "quantization_config",
            detail: format!(
                "4-bit loading (bitsandbytes) is implemented for the decoder families (Llama, Qwen, Mistral, Gemma, ...) here, not for {}; load it without quantization_config",
                self.model_name()
            ),
        })
    }

    /// Upstream's `model.config.pad_token_id = tokenizer.pad_token_id`, which TRL's reward
    /// trainer sets: the id a sequence classifier pools before (its last non-pad token) and the
    /// value the saved `config.json` carries. Implemented for the decoder families' sequence
    /// classifiers; the others refuse, naming the model.
    fn set_pad_token_id(&mut self, pad_token_id: Option<i64>) -> Result<()> {
        let _ = pad_token_id;
        Err(crate::Error::InvalidArgument {
            field: "pad_token_id",
            detail: format!(
                "{} does not take a new pad_token_id here (the decoder families' sequence classifiers do); set it in its config.json",
                self.model_name()
            ),
        })
    }

    /// Upstream's `model.config.use_cache = args.use_cache`, which the Trainer sets when it
    /// is built: the value the saved `config.json` carries. A model without a config has
    /// nothing to set.
    fn set_use_cache(&mut self, use_cache: bool) {
        let _ = use_cache;
    }

    /// Padding-free execution of padded batches: the layers run on the real tokens only
    /// (those the attention mask keeps) and attention per sequence, so that padding costs
    /// no projection, feed-forward, norm or head work. Implemented for the encoders' (BERT,
    /// RoBERTa / XLM-R, DistilBERT, DeBERTa-v2, ModernBERT) sequence classifiers (when each
    /// row's first token, which they read, is real; ModernBERT's mean pooling always), their
    /// masked-LM and token classifiers in training when the labels are -100 on the padding,
    /// the causal LMs (GPT-2, the Llama-shaped families) in training when the labels count
    /// only real tokens (right padding with -100 labels), and the decoders' sequence
    /// classifiers (GPT-2, the Llama-shaped families) when each row's pooled (last non-pad)
    /// token is real, and the encoder of the encoder-decoder models (BART, mBART, T5);
    /// otherwise the forward runs padded. The results equal the padded run's up to
    /// the last bits of the matmuls' sums (MiniLM: logits 3e-7 relative in evaluation,
    /// gradients 5e-6), not to the bit, so it is off by default (the padded run computes
    /// upstream's numbers exactly) and turned on here or, at model creation, by
    /// `TCHTRAIN_PADDING_FREE=1` ([`PADDING_FREE_ENV`]). A model without the path refuses
    /// `true` with the reason.
    fn set_padding_free(&mut self, on: bool) -> Result<()> {
        if on {
            return Err(crate::Error::InvalidArgument {
                field: "padding_free",
                detail: format!(
                    "{} has no padding-free path: it runs padded batches as upstream does",
                    self.model_name()
                ),
            });
        }
        Ok(())
    }

    /// Upstream's `apply_liger_kernel(model, liger_kernel_config)` (the Trainer calls it at
    /// `train()` with `use_liger_kernel`). A model type Liger has no kernels for is left as
    /// it is, with Liger's message; its options are still checked.
    fn apply_liger_kernel(
        &mut self,
        liger_kernel_config: Option<&serde_json::Value>,
    ) -> Result<()> {
        crate::LigerKernelConfig::from_json(liger_kernel_config, self.model_name())?;
        log::warn!(
            "There are currently no Liger kernels supported for {}: use_liger_kernel changes nothing for it (as upstream).",
            self.model_name()
        );
        Ok(())
    }

    /// Upstream `activation_checkpointing_disable()`.
    fn activation_checkpointing_disable(&mut self) {}

    /// Upstream `is_activation_checkpointing`.
    fn is_activation_checkpointing(&self) -> bool {
        false
    }

    /// Upstream `model.train()`.
    fn train(&mut self) {
        self.set_training(true);
    }

    /// Upstream `model.eval()`.
    fn eval(&mut self) {
        self.set_training(false);
    }

    /// The model's name in messages and checkpoint checks (upstream: its class name).
    fn model_name(&self) -> &str {
        "TrainableModel"
    }

    /// The model as a [`PreTrainedModel`] (a config, `save_pretrained`), when it is one.
    fn as_pretrained(&self) -> Option<&dyn PreTrainedModel> {
        None
    }

    /// Upstream `loss_type` (`"ForCausalLM"`, ...), when the class sets one.
    fn loss_type(&self) -> Option<&str> {
        None
    }

    /// Upstream `_loss_shifts_labels`: the loss shifts the labels (`loss_type` is
    /// `ForCausalLM`). The Trainer then counts `num_items_in_batch` over the shifted labels.
    fn loss_shifts_labels(&self) -> bool {
        self.loss_type() == Some("ForCausalLM")
    }

    /// Whether upstream lists the class in `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (the label
    /// smoother shifts the labels of such models).
    fn is_causal_lm(&self) -> bool {
        false
    }

    /// Upstream `config.is_encoder_decoder` (T5, BART): `generate` runs the encoder once
    /// ([`encode`](Self::encode)) and decodes from `decoder_start_token_id`.
    fn is_encoder_decoder(&self) -> bool {
        false
    }

    /// How the model's `prepare_decoder_input_ids_from_labels` shifts labels into
    /// `decoder_input_ids` (`None`: the model has no decoder inputs): what
    /// `DataCollatorForSeq2Seq` takes as `decoder_start`, as upstream's collator given the
    /// model. An encoder-decoder model whose config lacks the ids says so.
    fn decoder_start(&self) -> Result<Option<tchtrain_collators::DecoderStart>> {
        Ok(None)
    }

    /// A model whose `generate` is its own (upstream's `WhisperGenerationMixin.generate`): the
    /// generated ids from the batch's main input and the merged generation configuration;
    /// `None` for the models that generate through [`crate::generate`] from `input_ids`.
    fn own_generate(
        &self,
        inputs: &ModelInputs<'_>,
        config: &crate::GenerationConfig,
    ) -> Option<Result<Tensor>> {
        let _ = (inputs, config);
        None
    }

    /// An encoder-decoder model's encoder on `input_ids` (upstream `model.get_encoder()(...)`):
    /// its last hidden state, which [`ModelInputs::encoder_outputs`] takes back.
    fn encode(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let _ = (input_ids, attention_mask);
        Err(crate::Error::InvalidArgument {
            field: "model",
            detail: format!("{} is not an encoder-decoder model", self.model_name()),
        })
    }

    /// Upstream `model_accepts_loss_kwargs`: the forward uses `num_items_in_batch` (sums its
    /// loss and divides by it), so the Trainer does not divide the loss by the accumulation
    /// steps. `true` when the model reads [`ModelInputs::num_items_in_batch`] as the hub
    /// models do; a model that returns a per-batch mean regardless says `false`, and the
    /// Trainer then scales its loss as upstream does for such a model.
    fn accepts_loss_kwargs(&self) -> bool {
        true
    }

    /// The batch keys that hold the labels, as upstream's `find_labels(model.__class__)`
    /// (the Trainer's `label_names` when the arguments do not set them):
    /// `["start_positions", "end_positions"]` for question answering, else `["labels"]`.
    fn label_names(&self) -> Vec<String> {
        vec!["labels".into()]
    }

    /// Upstream's `main_input_name`: the input the Trainer counts FLOs on (`input_ids`; a
    /// vision model's `pixel_values`).
    fn main_input_name(&self) -> &'static str {
        "input_ids"
    }

    /// The labels a classification head takes, for the check of the training rows.
    fn label_check(&self) -> Option<LabelCheck> {
        None
    }

    /// The modules (names without the parameter suffix) that are `nn.LayerNorm`s whose names
    /// upstream's `forbidden_name_patterns` would not catch: their parameters get no weight
    /// decay (`get_decay_parameter_names` excludes them by type).
    fn layernorm_modules(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether `name` is the weight of an `nn.Embedding` (left out of
    /// `num_parameters(exclude_embeddings=True)`, and so of `floating_point_ops`).
    fn is_embedding_weight(&self, _name: &str) -> bool {
        false
    }

    /// The linear layers in registration order (`named_modules()`), for LoRA: by default
    /// every two-dimensional `*.weight` that is neither an embedding
    /// ([`is_embedding_weight`](Self::is_embedding_weight)) nor tied, as `nn.Linear`
    /// (`[out, in]`); GPT-2 says which are `Conv1D`.
    fn linear_modules(&self) -> Vec<LinearModule> {
        linear_modules_of(self)
    }

    /// Whether the forward takes a [`DynamicCache`](crate::DynamicCache)
    /// (`ModelInputs::past_key_values`): the causal LMs here.
    fn supports_cache(&self) -> bool {
        false
    }

    /// Upstream's `get_output_embeddings()` module name (a causal LM's `lm_head`), which
    /// LoRA's `"all-linear"` leaves out.
    fn output_embeddings(&self) -> Option<String> {
        None
    }

    /// The causal LM head as TRL's fused LM head reads it, for the models whose forward
    /// takes [`ModelInputs::backbone_only`]; `None` for the others.
    fn output_head(&self) -> Option<OutputHead> {
        None
    }

    /// Upstream's `model.parameters()` that require a gradient, in its order (gradient
    /// clipping sums the norms in this order): the variables in creation order by default.
    fn parameters(&self) -> Vec<Tensor> {
        self.var_store()
            .trainable_variables()
            .into_iter()
            .filter(Tensor::requires_grad)
            .collect()
    }

    /// How upstream's checkpoints of this model name its weights when they differ from its
    /// modules (a mixture of experts saved per expert): `from_pretrained`, `save_pretrained`
    /// and the Trainer's resume convert through it. `None`: the names are the modules'.
    fn weight_conversion(&self) -> Option<crate::WeightConversion> {
        None
    }

    /// The class names of the model's transformer layers (upstream's `_no_split_modules`
    /// that the model holds): what FSDP's `transformer_layer_cls_to_wrap` may name, as
    /// accelerate finds them in the model. Empty: not known here (no name is checked).
    fn no_split_modules(&self) -> Vec<String> {
        Vec::new()
    }

    /// The conversion `from_pretrained` reads a checkpoint through (the family's whole
    /// layout, its prefix changes included); what matched the checkpoint's keys is then
    /// kept with [`set_weight_conversion`](Self::set_weight_conversion) for saving, as
    /// upstream keeps the conversions that were used.
    fn load_conversion(&self) -> Option<crate::WeightConversion> {
        self.weight_conversion()
    }

    /// Keeps the conversion a load used (see [`load_conversion`](Self::load_conversion)).
    fn set_weight_conversion(&mut self, _conversion: Option<crate::WeightConversion>) {}

    /// Keys that are views of another parameter (tied weights) and are not saved,
    /// as upstream's `_tied_weights_keys`: `(tied key, source key)`.
    fn tied_weights(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The variables upstream holds as two parameters (peft's `modules_to_save`: the frozen
    /// original and the trained copy), which its `num_parameters` counts twice.
    fn parameters_held_twice(&self) -> Vec<String> {
        Vec::new()
    }

    /// Number of parameters (upstream `num_parameters()`), tied weights counted once.
    fn num_parameters(&self) -> i64 {
        self.var_store()
            .variables()
            .values()
            .map(Tensor::numel)
            .map(|n| n as i64)
            .sum()
    }

    /// Loads a LoRA adapter's weights (`adapter_model.safetensors` in `dir`: a checkpoint of
    /// a [`PeftModel`](crate::PeftModel)'s run) into the model's adapter; a model without an
    /// adapter refuses, naming the fix.
    fn load_adapter(&mut self, dir: &Path) -> Result<()> {
        Err(crate::Error::InvalidArgument {
            field: "adapter",
            detail: format!(
                "{} holds a LoRA adapter but {} has none: wrap the model with get_peft_model (the same LoraConfig) before resuming",
                dir.display(),
                self.model_name()
            ),
        })
    }

    /// Writes the model into `dir` for `save_model` and checkpoints: `save_pretrained` for a
    /// [`PreTrainedModel`]; otherwise the variables as `model.safetensors` (upstream: "Trainer.model
    /// is not a `PreTrainedModel`, only saving its state dict").
    fn save_weights(&self, dir: &Path) -> Result<()> {
        match self.as_pretrained() {
            Some(m) => m.save_pretrained(dir),
            None => {
                loading::save_state_dict(dir, self.var_store().variables().into_iter().collect())
            }
        }
    }
}

/// A model with upstream's parameter names and a config: what `from_pretrained` loads and
/// `save_pretrained` writes (upstream `modeling_utils.PreTrainedModel`).
pub trait PreTrainedModel: TrainableModel {
    /// Upstream class name, written to `config.json`'s `architectures`.
    fn architecture(&self) -> &'static str;
    /// The model's config (serialised as `config.json`).
    fn config(&self) -> &dyn PretrainedConfig;

    /// Upstream's `model.generation_config` of a generative model, as JSON (what
    /// `generation_config.json` holds; [`GenerationConfig::from_json`](crate::GenerationConfig::from_json)
    /// reads it): `None` for a model that does not generate.
    fn generation_config(&self) -> Option<&serde_json::Value> {
        None
    }

    /// Writes `config.json` and `model.safetensors` (tied weights saved once), and a
    /// generative model's `generation_config.json`, so that upstream's `from_pretrained`
    /// loads the folder.
    fn save_pretrained(&self, dir: &Path) -> Result<()> {
        loading::save_pretrained(self, dir)
    }

    /// What upstream's `print(model)` shows (torch's module tree with upstream's class names
    /// and `extra_repr`s; W&B's model artifacts carry it as `model_architecture.txt`).
    /// `None` for the architectures whose tree is not written out here.
    fn module_repr(&self) -> Option<tchtrain_nn::ModuleRepr> {
        None
    }
}

/// The `TrainableModel` methods every architecture implements the same way, for a struct
/// with fields `config`, `vs` (its `VarStore`) and `training` that also implements
/// `PreTrainedModel`. `model_plumbing!(base)` also keeps the base model's config's
/// `use_cache` in step (GPT-2's blocks show it to the underflow / overflow tracer).
macro_rules! model_plumbing {
    ($base:ident) => {
        $crate::modeling_utils::model_plumbing!(@common);
        fn set_use_cache(&mut self, use_cache: bool) {
            for extra in [&mut self.config.extra, &mut self.$base.config.extra] {
                extra.insert("use_cache".into(), serde_json::Value::Bool(use_cache));
            }
        }
    };
    () => {
        $crate::modeling_utils::model_plumbing!(@common);
        fn set_use_cache(&mut self, use_cache: bool) {
            self.config
                .extra
                .insert("use_cache".into(), serde_json::Value::Bool(use_cache));
        }
    };
    (@common) => {
        fn context(&self) -> &tchtrain_nn::Context {
            &self.ctx
        }
        fn var_store(&self) -> &tch::nn::VarStore {
            &self.vs
        }
        fn var_store_mut(&mut self) -> &mut tch::nn::VarStore {
            &mut self.vs
        }
        fn is_training(&self) -> bool {
            self.training
        }
        fn set_training(&mut self, training: bool) {
            self.training = training;
            $crate::TrainableModel::context(self).set_training(training);
        }
        fn model_name(&self) -> &str {
            $crate::PreTrainedModel::architecture(self)
        }
        fn as_pretrained(&self) -> Option<&dyn $crate::PreTrainedModel> {
            Some(self)
        }
    };
}
pub(crate) use model_plumbing;

/// The activation-checkpointing methods of `TrainableModel` for a model whose base model
/// (the field named) holds `checkpointing: Option<ActivationCheckpointing>`.
macro_rules! checkpointing_plumbing {
    ($base:ident) => {
        fn activation_checkpointing_enable(
            &mut self,
            settings: $crate::ActivationCheckpointing,
        ) -> $crate::Result<()> {
            self.$base.checkpointing = Some(settings);
            Ok(())
        }
        fn activation_checkpointing_disable(&mut self) {
            self.$base.checkpointing = None;
        }
        fn is_activation_checkpointing(&self) -> bool {
            self.$base.checkpointing.is_some()
        }
    };
}
pub(crate) use checkpointing_plumbing;

/// A freshly built or loaded model together with its loading report.
pub struct Loaded<M> {
    /// The model.
    pub model: M,
    /// Missing / unexpected / mismatched keys, as upstream's loading report.
    pub info: LoadingInfo,
}

impl<M> std::fmt::Debug for Loaded<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Upstream's pooling of a decoder's sequence classification (`GPT2ForSequenceClassification`,
/// `GenericForSequenceClassification`): each row's logits at its rightmost token that is not
/// the pad token (the last token when there is no pad token, which only a batch of one row
/// may have).
pub(crate) fn last_non_pad_logits(
    logits: &Tensor,
    input_ids: &Tensor,
    pad_token_id: Option<i64>,
) -> Result<Tensor> {
    let ids = input_ids.f_to_device(logits.device())?;
    let (batch, seq) = (ids.size()[0], ids.size()[1]);
    let last = match pad_token_id {
        Some(pad) => last_non_pad_index(&ids, pad)?,
        None if batch == 1 => Tensor::f_from_slice(&[seq - 1])?.f_to_device(ids.device())?,
        None => {
            return Err(crate::Error::InvalidConfig {
                field: "pad_token_id",
                value: "None".into(),
                fix: "set pad_token_id in the config to classify batches larger than 1",
            });
        }
    };
    Ok(logits.f_index(&[
        Some(Tensor::f_arange(batch, (tch::Kind::Int64, ids.device()))?),
        Some(last),
    ])?)
}

/// Upstream's pooled position: each row's last token that is not `pad`
/// (`(arange(seq) * (ids != pad)).argmax(-1)`).
fn last_non_pad_index(ids: &Tensor, pad: i64) -> Result<Tensor> {
    let non_pad = ids.f_ne(pad)?.f_to_kind(tch::Kind::Int64)?;
    Ok(
        (Tensor::f_arange(ids.size()[1], (tch::Kind::Int64, ids.device()))? * non_pad)
            .f_argmax(-1, false)?,
    )
}

/// Whether each row's pooled token (its last non-pad token) is one the attention mask
/// keeps (one host read): a padding-free forward computes no padding position.
pub(crate) fn last_non_pad_tokens_real(
    input_ids: &Tensor,
    attention_mask: &Tensor,
    pad: i64,
) -> Result<bool> {
    if input_ids.size() != attention_mask.size() || input_ids.dim() != 2 {
        return Ok(false);
    }
    let mask = attention_mask.f_to_device(input_ids.device())?;
    let last = last_non_pad_index(input_ids, pad)?;
    Ok(mask
        .f_gather(1, &last.unsqueeze(1), false)?
        .f_ne(0)?
        .f_all()?
        .int64_value(&[])
        != 0)
}

/// The batch keys of a question-answering head's labels (upstream's `find_labels` for a
/// `...ForQuestionAnswering` class).
pub(crate) fn question_answering_label_names() -> Vec<String> {
    vec!["start_positions".into(), "end_positions".into()]
}

/// The loss of a question-answering head whose `logits` are `qa_outputs`' `[batch, seq, 2]`:
/// upstream's `ForQuestionAnsweringLoss` on the split logits (start and end positions
/// clamped to `0..=seq`, `seq` ignored). `num_items_in_batch` reaches the loss only for the
/// heads that call `self.loss_function` (ModernBERT's and the Llama-shaped families'); BERT,
/// RoBERTa, DistilBERT, DeBERTa and GPT-2 use a plain `CrossEntropyLoss` and pass `None`.
/// `None` without positions; an error naming the missing one when only one is given
/// (upstream then silently computes no loss).
pub(crate) fn question_answering_loss(
    logits: &Tensor,
    inputs: &crate::ModelInputs<'_>,
    num_items_in_batch: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let (start, end) = match (inputs.start_positions, inputs.end_positions) {
        (None, None) => return Ok(None),
        (Some(_), None) => {
            return Err(crate::Error::MissingInput {
                name: "end_positions",
            });
        }
        (None, Some(_)) => {
            return Err(crate::Error::MissingInput {
                name: "start_positions",
            });
        }
        (Some(s), Some(e)) => (s, e),
    };
    let start_logits = logits.f_select(-1, 0)?.f_contiguous()?;
    let end_logits = logits.f_select(-1, 1)?.f_contiguous()?;
    Ok(Some(tchtrain_losses::for_question_answering_loss(
        &start_logits,
        &end_logits,
        start,
        end,
        num_items_in_batch,
    )?))
}

/// Upstream's question-answering heads split `qa_outputs` into exactly two logits per token;
/// any other `num_labels` fails there (`too many values to unpack`) or, for DistilBERT, at
/// construction.
pub(crate) fn check_question_answering_labels(num_labels: i64) -> Result<()> {
    if num_labels == 2 {
        return Ok(());
    }
    Err(crate::Error::InvalidConfig {
        field: "num_labels",
        value: num_labels.to_string(),
        fix: "a question-answering head has two outputs per token (start and end); set num_labels to 2 (the default)",
    })
}

/// The environment variable that turns padding-free execution on at model creation (`1` or
/// `true`), for the models that have it (see [`TrainableModel::set_padding_free`]).
pub const PADDING_FREE_ENV: &str = "TCHTRAIN_PADDING_FREE";

/// Whether [`PADDING_FREE_ENV`] asks for padding-free execution.
pub(crate) fn padding_free_from_env() -> bool {
    std::env::var(PADDING_FREE_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true"))
}
