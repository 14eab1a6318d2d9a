//! GPT-2 (upstream `models/gpt2`): `GPT2Config`, `GPT2Model`, `GPT2LMHeadModel`,
//! `GPT2ForSequenceClassification`, with upstream's parameter names
//! (`transformer.h.0.attn.c_attn.weight`, Conv1D weights stored `[in, out]`).

// `h = h + x` on purpose: tch's `+=` works in place and would modify tensors autograd
// saved for backward.
#![allow(clippy::assign_op_pattern)]

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::attention;
use crate::checkpoint::{ActivationCheckpointing, ReadOnlyLayer, Shared, run_layers};
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::loading::{self, LoadOptions};
use crate::modeling_utils::{
    LabelCheck, Loaded, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel,
};
use crate::{Error, Result};
use tchtrain_nn::{Activation, Context, Conv1D, Embedding, LayerNorm, Linear, ModuleRepr};

/// Upstream `GPT2Config` with its defaults (GPT-2 small).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct GPT2Config {
    pub vocab_size: i64,
    pub n_positions: i64,
    pub n_embd: i64,
    pub n_layer: i64,
    pub n_head: i64,
    /// Inner MLP width; `None` means `4 * n_embd`.
    pub n_inner: Option<i64>,
    pub activation_function: String,
    pub resid_pdrop: f64,
    pub embd_pdrop: f64,
    pub attn_pdrop: f64,
    pub layer_norm_epsilon: f64,
    pub initializer_range: f64,
    pub scale_attn_weights: bool,
    pub scale_attn_by_inverse_layer_idx: bool,
    pub reorder_and_upcast_attn: bool,
    pub bos_token_id: Option<i64>,
    pub eos_token_id: Option<i64>,
    pub pad_token_id: Option<i64>,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for GPT2Config {
    fn default() -> Self {
        Self {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: None,
            activation_function: "gelu_new".into(),
            resid_pdrop: 0.1,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            reorder_and_upcast_attn: false,
            bos_token_id: Some(50256),
            eos_token_id: Some(50256),
            pad_token_id: None,
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for GPT2Config {
    fn model_type(&self) -> &'static str {
        "gpt2"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl GPT2Config {
    /// Reads `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("n_positions", self.n_positions),
                ("n_embd", self.n_embd),
                ("n_inner", self.n_inner.unwrap_or(1)),
            ],
            ("n_layer", self.n_layer),
        )?;
        if self.n_head <= 0 || self.n_embd % self.n_head != 0 {
            return Err(Error::InvalidConfig {
                field: "n_head",
                value: format!("{} (n_embd {})", self.n_head, self.n_embd),
                fix: "n_embd must be divisible by n_head",
            });
        }
        if self.reorder_and_upcast_attn {
            return Err(Error::InvalidConfig {
                field: "reorder_and_upcast_attn",
                value: "true".into(),
                fix: "only the sdpa attention path is implemented; set it to false",
            });
        }
        Activation::parse(&self.activation_function, "activation_function")?;
        Ok(())
    }
}

#[derive(Debug)]
struct Block {
    ln_1: LayerNorm,
    c_attn: Conv1D,
    c_proj: Conv1D,
    ln_2: LayerNorm,
    c_fc: Conv1D,
    mlp_proj: Conv1D,
    scaling: f64,
    /// The block's index (its place in a key / value cache).
    idx: usize,
    /// `transformer.h.{i}`, as the underflow / overflow tracer names it.
    name: String,
    ctx: Context,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for Block {}

/// Upstream `GPT2Model`: embeddings, blocks and the final LayerNorm.
#[derive(Debug)]
pub struct GPT2Model {
    /// Where it sits in its model (`transformer`; empty for a bare base model).
    prefix: String,
    wte: Embedding,
    wpe: Embedding,
    h: Vec<Arc<Shared<Block>>>,
    ln_f: LayerNorm,
    act: Activation,
    config: GPT2Config,
    /// Upstream's `gradient_checkpointing` on the blocks.
    pub(crate) checkpointing: Option<ActivationCheckpointing>,
    ctx: Context,
}

/// What a block's forward needs besides the hidden states (owned, so that a checkpointed
/// block can run again in the backward).
struct BlockInputs {
    mask: attention::Mask,
    batch: i64,
    seq: i64,
    heads: i64,
    head_dim: i64,
    n_embd: i64,
    attn_p: f64,
    resid_pdrop: f64,
    train: bool,
    act: Activation,
    /// The config's `use_cache`: upstream's blocks then get a cache object.
    use_cache: bool,
    /// The key / value cache the blocks append to (decoding).
    cache: Option<crate::DynamicCache>,
    /// The padding-free layout, when the blocks run on the real tokens only.
    unpadded: Option<crate::padding_free::Unpadded>,
}

// SAFETY: parameter tensors and plain values that the forward only reads.
#[allow(unsafe_code)]
unsafe impl ReadOnlyLayer for BlockInputs {}

impl Block {
    /// Upstream `GPT2Block.forward`: attention and MLP, each behind a pre-LayerNorm and a
    /// residual connection.
    fn forward(&self, h: &Tensor, x: &BlockInputs) -> Result<Tensor> {
        use tchtrain_nn::{Out, Var, dropout_traced};
        let BlockInputs {
            batch,
            seq,
            heads,
            head_dim,
            n_embd,
            ..
        } = *x;
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let normed = self.ln_1.forward(h);
        let qkv = self.c_attn.forward(&normed).split(n_embd, -1);
        // Padding-free, the real tokens go back to the padded layout for attention.
        let to_heads = |t: &Tensor| {
            let t = match &x.unpadded {
                Some(u) => u.scatter(t),
                None => t.shallow_clone(),
            };
            t.view([batch, seq, heads, head_dim]).transpose(1, 2)
        };
        let dropout = |t: &Tensor, name: &str| match &x.unpadded {
            Some(u) => {
                let y = u.dropout(t, x.resid_pdrop, x.train);
                self.ctx.leaf(|| n(name), "Dropout", &[], t, &y);
                y
            }
            None => dropout_traced(&self.ctx, t, x.resid_pdrop, x.train, || n(name)),
        };
        let (k, v) = (to_heads(&qkv[1]), to_heads(&qkv[2]));
        let (k, v) = match &x.cache {
            Some(cache) => cache.update(self.idx, &k, &v)?,
            None => (k, v),
        };
        let a = attention::sdpa(&to_heads(&qkv[0]), &k, &v, &x.mask, x.attn_p, self.scaling);
        let a = a.transpose(1, 2).reshape([batch, seq, n_embd]);
        let a = match &x.unpadded {
            Some(u) => u.gather(&a),
            None => a,
        };
        let a = self.c_proj.forward(&a);
        let a = dropout(&a, "attn.resid_dropout");
        self.ctx.hook(
            || n("attn"),
            "GPT2Attention",
            &[],
            &[Var::T(&normed)],
            Out::Tuple(&[Var::T(&a), Var::None]),
        );
        let h2 = a + h;
        let normed = self.ln_2.forward(&h2);
        let f = self.c_fc.forward(&normed);
        let f = x.act.apply_traced(&self.ctx, &f, || n("mlp.act"));
        let f = self.mlp_proj.forward(&f);
        let m = dropout(&f, "mlp.dropout");
        self.ctx.leaf(|| n("mlp"), "GPT2MLP", &[], &normed, &m);
        let out = h2 + m;
        // Upstream's block gets (hidden_states, past_key_values, causal_mask,
        // encoder_hidden_states) positionally.
        let cache = if x.use_cache {
            Var::NotTensor
        } else {
            Var::None
        };
        let mask = x.mask.tensor().map_or(Var::None, Var::T);
        self.ctx.hook(
            || self.name.clone(),
            "GPT2Block",
            &[],
            &[Var::T(h), cache, mask, Var::None],
            Out::One(Var::T(&out)),
        );
        Ok(out)
    }
}

impl GPT2Model {
    /// What `print(model.transformer)` shows (upstream's `GPT2Model`).
    fn module_repr(&self) -> ModuleRepr {
        let c = &self.config;
        let (d, inner) = (c.n_embd, c.n_inner.unwrap_or(4 * c.n_embd));
        let ln = || ModuleRepr::layer_norm(d, c.layer_norm_epsilon, true, true);
        let block = ModuleRepr::new("GPT2Block")
            .child("ln_1", ln())
            .child(
                "attn",
                ModuleRepr::new("GPT2Attention")
                    .child("c_attn", ModuleRepr::conv1d(3 * d, d))
                    .child("c_proj", ModuleRepr::conv1d(d, d))
                    .child("attn_dropout", ModuleRepr::dropout(c.attn_pdrop))
                    .child("resid_dropout", ModuleRepr::dropout(c.resid_pdrop)),
            )
            .child("ln_2", ln())
            .child(
                "mlp",
                ModuleRepr::new("GPT2MLP")
                    .child("c_fc", ModuleRepr::conv1d(inner, d))
                    .child("c_proj", ModuleRepr::conv1d(d, inner))
                    .child("act", ModuleRepr::new(self.act.class_name()))
                    .child("dropout", ModuleRepr::dropout(c.resid_pdrop)),
            );
        ModuleRepr::new("GPT2Model")
            .child("wte", ModuleRepr::embedding(c.vocab_size, d, None))
            .child("wpe", ModuleRepr::embedding(c.n_positions, d, None))
            .child("drop", ModuleRepr::dropout(c.embd_pdrop))
            .child("h", ModuleRepr::module_list(vec![block; self.h.len()]))
            .child("ln_f", ln())
    }

    /// Creates the variables under `p` (upstream prefix `transformer`).
    pub fn new(p: tchtrain_nn::Path<'_>, config: &GPT2Config) -> Result<Self> {
        config.validate()?;
        let std = config.initializer_range;
        let (d, inner) = (config.n_embd, config.n_inner.unwrap_or(4 * config.n_embd));
        let head_dim = d / config.n_head;
        // Upstream re-initialises every `c_proj.weight` with std / sqrt(2 * n_layer).
        let proj_std = std / (2.0 * config.n_layer as f64).sqrt();
        // Created in upstream's registration order (wte, wpe, h, ln_f): `model.parameters()`
        // follows it, and gradient clipping sums the per-parameter norms in that order.
        let wte = Embedding::new(&p / "wte", config.vocab_size, d, std);
        let wpe = Embedding::new(&p / "wpe", config.n_positions, d, std);
        let h = (0..config.n_layer)
            .map(|i| {
                let b = &p / "h" / i;
                let mut scaling = if config.scale_attn_weights {
                    (head_dim as f64).powf(-0.5)
                } else {
                    1.0
                };
                if config.scale_attn_by_inverse_layer_idx {
                    scaling /= (i + 1) as f64;
                }
                Arc::new(Shared(Block {
                    ln_1: LayerNorm::new(&b / "ln_1", d, config.layer_norm_epsilon),
                    c_attn: Conv1D::new(&b / "attn" / "c_attn", 3 * d, d, std),
                    c_proj: Conv1D::new(&b / "attn" / "c_proj", d, d, proj_std),
                    ln_2: LayerNorm::new(&b / "ln_2", d, config.layer_norm_epsilon),
                    c_fc: Conv1D::new(&b / "mlp" / "c_fc", inner, d, std),
                    mlp_proj: Conv1D::new(&b / "mlp" / "c_proj", d, inner, proj_std),
                    scaling,
                    idx: i as usize,
                    name: b.name(),
                    ctx: b.ctx().clone(),
                }))
            })
            .collect();
        Ok(Self {
            prefix: p.name(),
            wte,
            wpe,
            h,
            ln_f: LayerNorm::new(&p / "ln_f", d, config.layer_norm_epsilon),
            act: Activation::parse(&config.activation_function, "activation_function")?,
            config: config.clone(),
            checkpointing: None,
            ctx: p.ctx().clone(),
        })
    }

    /// The token embedding matrix (tied to the LM head).
    pub fn wte(&self) -> &Tensor {
        &self.wte.ws
    }

    /// The last hidden state `[batch, seq, n_embd]`.
    pub fn forward(&self, inputs: &ModelInputs<'_>, train: bool) -> Result<Tensor> {
        Ok(self.forward_with(inputs, train, false)?.0)
    }

    /// [`forward`](Self::forward), the blocks run padding-free when `padding_free`, the
    /// attention mask pads a token and no cache is used (see `crate::padding_free`): the
    /// last hidden state is then the real tokens' `[tokens, n_embd]`, with their layout.
    pub(crate) fn forward_with(
        &self,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<(Tensor, Option<crate::padding_free::Unpadded>)> {
        let ids = inputs.ids()?;
        let (batch, seq) = crate::check_ids(ids, self.config.vocab_size, self.config.n_positions)?;
        let device = self.wte.ws.device();
        let ids = ids.f_to_device(device)?;
        let cache = crate::cache_utils::cache_for_layers(
            inputs.past_key_values,
            train,
            self.checkpointing.is_some(),
        );
        let past = cache.map_or(0, crate::DynamicCache::get_seq_length);
        // `wpe` has `n_positions` rows: the cached tokens count.
        if past + seq > self.config.n_positions {
            return Err(Error::InvalidInput {
                name: "input_ids",
                detail: format!(
                    "{past} cached and {seq} new tokens exceed the {} positions of the model (n_positions)",
                    self.config.n_positions
                ),
            });
        }
        let positions = match inputs.position_ids {
            Some(p) => {
                let p = p.f_to_device(device)?;
                let (lo, hi) = (i64::try_from(p.f_min()?)?, i64::try_from(p.f_max()?)?);
                if lo < 0 || hi >= self.config.n_positions {
                    return Err(Error::InvalidInput {
                        name: "position_ids",
                        detail: format!(
                            "positions {lo}..={hi} outside the model's 0..{} (n_positions)",
                            self.config.n_positions
                        ),
                    });
                }
                p
            }
            None => Tensor::arange_start(past, past + seq, (Kind::Int64, device)).unsqueeze(0),
        };
        // NEFTune's hook sits on `wte`, so it also sees the token-type lookup (and the
        // underflow / overflow tracer, registered after it, sees the noisy output).
        let n = |rest: &str| tchtrain_nn::join(&self.prefix, rest);
        let embed = |ids: &Tensor| -> Result<Tensor> {
            let e = self
                .wte
                .input_forward(ids, self.wte.lookup(ids), None, train)?;
            Ok(e)
        };
        let inputs_embeds = embed(&ids)?;
        let position_embeds = self.wpe.forward(&positions);
        let mut h = inputs_embeds + position_embeds;
        if let Some(tt) = inputs.token_type_ids {
            h = h + embed(&tt.f_to_device(device)?)?;
        }
        let c = &self.config;
        let mut h = tchtrain_nn::dropout_traced(&self.ctx, &h, c.embd_pdrop, train, || n("drop"));
        let unpadded = crate::padding_free::Unpadded::for_forward(
            &self.ctx,
            padding_free,
            cache.is_some(),
            inputs.attention_mask,
            device,
        )?;
        if let Some(u) = &unpadded {
            h = u.gather(&h);
        }
        let use_cache = crate::configuration_utils::forward_builds_cache(
            &c.extra,
            train,
            self.checkpointing.is_some(),
        );
        let (mask, _) = attention::causal_masks(
            inputs.position_ids,
            inputs.attention_mask,
            inputs.past_key_values.is_some() || use_cache,
            batch,
            seq,
            past,
            None,
            device,
        )?;
        let x = Arc::new(Shared(BlockInputs {
            mask,
            batch,
            seq,
            heads: c.n_head,
            head_dim: c.n_embd / c.n_head,
            n_embd: c.n_embd,
            attn_p: if train { c.attn_pdrop } else { 0.0 },
            resid_pdrop: c.resid_pdrop,
            train,
            act: self.act,
            // Upstream passes no cache to checkpointed blocks in training.
            use_cache,
            cache: cache.cloned(),
            unpadded: unpadded
                .as_ref()
                .map(crate::padding_free::Unpadded::shallow_clone),
        }));
        let h = run_layers(
            &self.ctx,
            &self.h,
            &x,
            None,
            self.checkpointing.as_ref(),
            train,
            h,
            |b, h, _, x| b.forward(h, x),
        )?;
        let h = self.ln_f.forward(&h);
        if !self.prefix.is_empty() {
            // Called positionally with `input_ids` by the heads.
            self.ctx.hook(
                || self.prefix.clone(),
                "GPT2Model",
                &[],
                &[tchtrain_nn::Var::T(&ids)],
                tchtrain_nn::Out::One(tchtrain_nn::Var::NotTensor),
            );
        }
        Ok((h, unpadded))
    }
}

fn build_vs(device: Device) -> nn::VarStore {
    nn::VarStore::new(device)
}

/// Upstream `GPT2LMHeadModel`: `transformer` + `lm_head` (tied to `wte` by default).
#[derive(Debug)]
pub struct GPT2LMHeadModel {
    vs: nn::VarStore,
    ctx: Context,
    transformer: GPT2Model,
    lm_head: Option<Tensor>,
    config: GPT2Config,
    training: bool,
    /// Run the blocks and the head on the real tokens only in training (see
    /// [`TrainableModel::set_padding_free`]; off unless `TCHTRAIN_PADDING_FREE` turns it on).
    padding_free: bool,
    /// `generation_config` (as JSON).
    generation_config: serde_json::Value,
}

impl GPT2LMHeadModel {
    /// A freshly initialised model (upstream `GPT2LMHeadModel(config)`), seeded by tch's RNG.
    pub fn new(config: &GPT2Config, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &GPT2Config, device: Device, ctx: &Context) -> Result<Self> {
        let vs = build_vs(device);
        let transformer =
            GPT2Model::new(tchtrain_nn::Path::root(&vs, ctx) / "transformer", config)?;
        let lm_head = (!config.tie_word_embeddings).then(|| {
            tchtrain_nn::initialization::var(
                &(tchtrain_nn::Path::root(&vs, ctx) / "lm_head"),
                "weight",
                &[config.vocab_size, config.n_embd],
                tchtrain_nn::initialization::normal(config.initializer_range),
            )
        });
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            transformer,
            lm_head,
            config: config.clone(),
            training: false,
            padding_free: crate::modeling_utils::padding_free_from_env(),
            // Upstream's `GenerationConfig.from_model_config(config)`.
            generation_config: crate::generation::generation_fields_of(&config.to_json_value()?),
        })
    }

    /// Upstream `from_pretrained` on a resolved local folder.
    pub fn from_pretrained_dir(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let config = GPT2Config::from_file(&dir.join(loading::CONFIG_NAME))?;
        let mut loaded = loading::from_pretrained_with(dir, "transformer", &[], options, |ctx| {
            Self::new_in(&config, device, ctx)
        })?;
        loaded.model.generation_config =
            crate::generation::model_generation_config(dir, &config.to_json_value()?)?;
        Ok(loaded)
    }
}

impl PreTrainedModel for GPT2LMHeadModel {
    fn architecture(&self) -> &'static str {
        "GPT2LMHeadModel"
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn generation_config(&self) -> Option<&serde_json::Value> {
        Some(&self.generation_config)
    }
    fn module_repr(&self) -> Option<ModuleRepr> {
        Some(
            ModuleRepr::new("GPT2LMHeadModel")
                .child("transformer", self.transformer.module_repr())
                .child(
                    "lm_head",
                    ModuleRepr::linear(self.config.n_embd, self.config.vocab_size, false),
                ),
        )
    }
}

impl TrainableModel for GPT2LMHeadModel {
    fn no_split_modules(&self) -> Vec<String> {
        vec!["GPT2Block".into()]
    }
    crate::modeling_utils::model_plumbing!(transformer);
    crate::modeling_utils::checkpointing_plumbing!(transformer);
    // Upstream's GPT2LMHeadModel sets no `loss_type` (its loss shifts inside the model, but
    // `_loss_shifts_labels` is false); it is in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.
    fn supports_cache(&self) -> bool {
        true
    }
    fn output_embeddings(&self) -> Option<String> {
        Some("lm_head".into())
    }
    fn is_causal_lm(&self) -> bool {
        true
    }
    fn layernorm_modules(&self) -> Vec<String> {
        gpt2_layernorm_modules(&self.vs)
    }
    fn linear_modules(&self) -> Vec<crate::LinearModule> {
        gpt2_linear_modules(self)
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        matches!(name, "transformer.wte.weight" | "transformer.wpe.weight")
    }
    fn tied_weights(&self) -> Vec<(String, String)> {
        if self.lm_head.is_none() {
            vec![("lm_head.weight".into(), "transformer.wte.weight".into())]
        } else {
            vec![]
        }
    }
    /// In training, when the labels count only real tokens (the loss then reads no
    /// padding position's logits); otherwise the forward runs padded.
    fn set_padding_free(&mut self, on: bool) -> Result<()> {
        self.padding_free = on;
        Ok(())
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let padding_free = self.padding_free
            && self.training
            && inputs.logits_to_keep.is_none()
            && match (inputs.labels, inputs.attention_mask) {
                (Some(l), Some(m)) => crate::padding_free::causal_loss_reads_only_real_tokens(l, m),
                _ => false,
            };
        let (h, unpadded) = self
            .transformer
            .forward_with(inputs, self.training, padding_free)?;
        let weight = self.lm_head.as_ref().unwrap_or(self.transformer.wte());
        // `logits_to_keep`: the head on the last positions' hidden states alone.
        let kept = crate::modeling_utils::keep_last_positions(&h, inputs.logits_to_keep)?;
        let h_head = kept.as_ref().unwrap_or(&h);
        let logits = h_head.matmul(&weight.tr());
        self.ctx.leaf(
            || "lm_head".into(),
            "Linear",
            &[("weight", weight)],
            h_head,
            &logits,
        );
        // Padding-free: the real tokens' logits and hidden states back in the padded layout
        // (zeros at the padding, which the loss does not read).
        let (logits, h) = match &unpadded {
            Some(u) => (u.scatter(&logits), u.scatter(&h)),
            None => (logits, h),
        };
        let loss = match inputs.labels {
            Some(labels) => Some(tchtrain_losses::for_causal_lm_loss(
                &logits,
                labels,
                self.config.vocab_size,
                inputs.num_items_in_batch,
                -100,
                None,
            )?),
            None => None,
        };
        self.ctx.model_frame(self.architecture())?;
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss: None,
        })
    }
}

/// Upstream `GPT2ForSequenceClassification`: `transformer` + `score` (no bias), pooled
/// at the last non-padding token.
#[derive(Debug)]
pub struct GPT2ForSequenceClassification {
    vs: nn::VarStore,
    ctx: Context,
    transformer: GPT2Model,
    score: Linear,
    config: GPT2Config,
    training: bool,
    /// Run the blocks and the head on the real tokens only (see
    /// [`TrainableModel::set_padding_free`]; off unless `TCHTRAIN_PADDING_FREE` turns it on).
    padding_free: bool,
}

impl GPT2ForSequenceClassification {
    /// A freshly initialised model.
    pub fn new(config: &GPT2Config, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &GPT2Config, device: Device, ctx: &Context) -> Result<Self> {
        let vs = build_vs(device);
        let transformer =
            GPT2Model::new(tchtrain_nn::Path::root(&vs, ctx) / "transformer", config)?;
        let score = Linear::new(
            tchtrain_nn::Path::root(&vs, ctx) / "score",
            config.n_embd,
            config.num_labels(),
            false,
            config.initializer_range,
        );
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            transformer,
            score,
            config: config.clone(),
            training: false,
            padding_free: crate::modeling_utils::padding_free_from_env(),
        })
    }

    /// Upstream `from_pretrained(dir, num_labels=...)`: a base checkpoint gets a fresh head.
    pub fn from_pretrained_dir(
        dir: &Path,
        num_labels: Option<i64>,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let mut config = GPT2Config::from_file(&dir.join(loading::CONFIG_NAME))?;
        if let Some(n) = num_labels {
            config.labels.set_num_labels(n)?;
        }
        loading::from_pretrained_with(dir, "transformer", &["lm_head.weight"], options, |ctx| {
            Self::new_in(&config, device, ctx)
        })
    }
}

impl PreTrainedModel for GPT2ForSequenceClassification {
    fn architecture(&self) -> &'static str {
        "GPT2ForSequenceClassification"
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn module_repr(&self) -> Option<ModuleRepr> {
        Some(
            ModuleRepr::new("GPT2ForSequenceClassification")
                .child("transformer", self.transformer.module_repr())
                .child(
                    "score",
                    ModuleRepr::linear(self.config.n_embd, self.config.labels.num_labels(), false),
                ),
        )
    }
}

impl TrainableModel for GPT2ForSequenceClassification {
    fn no_split_modules(&self) -> Vec<String> {
        vec!["GPT2Block".into()]
    }
    crate::modeling_utils::model_plumbing!(transformer);
    crate::modeling_utils::checkpointing_plumbing!(transformer);
    fn label_check(&self) -> Option<LabelCheck> {
        Some(LabelCheck::Sequence {
            num_labels: self.config.num_labels(),
        })
    }
    fn layernorm_modules(&self) -> Vec<String> {
        gpt2_layernorm_modules(&self.vs)
    }
    fn linear_modules(&self) -> Vec<crate::LinearModule> {
        gpt2_linear_modules(self)
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        matches!(name, "transformer.wte.weight" | "transformer.wpe.weight")
    }
    /// When every row's pooled token (its last non-pad token) is real; otherwise the
    /// forward runs padded.
    fn set_padding_free(&mut self, on: bool) -> Result<()> {
        self.padding_free = on;
        Ok(())
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        // Padding-free when every row's pooled token (its last non-pad token) is real.
        let padding_free = self.padding_free
            && match (inputs.attention_mask, self.config.pad_token_id) {
                (Some(m), Some(pad)) => {
                    crate::modeling_utils::last_non_pad_tokens_real(inputs.ids()?, m, pad)?
                }
                _ => false,
            };
        let (h, unpadded) = self
            .transformer
            .forward_with(inputs, self.training, padding_free)?;
        let logits = self.score.forward(&h);
        // Padding-free: back in the padded layout (zeros at the padding, never pooled).
        let (logits, h) = match &unpadded {
            Some(u) => (u.scatter(&logits), u.scatter(&h)),
            None => (logits, h),
        };
        let pooled = crate::modeling_utils::last_non_pad_logits(
            &logits,
            inputs.ids()?,
            self.config.pad_token_id,
        )?;
        let loss = match inputs.labels {
            Some(labels) => Some(tchtrain_losses::for_sequence_classification_loss(
                labels,
                &pooled,
                self.config.num_labels(),
                self.config.labels.problem_type()?,
                inputs.num_items_in_batch,
            )?),
            None => None,
        };
        self.ctx.model_frame(self.architecture())?;
        Ok(ModelOutput {
            loss,
            logits: Some(pooled),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss: None,
        })
    }
}

/// Upstream `GPT2ForQuestionAnswering`: `transformer` and `qa_outputs` (hidden → 2, with a
/// bias) on every token. The logits are `qa_outputs`' `[batch, seq, 2]`
/// ([`ModelOutput::start_end_logits`] splits them); the loss is a plain
/// `CrossEntropyLoss` mean (no `num_items_in_batch`), as upstream's.
#[derive(Debug)]
pub struct GPT2ForQuestionAnswering {
    vs: nn::VarStore,
    ctx: Context,
    transformer: GPT2Model,
    qa_outputs: Linear,
    config: GPT2Config,
    training: bool,
}

impl GPT2ForQuestionAnswering {
    /// A freshly initialised model.
    pub fn new(config: &GPT2Config, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &GPT2Config, device: Device, ctx: &Context) -> Result<Self> {
        let vs = build_vs(device);
        let transformer =
            GPT2Model::new(tchtrain_nn::Path::root(&vs, ctx) / "transformer", config)?;
        let qa_outputs = Linear::new(
            tchtrain_nn::Path::root(&vs, ctx) / "qa_outputs",
            config.n_embd,
            2,
            true,
            config.initializer_range,
        );
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            transformer,
            qa_outputs,
            config: config.clone(),
            training: false,
        })
    }

    /// Upstream `from_pretrained(dir)`: a base or causal LM checkpoint gets a fresh head.
    pub fn from_pretrained_dir(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let config = GPT2Config::from_file(&dir.join(loading::CONFIG_NAME))?;
        loading::from_pretrained_with(dir, "transformer", &["lm_head.weight"], options, |ctx| {
            Self::new_in(&config, device, ctx)
        })
    }
}

impl PreTrainedModel for GPT2ForQuestionAnswering {
    fn architecture(&self) -> &'static str {
        "GPT2ForQuestionAnswering"
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
}

impl TrainableModel for GPT2ForQuestionAnswering {
    fn no_split_modules(&self) -> Vec<String> {
        vec!["GPT2Block".into()]
    }
    crate::modeling_utils::model_plumbing!(transformer);
    crate::modeling_utils::checkpointing_plumbing!(transformer);
    fn label_names(&self) -> Vec<String> {
        crate::modeling_utils::question_answering_label_names()
    }
    fn layernorm_modules(&self) -> Vec<String> {
        gpt2_layernorm_modules(&self.vs)
    }
    fn linear_modules(&self) -> Vec<crate::LinearModule> {
        gpt2_linear_modules(self)
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        matches!(name, "transformer.wte.weight" | "transformer.wpe.weight")
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let h = self.transformer.forward(inputs, self.training)?;
        let logits = self.qa_outputs.forward(&h);
        let loss = crate::modeling_utils::question_answering_loss(&logits, inputs, None)?;
        self.ctx.model_frame(self.architecture())?;
        Ok(ModelOutput {
            loss,
            logits: Some(logits),
            last_hidden_state: Some(h),
            pooler_output: None,
            aux_loss: None,
        })
    }
}

/// GPT-2's linear layers: its `Conv1D`s (`c_attn`, `c_proj`, `c_fc`, weights `[in, out]`)
/// and the heads' `nn.Linear`s.
fn gpt2_linear_modules<M: TrainableModel + ?Sized>(model: &M) -> Vec<crate::LinearModule> {
    crate::modeling_utils::linear_modules_of(model)
        .into_iter()
        .map(|mut l| {
            let last = l.name.rsplit('.').next().unwrap_or_default();
            if matches!(last, "c_attn" | "c_proj" | "c_fc") {
                std::mem::swap(&mut l.in_features, &mut l.out_features);
                l.conv1d = true;
            }
            l
        })
        .collect()
}

/// GPT-2's `nn.LayerNorm` modules (`ln_1`, `ln_2`, `ln_f`), whose names upstream's
/// `forbidden_name_patterns` do not catch: their parameters get no weight decay.
fn gpt2_layernorm_modules(vs: &nn::VarStore) -> Vec<String> {
    let mut out: Vec<String> = vs
        .variables()
        .keys()
        .filter_map(|n| n.rsplit_once('.').map(|(module, _)| module))
        .filter(|module| {
            let last = module.rsplit('.').next().unwrap_or(module);
            last == "ln_f" || (last.starts_with("ln_") && last[3..].parse::<u32>().is_ok())
        })
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}
