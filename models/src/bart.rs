//! BART and mBART (upstream `models/bart`, `models/mbart`): `BartConfig` and
//! `BartForConditionalGeneration` / `MBartForConditionalGeneration`, with upstream's
//! parameter names (`model.encoder.layers.0.self_attn.k_proj.weight`, ...).
//!
//! Both are the same encoder-decoder: token embeddings shared by the two stacks (scaled by
//! `sqrt(d_model)` with `scale_embedding`), learned positions with upstream's offset of 2, a
//! LayerNorm on the embeddings, post-norm layers (BART) or pre-norm layers with a final
//! LayerNorm per stack (mBART), the head tied to the embeddings plus the
//! `final_logits_bias` buffer. mBART shifts its labels by wrapping each row's last
//! non-padding token (the language code) to the front (its `shift_tokens_right`).

// `h = h + x` on purpose: tch's `+=` works in place and would modify tensors autograd
// saved for backward.
#![allow(clippy::assign_op_pattern)]

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::attention;
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::loading::{self, LoadOptions};
use crate::modeling_utils::{Loaded, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel};
use crate::padding_free::{self, Unpadded};
use crate::{DynamicCache, Error, Result};
use tchtrain_nn::neftune_post_forward_hook;
use tchtrain_nn::{Activation, Context, Embedding, LayerNorm, Linear, ModuleRepr};

/// Upstream `BartConfig` / `MBartConfig` with BART's defaults (bart-large).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct BartConfig {
    pub vocab_size: i64,
    pub max_position_embeddings: i64,
    pub encoder_layers: i64,
    pub encoder_ffn_dim: i64,
    pub encoder_attention_heads: i64,
    pub decoder_layers: i64,
    pub decoder_ffn_dim: i64,
    pub decoder_attention_heads: i64,
    pub encoder_layerdrop: f64,
    pub decoder_layerdrop: f64,
    pub activation_function: String,
    pub d_model: i64,
    pub dropout: f64,
    pub attention_dropout: f64,
    pub activation_dropout: f64,
    pub init_std: f64,
    pub scale_embedding: bool,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    /// An id or a list of ids.
    pub eos_token_id: Option<serde_json::Value>,
    pub decoder_start_token_id: Option<i64>,
    /// An id or a list of ids.
    pub forced_eos_token_id: Option<serde_json::Value>,
    pub is_encoder_decoder: bool,
    pub tie_word_embeddings: bool,
    /// mBART (`model_type` "mbart"): pre-norm layers, a final LayerNorm per stack, its
    /// label shift.
    #[serde(skip)]
    pub mbart: bool,
    /// Whisper's layers (the config [`crate::whisper`] builds for its stacks): keys without a
    /// bias, queries scaled before the product (upstream's `WhisperAttention`), pre-norm as
    /// mBART's.
    #[serde(skip)]
    pub(crate) whisper: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for BartConfig {
    fn default() -> Self {
        Self {
            vocab_size: 50265,
            max_position_embeddings: 1024,
            encoder_layers: 12,
            encoder_ffn_dim: 4096,
            encoder_attention_heads: 16,
            decoder_layers: 12,
            decoder_ffn_dim: 4096,
            decoder_attention_heads: 16,
            encoder_layerdrop: 0.0,
            decoder_layerdrop: 0.0,
            activation_function: "gelu".into(),
            d_model: 1024,
            dropout: 0.1,
            attention_dropout: 0.0,
            activation_dropout: 0.0,
            init_std: 0.02,
            scale_embedding: false,
            pad_token_id: Some(1),
            bos_token_id: Some(0),
            eos_token_id: Some(2.into()),
            decoder_start_token_id: Some(2),
            forced_eos_token_id: Some(2.into()),
            is_encoder_decoder: true,
            tie_word_embeddings: true,
            mbart: false,
            whisper: false,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for BartConfig {
    fn model_type(&self) -> &'static str {
        if self.mbart { "mbart" } else { "bart" }
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl BartConfig {
    /// Upstream `MBartConfig()`'s defaults (BART's, but no decoder start token).
    pub fn mbart() -> Self {
        Self {
            mbart: true,
            decoder_start_token_id: None,
            ..Self::default()
        }
    }

    /// Reads `config.json` (`model_type` "bart" or "mbart").
    pub fn from_file(path: &Path) -> Result<Self> {
        let model_type = configuration_utils::read_model_type(path)?;
        let mut c: Self = configuration_utils::read_config(path)?;
        c.mbart = match model_type.as_str() {
            "bart" => false,
            "mbart" => true,
            other => {
                return Err(Error::InvalidConfig {
                    field: "model_type",
                    value: other.into(),
                    fix: "BartConfig reads bart and mbart checkpoints",
                });
            }
        };
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("max_position_embeddings", self.max_position_embeddings),
                ("d_model", self.d_model),
                ("encoder_ffn_dim", self.encoder_ffn_dim),
                ("decoder_ffn_dim", self.decoder_ffn_dim),
                ("decoder_layers", self.decoder_layers),
            ],
            ("encoder_layers", self.encoder_layers),
        )?;
        self.validate_layers()?;
        configuration_utils::check_padding_idx(self.pad_token_id, self.vocab_size)?;
        Ok(())
    }

    /// The layers' settings: heads dividing `d_model`, probabilities, the activation.
    pub(crate) fn validate_layers(&self) -> Result<()> {
        for (field, heads) in [
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
        ] {
            if heads <= 0 || self.d_model % heads != 0 {
                return Err(Error::InvalidConfig {
                    field,
                    value: format!("{heads} (d_model {})", self.d_model),
                    fix: "embed_dim must be divisible by num_heads (upstream's check)",
                });
            }
        }
        for (field, p) in [
            ("dropout", self.dropout),
            ("attention_dropout", self.attention_dropout),
            ("activation_dropout", self.activation_dropout),
            ("encoder_layerdrop", self.encoder_layerdrop),
            ("decoder_layerdrop", self.decoder_layerdrop),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::InvalidConfig {
                    field,
                    value: p.to_string(),
                    fix: "a probability in [0, 1]",
                });
            }
        }
        Activation::parse(&self.activation_function, "activation_function")?;
        Ok(())
    }

    fn embed_scale(&self) -> f64 {
        if self.scale_embedding {
            (self.d_model as f64).sqrt()
        } else {
            1.0
        }
    }
}

/// Upstream `BartAttention` (`k_proj`, `v_proj`, `q_proj`, `out_proj`, biased).
#[derive(Debug)]
struct Attention {
    k_proj: Linear,
    v_proj: Linear,
    q_proj: Linear,
    out_proj: Linear,
    heads: i64,
    /// Whisper's: the queries times `head_dim ** -0.5` before the product (SDPA then scales
    /// by 1.0), upstream's order.
    prescale: bool,
}

impl Attention {
    fn new(p: tchtrain_nn::Path<'_>, c: &BartConfig, heads: i64) -> Self {
        let (d, std) = (c.d_model, c.init_std);
        Self {
            k_proj: Linear::in_layer(&p / "k_proj", d, d, !c.whisper, std),
            v_proj: Linear::in_layer(&p / "v_proj", d, d, true, std),
            q_proj: Linear::in_layer(&p / "q_proj", d, d, true, std),
            out_proj: Linear::in_layer(&p / "out_proj", d, d, true, std),
            heads,
            prescale: c.whisper,
        }
    }

    /// Self-attention (`key_value_states` `None`, the cache appended to in the decoder) or
    /// cross-attention over the encoder's states.
    fn forward(
        &self,
        h: &Tensor,
        key_value_states: Option<&Tensor>,
        mask: &attention::Mask,
        cache: Option<(&DynamicCache, usize)>,
        s: &StackInputs<'_>,
    ) -> Result<Tensor> {
        let unpadded = s.unpadded.as_ref();
        let (batch, q_len) = match unpadded {
            Some(u) => u.batch_seq(),
            None => (h.size()[0], h.size()[1]),
        };
        let d = h.size().last().copied().unwrap_or(0);
        let head_dim = d / self.heads;
        let heads = |t: &Tensor| {
            padding_free::padded(unpadded, t.shallow_clone())
                .view([batch, -1, self.heads, head_dim])
                .transpose(1, 2)
        };
        let scaling = (head_dim as f64).powf(-0.5);
        let q = if self.prescale {
            heads(&(self.q_proj.forward(h) * scaling))
        } else {
            heads(&self.q_proj.forward(h))
        };
        let current = key_value_states.unwrap_or(h);
        let k = heads(&self.k_proj.forward(current));
        let v = heads(&self.v_proj.forward(current));
        // The encoder's keys are computed again at every decoding step (upstream caches
        // them: the same op on the same states, the same values).
        let (k, v) = match (cache, key_value_states) {
            (Some((cache, idx)), None) => cache.update(idx, &k, &v)?,
            (Some(_), Some(_)) => (
                crate::cache_utils::first_update(&k, k.kind())?,
                crate::cache_utils::first_update(&v, k.kind())?,
            ),
            (None, _) => (k, v),
        };
        let dropout = if s.train {
            s.config.attention_dropout
        } else {
            0.0
        };
        let scale = if self.prescale { 1.0 } else { scaling };
        let a = attention::sdpa(&q, &k, &v, mask, dropout, scale);
        let a = padding_free::unpadded(unpadded, a.transpose(1, 2).reshape([batch, q_len, d]));
        Ok(self.out_proj.forward(&a))
    }
}

/// An encoder layer (`self_attn`, `fc1`, `fc2`) or a decoder layer (plus `encoder_attn`).
#[derive(Debug)]
pub(crate) struct Layer {
    ctx: Context,
    self_attn: Attention,
    self_attn_layer_norm: LayerNorm,
    encoder_attn: Option<(Attention, LayerNorm)>,
    fc1: Linear,
    fc2: Linear,
    final_layer_norm: LayerNorm,
    idx: usize,
    name: String,
}

/// What every layer of a stack's forward shares.
pub(crate) struct StackInputs<'a> {
    pub(crate) config: &'a BartConfig,
    pub(crate) act: Activation,
    pub(crate) train: bool,
    pub(crate) mask: attention::Mask,
    pub(crate) encoder: Option<(&'a Tensor, attention::Mask)>,
    pub(crate) cache: Option<&'a DynamicCache>,
    /// The encoder's padding-free layout, when its layers run on the real tokens only.
    pub(crate) unpadded: Option<Unpadded>,
}

/// Upstream's fp16 clamp: BART's encoder layers clamp when a value is not finite, mBART's
/// always.
fn clamp_fp16(h: Tensor, always: bool) -> Tensor {
    if h.kind() != Kind::Half || !(always || h.isfinite().all().int64_value(&[]) == 0) {
        return h;
    }
    let clamp = 65504.0 - 1000.0;
    h.clamp(-clamp, clamp)
}

impl Layer {
    pub(crate) fn new(
        p: tchtrain_nn::Path<'_>,
        c: &BartConfig,
        decoder: bool,
        idx: i64,
        name: String,
    ) -> Self {
        let (d, std) = (c.d_model, c.init_std);
        let (heads, ffn) = if decoder {
            (c.decoder_attention_heads, c.decoder_ffn_dim)
        } else {
            (c.encoder_attention_heads, c.encoder_ffn_dim)
        };
        let ln = |n: &str| LayerNorm::new(&p / n, d, 1e-5);
        Self {
            ctx: p.ctx().clone(),
            self_attn: Attention::new(&p / "self_attn", c, heads),
            self_attn_layer_norm: ln("self_attn_layer_norm"),
            encoder_attn: decoder.then(|| {
                (
                    Attention::new(&p / "encoder_attn", c, heads),
                    ln("encoder_attn_layer_norm"),
                )
            }),
            fc1: Linear::in_layer(&p / "fc1", d, ffn, true, std),
            fc2: Linear::in_layer(&p / "fc2", ffn, d, true, std),
            final_layer_norm: ln("final_layer_norm"),
            idx: idx as usize,
            name,
        }
    }

    /// `BartEncoderLayer` / `BartDecoderLayer` (post-norm), or mBART's (pre-norm).
    pub(crate) fn forward(&self, h: &Tensor, s: &StackInputs<'_>) -> Result<Tensor> {
        let c = s.config;
        let pre = c.mbart;
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let drop = |x: &Tensor, p: f64| {
            padding_free::dropout_traced(&self.ctx, s.unpadded.as_ref(), x, p, s.train, || {
                n("dropout")
            })
        };
        // Self-attention.
        let residual = h;
        let x = if pre {
            self.self_attn_layer_norm.forward(h)
        } else {
            h.shallow_clone()
        };
        let cache = s.cache.map(|cache| (cache, self.idx));
        let x = self.self_attn.forward(&x, None, &s.mask, cache, s)?;
        let mut h = residual + drop(&x, c.dropout);
        if !pre {
            h = self.self_attn_layer_norm.forward(&h);
        }
        // Cross-attention.
        if let (Some((attn, ln)), Some((states, mask))) = (&self.encoder_attn, &s.encoder) {
            let residual = &h;
            let x = if pre {
                ln.forward(&h)
            } else {
                h.shallow_clone()
            };
            let x = attn.forward(&x, Some(states), mask, cache, s)?;
            let mut out = residual + drop(&x, c.dropout);
            if !pre {
                out = ln.forward(&out);
            }
            h = out;
        }
        // Feed-forward.
        let residual = &h;
        let x = if pre {
            self.final_layer_norm.forward(&h)
        } else {
            h.shallow_clone()
        };
        let x = self.fc1.forward(&x);
        let x = s.act.apply_traced(&self.ctx, &x, || n("activation_fn"));
        let x = drop(&x, c.activation_dropout);
        let x = self.fc2.forward(&x);
        let mut out = residual + drop(&x, c.dropout);
        if !pre {
            out = self.final_layer_norm.forward(&out);
        }
        Ok(if self.encoder_attn.is_none() {
            clamp_fp16(out, pre)
        } else {
            out
        })
    }
}

/// `BartEncoder` / `BartDecoder`: positions, `layernorm_embedding`, the layers, and mBART's
/// final `layer_norm`.
#[derive(Debug)]
struct Stack {
    ctx: Context,
    embed_positions: Embedding,
    layers: Vec<Layer>,
    layernorm_embedding: LayerNorm,
    layer_norm: Option<LayerNorm>,
    layerdrop: f64,
    decoder: bool,
    name: &'static str,
}

impl Stack {
    fn new(p: tchtrain_nn::Path<'_>, c: &BartConfig, decoder: bool) -> Self {
        let name = if decoder {
            "model.decoder"
        } else {
            "model.encoder"
        };
        let n_layers = if decoder {
            c.decoder_layers
        } else {
            c.encoder_layers
        };
        // Created in upstream's registration order.
        let embed_positions = Embedding::new(
            &p / "embed_positions",
            c.max_position_embeddings + 2,
            c.d_model,
            c.init_std,
        )
        .with_class("BartLearnedPositionalEmbedding");
        let layers = (0..n_layers)
            .map(|i| {
                Layer::new(
                    &p / "layers" / i,
                    c,
                    decoder,
                    i,
                    format!("{name}.layers.{i}"),
                )
            })
            .collect();
        let layernorm_embedding = LayerNorm::new(&p / "layernorm_embedding", c.d_model, 1e-5);
        let layer_norm = c
            .mbart
            .then(|| LayerNorm::new(&p / "layer_norm", c.d_model, 1e-5));
        Self {
            ctx: p.ctx().clone(),
            embed_positions,
            layers,
            layernorm_embedding,
            layer_norm,
            layerdrop: if decoder {
                c.decoder_layerdrop
            } else {
                c.encoder_layerdrop
            },
            decoder,
            name,
        }
    }

    /// The stack on its (scaled) token embeddings, positions from `past` on.
    fn forward(&self, embeds: &Tensor, past: i64, s: &StackInputs<'_>) -> Result<Tensor> {
        let (batch, seq) = (embeds.size()[0], embeds.size()[1]);
        let n = |rest: &str| format!("{}.{rest}", self.name);
        let device = embeds.device();
        // `BartLearnedPositionalEmbedding`: positions past..past+seq, offset by 2; the
        // encoder's expanded over the batch, the decoder's one row broadcast in the sum (the
        // gradient then sums over the batch before the lookup's backward, as upstream's).
        let positions = Tensor::arange_start(past, past + seq, (Kind::Int64, device));
        let positions = if self.decoder {
            positions.unsqueeze(0)
        } else {
            positions.expand([batch, seq], false)
        } + 2;
        let positions = self.embed_positions.forward(&positions);
        let h = embeds + positions;
        let h = self.layernorm_embedding.forward(&h);
        let mut h =
            tchtrain_nn::dropout_traced(&self.ctx, &h, s.config.dropout, s.train, || n("dropout"));
        if let Some(u) = &s.unpadded {
            h = u.gather(&h);
        }
        for layer in &self.layers {
            // LayerDrop: one `torch.rand([])` per layer in training.
            if s.train && self.layerdrop > 0.0 {
                let draw = Tensor::rand([], (Kind::Float, Device::Cpu)).double_value(&[]);
                if draw < self.layerdrop {
                    continue;
                }
            }
            h = layer.forward(&h, s)?;
        }
        let h = match &self.layer_norm {
            Some(ln) => ln.forward(&h),
            None => h,
        };
        Ok(padding_free::padded(s.unpadded.as_ref(), h))
    }
}

/// Upstream `BartForConditionalGeneration` / `MBartForConditionalGeneration`: `model`
/// (shared embeddings, encoder, decoder), `lm_head` tied to the embeddings, and the
/// `final_logits_bias` buffer added to the logits.
#[derive(Debug)]
pub struct BartForConditionalGeneration {
    vs: nn::VarStore,
    ctx: Context,
    shared: Embedding,
    encoder: Stack,
    decoder: Stack,
    lm_head: Option<Tensor>,
    final_logits_bias: Tensor,
    act: Activation,
    config: BartConfig,
    training: bool,
    /// `generation_config` (as JSON).
    generation_config: serde_json::Value,
    /// Run the encoder on the real tokens only (see [`TrainableModel::set_padding_free`];
    /// off unless `TCHTRAIN_PADDING_FREE` turns it on).
    padding_free: bool,
}

/// mBART's conditional-generation model: [`BartForConditionalGeneration`] with an mBART
/// config (`BartConfig::mbart()` or an "mbart" checkpoint).
pub type MBartForConditionalGeneration = BartForConditionalGeneration;

impl BartForConditionalGeneration {
    /// A freshly initialised model, seeded by tch's RNG.
    pub fn new(config: &BartConfig, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &BartConfig, device: Device, ctx: &Context) -> Result<Self> {
        Self::build(config, !config.tie_word_embeddings, device, ctx)
    }

    fn build(
        config: &BartConfig,
        untied_head: bool,
        device: Device,
        ctx: &Context,
    ) -> Result<Self> {
        config.validate()?;
        let vs = nn::VarStore::new(device);
        let root = tchtrain_nn::Path::root(&vs, ctx);
        let model = &root / "model";
        let shared = Embedding::with_padding(
            &model / "shared",
            config.vocab_size,
            config.d_model,
            config.init_std,
            config.pad_token_id,
        );
        let encoder = Stack::new(&model / "encoder", config, false);
        let decoder = Stack::new(&model / "decoder", config, true);
        let lm_head = untied_head.then(|| {
            tchtrain_nn::initialization::var(
                &(&root / "lm_head"),
                "weight",
                &[config.vocab_size, config.d_model],
                tchtrain_nn::initialization::normal(config.init_std),
            )
        });
        let final_logits_bias = root.zeros_no_train("final_logits_bias", &[1, config.vocab_size]);
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            shared,
            encoder,
            decoder,
            lm_head,
            final_logits_bias,
            act: Activation::parse(&config.activation_function, "activation_function")?,
            generation_config: crate::generation::generation_fields_of(&config.to_json_value()?),
            config: config.clone(),
            training: false,
            padding_free: crate::modeling_utils::padding_free_from_env(),
        })
    }

    /// Upstream `from_pretrained` on a resolved local folder (a `bart` or `mbart` one). The
    /// head is tied unless the config unties it or the checkpoint holds an `lm_head.weight`
    /// that differs from the embeddings (upstream then warns and leaves them apart).
    pub fn from_pretrained_dir(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let config = BartConfig::from_file(&dir.join(loading::CONFIG_NAME))?;
        let differ =
            loading::checkpoint_tensors_differ(dir, "lm_head.weight", "model.shared.weight")?;
        if differ && config.tie_word_embeddings {
            log::warn!(
                "The tied weights mapping and config for this model specifies to tie model.shared.weight to lm_head.weight, but both are present in the checkpoints with different values, so we will NOT tie them. You should update the config with `tie_word_embeddings=False` to silence this warning."
            );
        }
        let untied = differ || !config.tie_word_embeddings;
        let mut loaded = loading::from_pretrained_with(
            dir,
            "model",
            &[
                "model.encoder.version",
                "model.decoder.version",
                "encoder.version",
                "decoder.version",
            ],
            options,
            |ctx| Self::build(&config, untied, device, ctx),
        )?;
        // `_keys_to_ignore_on_load_missing = ["final_logits_bias"]` (zeros).
        loaded
            .info
            .missing_keys
            .retain(|k| k != "final_logits_bias");
        loaded.model.generation_config =
            crate::generation::model_generation_config(dir, &config.to_json_value()?)?;
        Ok(loaded)
    }

    /// The config.
    pub fn bart_config(&self) -> &BartConfig {
        &self.config
    }

    /// Upstream's scripts' `model.config.decoder_start_token_id = ...` after loading (the
    /// mBART language code when the checkpoint's config has none). The config, and the
    /// `config.json` saved from it, change; the generation config made at load does not:
    /// transformers 5 no longer reads generation settings from a modified model config, so
    /// `generate` keeps starting from the loaded generation config's
    /// `decoder_start_token_id`, else `bos_token_id`.
    pub fn set_decoder_start_token_id(&mut self, id: i64) {
        self.config.decoder_start_token_id = Some(id);
    }

    /// Upstream `prepare_decoder_input_ids_from_labels`: BART's `shift_tokens_right(labels,
    /// pad_token_id, decoder_start_token_id)`, or mBART's (each row's last non-padding token
    /// wrapped to the front).
    pub fn prepare_decoder_input_ids_from_labels(&self, labels: &Tensor) -> Result<Tensor> {
        self.decoder_start_of()?
            .decoder_input_ids(labels)
            .map_err(|e| Error::InvalidInput {
                name: "labels",
                detail: e.to_string(),
            })
    }

    fn decoder_start_of(&self) -> Result<tchtrain_collators::DecoderStart> {
        let pad_token_id = self.config.pad_token_id.ok_or(Error::InvalidConfig {
            field: "pad_token_id",
            value: "null".into(),
            fix: "self.model.config.pad_token_id has to be defined. (upstream's message)",
        })?;
        if self.config.mbart {
            return Ok(tchtrain_collators::DecoderStart::LastToken { pad_token_id });
        }
        let decoder_start_token_id =
            self.config
                .decoder_start_token_id
                .ok_or(Error::InvalidConfig {
                    field: "decoder_start_token_id",
                    value: "null".into(),
                    fix: "set decoder_start_token_id in config.json (BART's is the eos id, 2)",
                })?;
        Ok(tchtrain_collators::DecoderStart::Token {
            decoder_start_token_id,
            pad_token_id,
        })
    }

    fn embed(&self, ids: &Tensor, name: &str) -> Result<Tensor> {
        crate::check_ids(ids, self.config.vocab_size, i64::MAX)?;
        let ids = ids.f_to_device(self.shared.ws.device())?;
        // `BartScaledWordEmbedding`: the lookup times `embed_scale` (1.0 included).
        let e = self.shared.lookup(&ids) * self.config.embed_scale();
        let e = neftune_post_forward_hook(&self.ctx, e, self.training)?;
        self.ctx.leaf(
            || format!("{name}.embed_tokens"),
            "BartScaledWordEmbedding",
            &[("weight", &self.shared.ws)],
            &ids,
            &e,
        );
        Ok(e)
    }

    fn run_encoder(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let embeds = self.embed(input_ids, "model.encoder")?;
        let (batch, seq) = (embeds.size()[0], embeds.size()[1]);
        check_positions(seq, 0, &self.config)?;
        crate::modeling_utils::check_mask_shape(attention_mask, "attention_mask", batch, seq)?;
        let s = StackInputs {
            config: &self.config,
            act: self.act,
            train: self.training,
            mask: attention::attention_mask(attention_mask, batch, seq, false, embeds.device()),
            encoder: None,
            cache: None,
            unpadded: Unpadded::for_forward(
                &self.ctx,
                self.padding_free,
                false,
                attention_mask,
                embeds.device(),
            )?,
        };
        self.encoder.forward(&embeds, 0, &s)
    }
}

fn check_positions(seq: i64, past: i64, c: &BartConfig) -> Result<()> {
    if past + seq > c.max_position_embeddings {
        return Err(Error::InvalidInput {
            name: "input_ids",
            detail: format!(
                "{past} cached and {seq} new tokens exceed the model's {} positions (max_position_embeddings)",
                c.max_position_embeddings
            ),
        });
    }
    Ok(())
}

/// What `print(layer)` shows of a BART-shaped encoder (`decoder` false) or decoder layer of
/// width `d` and feed-forward width `ffn`, with `attention` as its attention modules'
/// text (BART's, mBART's and Whisper's layers).
pub(crate) fn layer_repr(
    class: &str,
    decoder: bool,
    (d, ffn): (i64, i64),
    attention: &ModuleRepr,
    act: &ModuleRepr,
) -> ModuleRepr {
    let ln = || ModuleRepr::layer_norm(d, 1e-5, true, true);
    let layer = ModuleRepr::new(class).child("self_attn", attention.clone());
    let layer = match decoder {
        true => layer
            .child("activation_fn", act.clone())
            .child("self_attn_layer_norm", ln())
            .child("encoder_attn", attention.clone())
            .child("encoder_attn_layer_norm", ln()),
        false => layer
            .child("self_attn_layer_norm", ln())
            .child("activation_fn", act.clone()),
    };
    layer
        .child("fc1", ModuleRepr::linear(d, ffn, true))
        .child("fc2", ModuleRepr::linear(ffn, d, true))
        .child("final_layer_norm", ln())
}

impl BartForConditionalGeneration {
    /// What `print(model)` shows: `model` (`shared`, the encoder and the decoder with their
    /// scaled word and learned position embeddings, layers, `layernorm_embedding`, mBART's
    /// final `layer_norm`) and `lm_head`; the dropouts are functional (no modules).
    fn bart_module_repr(&self) -> Option<ModuleRepr> {
        let c = &self.config;
        let p = if c.mbart { "MBart" } else { "Bart" };
        let d = c.d_model;
        let ln = || ModuleRepr::layer_norm(d, 1e-5, true, true);
        let words = || {
            ModuleRepr::embedding(c.vocab_size, d, c.pad_token_id)
                .renamed(format!("{p}ScaledWordEmbedding"))
        };
        let attention = || {
            ModuleRepr::new(format!("{p}Attention"))
                .child("k_proj", ModuleRepr::linear(d, d, true))
                .child("v_proj", ModuleRepr::linear(d, d, true))
                .child("q_proj", ModuleRepr::linear(d, d, true))
                .child("out_proj", ModuleRepr::linear(d, d, true))
        };
        let act = || ModuleRepr::new(self.act.class_name());
        let stack = |stack: &Stack| {
            let (class, ffn) = match stack.decoder {
                true => ("Decoder", c.decoder_ffn_dim),
                false => ("Encoder", c.encoder_ffn_dim),
            };
            let layer = layer_repr(
                &format!("{p}{class}Layer"),
                stack.decoder,
                (d, ffn),
                &attention(),
                &act(),
            );
            let (positions, width) = stack.embed_positions.ws.size2().ok()?;
            let mut m = ModuleRepr::new(format!("{p}{class}"))
                .child("embed_tokens", words())
                .child(
                    "embed_positions",
                    ModuleRepr::embedding(positions, width, None)
                        .renamed(format!("{p}LearnedPositionalEmbedding")),
                )
                .child(
                    "layers",
                    ModuleRepr::module_list(vec![layer; stack.layers.len()]),
                )
                .child("layernorm_embedding", ln());
            if stack.layer_norm.is_some() {
                m = m.child("layer_norm", ln());
            }
            Some(m)
        };
        Some(
            ModuleRepr::new(self.architecture())
                .child(
                    "model",
                    ModuleRepr::new(format!("{p}Model"))
                        .child("shared", words())
                        .child("encoder", stack(&self.encoder)?)
                        .child("decoder", stack(&self.decoder)?),
                )
                .child("lm_head", ModuleRepr::linear(d, c.vocab_size, false)),
        )
    }
}

impl PreTrainedModel for BartForConditionalGeneration {
    fn architecture(&self) -> &'static str {
        if self.config.mbart {
            "MBartForConditionalGeneration"
        } else {
            "BartForConditionalGeneration"
        }
    }
    fn module_repr(&self) -> Option<ModuleRepr> {
        self.bart_module_repr()
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn generation_config(&self) -> Option<&serde_json::Value> {
        Some(&self.generation_config)
    }
}

impl TrainableModel for BartForConditionalGeneration {
    crate::modeling_utils::model_plumbing!();

    crate::modeling_utils::encoder_decoder_plumbing!();
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "model.shared.weight" || name.ends_with(".embed_positions.weight")
    }
    fn buffer_names(&self) -> Vec<String> {
        vec!["final_logits_bias".into()]
    }
    fn tied_weights(&self) -> Vec<(String, String)> {
        let mut tied = vec![
            (
                "model.encoder.embed_tokens.weight".into(),
                "model.shared.weight".into(),
            ),
            (
                "model.decoder.embed_tokens.weight".into(),
                "model.shared.weight".into(),
            ),
        ];
        if self.lm_head.is_none() {
            tied.push(("lm_head.weight".into(), "model.shared.weight".into()));
        }
        tied
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let device = self.shared.ws.device();
        // Without decoder ids: the labels shifted right, else the inputs (BartModel's
        // denoising default).
        let resolved = crate::modeling_utils::seq2seq_inputs(
            inputs,
            device,
            self.architecture(),
            |ids, mask| self.run_encoder(ids, mask),
            |labels| self.prepare_decoder_input_ids_from_labels(labels),
            true,
        )?;
        let encoder_hidden = &resolved.encoder_hidden;
        let labels = &resolved.labels;
        let (batch, enc_seq) = (encoder_hidden.size()[0], encoder_hidden.size()[1]);
        let embeds = self.embed(&resolved.decoder_input_ids, "model.decoder")?;
        let seq = embeds.size()[1];
        // Upstream drops the cache when labels are given; without one given, the decoder
        // builds its own when the config's `use_cache` says so.
        let use_cache = labels.is_none() && configuration_utils::use_cache(&self.config.extra);
        let own_cache = (inputs.past_key_values.is_none() && use_cache).then(DynamicCache::new);
        let cache = inputs
            .past_key_values
            .filter(|_| labels.is_none())
            .or(own_cache.as_ref());
        let past = cache.map_or(0, DynamicCache::get_seq_length);
        check_positions(seq, past, &self.config)?;
        let s = StackInputs {
            config: &self.config,
            act: self.act,
            train: self.training,
            mask: attention::attention_mask_after(
                inputs.decoder_attention_mask,
                batch,
                seq,
                past,
                device,
            )?,
            encoder: Some((
                encoder_hidden,
                attention::attention_mask(inputs.attention_mask, batch, enc_seq, false, device),
            )),
            cache,
            unpadded: None,
        };
        let h = self.decoder.forward(&embeds, past, &s)?;
        let weight = self.lm_head.as_ref().unwrap_or(&self.shared.ws);
        let logits = h.matmul(&weight.tr());
        self.ctx.leaf(
            || "lm_head".into(),
            "Linear",
            &[("weight", weight)],
            &h,
            &logits,
        );
        let logits = logits + &self.final_logits_bias;
        let loss = match labels {
            Some(labels) => Some(
                logits
                    .f_view([-1, self.config.vocab_size])?
                    .f_cross_entropy_loss::<Tensor>(
                        &labels.f_view([-1])?,
                        None,
                        tch::Reduction::Mean,
                        -100,
                        0.0,
                    )?,
            ),
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
