//! Whisper (upstream `models/whisper/modeling_whisper.py`): `WhisperConfig` and
//! `WhisperForConditionalGeneration`, with upstream's parameter names
//! (`model.encoder.conv1.weight`, `model.decoder.layers.0.encoder_attn.k_proj.weight`, ...).
//!
//! The encoder reads the log-mel `input_features` `[batch, num_mel_bins, 2 *
//! max_source_positions]`: two convolutions with GELU (the second strided by 2), the frozen
//! sinusoidal positions added, pre-norm layers (upstream copies them from mBART, and so do
//! these: [`crate::bart`]'s layers with Whisper's attention, keys without a bias and queries
//! scaled before the product), a final LayerNorm. The decoder: token embeddings (unscaled)
//! plus learned positions indexed by position (upstream's `weight[position_ids]`, whose
//! backward accumulates over the batch as `index` does), pre-norm layers with cross-attention
//! over the whole encoder output (no encoder mask: Whisper's input is always 30 s), a final
//! LayerNorm, and `proj_out` tied to the token embeddings.
//!
//! SpecAugment (`apply_spec_augment` with masking probabilities in training) draws its masks
//! with numpy's generator upstream: refused here rather than drawn differently.

// `h = h + x` on purpose: tch's `+=` works in place and would modify tensors autograd
// saved for backward.
#![allow(clippy::assign_op_pattern)]

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::attention;
use crate::bart::{BartConfig, Layer, StackInputs};
use crate::configuration_utils::{self, LabelConfig, PretrainedConfig};
use crate::loading::{self, LoadOptions};
use crate::modeling_utils::{Loaded, ModelInputs, ModelOutput, PreTrainedModel, TrainableModel};
use crate::{DynamicCache, Error, Result};
use tchtrain_nn::neftune_post_forward_hook;
use tchtrain_nn::{Activation, Context, Embedding, LayerNorm, ModuleRepr};

/// Upstream `WhisperConfig` with its defaults (whisper-tiny's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct WhisperConfig {
    pub vocab_size: i64,
    pub num_mel_bins: i64,
    pub encoder_layers: i64,
    pub encoder_attention_heads: i64,
    pub decoder_layers: i64,
    pub decoder_attention_heads: i64,
    pub decoder_ffn_dim: i64,
    pub encoder_ffn_dim: i64,
    pub encoder_layerdrop: f64,
    pub decoder_layerdrop: f64,
    pub decoder_start_token_id: Option<i64>,
    pub is_encoder_decoder: bool,
    pub activation_function: String,
    pub d_model: i64,
    pub dropout: f64,
    pub attention_dropout: f64,
    pub activation_dropout: f64,
    pub init_std: f64,
    /// Read by neither stack upstream (its `embed_scale` is never applied).
    pub scale_embedding: bool,
    pub max_source_positions: i64,
    pub max_target_positions: i64,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
    /// An id or a list of ids.
    pub eos_token_id: Option<serde_json::Value>,
    pub suppress_tokens: Option<serde_json::Value>,
    pub begin_suppress_tokens: Option<serde_json::Value>,
    /// `WhisperForAudioClassification`'s (not built here).
    pub use_weighted_layer_sum: bool,
    /// `WhisperForAudioClassification`'s (not built here).
    pub classifier_proj_size: i64,
    pub apply_spec_augment: bool,
    pub mask_time_prob: f64,
    pub mask_time_length: i64,
    pub mask_time_min_masks: i64,
    pub mask_feature_prob: f64,
    pub mask_feature_length: i64,
    pub mask_feature_min_masks: i64,
    pub median_filter_width: i64,
    pub tie_word_embeddings: bool,
    #[serde(flatten)]
    pub labels: LabelConfig,
    /// Keys this crate does not interpret, kept so config.json round-trips.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for WhisperConfig {
    fn default() -> Self {
        Self {
            vocab_size: 51865,
            num_mel_bins: 80,
            encoder_layers: 4,
            encoder_attention_heads: 6,
            decoder_layers: 4,
            decoder_attention_heads: 6,
            decoder_ffn_dim: 1536,
            encoder_ffn_dim: 1536,
            encoder_layerdrop: 0.0,
            decoder_layerdrop: 0.0,
            decoder_start_token_id: Some(50257),
            is_encoder_decoder: true,
            activation_function: "gelu".into(),
            d_model: 384,
            dropout: 0.0,
            attention_dropout: 0.0,
            activation_dropout: 0.0,
            init_std: 0.02,
            scale_embedding: false,
            max_source_positions: 1500,
            max_target_positions: 448,
            pad_token_id: Some(50256),
            bos_token_id: Some(50256),
            eos_token_id: Some(50256.into()),
            suppress_tokens: None,
            begin_suppress_tokens: Some(serde_json::json!([220, 50256])),
            use_weighted_layer_sum: false,
            classifier_proj_size: 256,
            apply_spec_augment: false,
            mask_time_prob: 0.05,
            mask_time_length: 10,
            mask_time_min_masks: 2,
            mask_feature_prob: 0.0,
            mask_feature_length: 10,
            mask_feature_min_masks: 0,
            median_filter_width: 7,
            tie_word_embeddings: true,
            labels: LabelConfig::default(),
            extra: Default::default(),
        }
    }
}

impl PretrainedConfig for WhisperConfig {
    fn model_type(&self) -> &'static str {
        "whisper"
    }
    fn to_json_value(&self) -> Result<serde_json::Value> {
        configuration_utils::to_value(self)
    }
    fn labels(&self) -> &LabelConfig {
        &self.labels
    }
}

impl WhisperConfig {
    /// Reads `config.json` (`model_type` "whisper").
    pub fn from_file(path: &Path) -> Result<Self> {
        let model_type = configuration_utils::read_model_type(path)?;
        if model_type != "whisper" {
            return Err(Error::InvalidConfig {
                field: "model_type",
                value: model_type,
                fix: "WhisperConfig reads whisper checkpoints",
            });
        }
        let c: Self = configuration_utils::read_config(path)?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        configuration_utils::check_sizes(
            &[
                ("vocab_size", self.vocab_size),
                ("num_mel_bins", self.num_mel_bins),
                ("max_source_positions", self.max_source_positions),
                ("max_target_positions", self.max_target_positions),
                ("d_model", self.d_model),
                ("encoder_ffn_dim", self.encoder_ffn_dim),
                ("decoder_ffn_dim", self.decoder_ffn_dim),
                ("decoder_layers", self.decoder_layers),
            ],
            ("encoder_layers", self.encoder_layers),
        )?;
        if self.d_model % 2 != 0 {
            return Err(Error::InvalidConfig {
                field: "d_model",
                value: self.d_model.to_string(),
                fix: "Number of channels has to be divisible by 2 for sinusoidal positional embeddings (upstream's message)",
            });
        }
        self.layers_config().validate_layers()?;
        configuration_utils::check_padding_idx(self.pad_token_id, self.vocab_size)?;
        Ok(())
    }

    /// The settings of the layers (upstream's layers are mBART's with Whisper's attention).
    fn layers_config(&self) -> BartConfig {
        BartConfig {
            vocab_size: self.vocab_size,
            max_position_embeddings: self.max_target_positions,
            encoder_layers: self.encoder_layers,
            encoder_ffn_dim: self.encoder_ffn_dim,
            encoder_attention_heads: self.encoder_attention_heads,
            decoder_layers: self.decoder_layers,
            decoder_ffn_dim: self.decoder_ffn_dim,
            decoder_attention_heads: self.decoder_attention_heads,
            encoder_layerdrop: self.encoder_layerdrop,
            decoder_layerdrop: self.decoder_layerdrop,
            activation_function: self.activation_function.clone(),
            d_model: self.d_model,
            dropout: self.dropout,
            attention_dropout: self.attention_dropout,
            activation_dropout: self.activation_dropout,
            init_std: self.init_std,
            pad_token_id: self.pad_token_id,
            mbart: true,
            whisper: true,
            ..BartConfig::default()
        }
    }

    /// The mel frames the encoder takes: `max_source_positions` times the two convolutions'
    /// strides (1 and 2).
    pub fn expected_seq_length(&self) -> i64 {
        self.max_source_positions * 2
    }
}

/// Upstream `sinusoids(length, channels)`: `[sin | cos]` of `position * exp(-log(10000) /
/// (channels / 2 - 1) * i)`, computed as upstream's float32 ops.
pub fn sinusoids(length: i64, channels: i64) -> Tensor {
    let half = channels / 2;
    let increment = (10000f64).ln() / (half - 1) as f64;
    let inv_timescales = (Tensor::arange(half, (Kind::Int64, Device::Cpu)) * -increment).exp();
    let scaled_time = Tensor::arange(length, (Kind::Int64, Device::Cpu)).view([-1, 1])
        * inv_timescales.view([1, -1]);
    Tensor::cat(&[scaled_time.sin(), scaled_time.cos()], 1)
}

/// A convolution's `weight` and `bias`.
#[derive(Debug)]
struct Conv1d {
    weight: Tensor,
    bias: Tensor,
    stride: i64,
    name: String,
}

impl Conv1d {
    /// Upstream `nn.Conv1d(in, out, kernel_size=3, stride, padding=1)`, initialised as
    /// `_init_weights` does (normal weights, zero bias).
    fn new(p: tchtrain_nn::Path<'_>, in_ch: i64, out_ch: i64, stride: i64, std: f64) -> Self {
        let weight = tchtrain_nn::initialization::var(
            &p,
            "weight",
            &[out_ch, in_ch, 3],
            tchtrain_nn::initialization::normal(std),
        );
        let bias =
            tchtrain_nn::initialization::var(&p, "bias", &[out_ch], tch::nn::Init::Const(0.0));
        Self {
            weight,
            bias,
            stride,
            name: p.name(),
        }
    }

    fn forward(&self, ctx: &Context, x: &Tensor) -> Result<Tensor> {
        let y = x.f_conv1d(&self.weight, Some(&self.bias), [self.stride], [1], [1], 1)?;
        ctx.leaf(
            || self.name.clone(),
            "Conv1d",
            &[("weight", &self.weight), ("bias", &self.bias)],
            x,
            &y,
        );
        Ok(y)
    }
}

/// `WhisperEncoder`: the convolutions, the frozen positions, the layers, `layer_norm`.
#[derive(Debug)]
struct Encoder {
    conv1: Conv1d,
    conv2: Conv1d,
    embed_positions: Tensor,
    layers: Vec<Layer>,
    layer_norm: LayerNorm,
}

/// `WhisperDecoder`: the learned positions, the layers, `layer_norm` (the token embeddings
/// live on the model, shared with `proj_out`).
#[derive(Debug)]
struct Decoder {
    embed_positions: Tensor,
    layers: Vec<Layer>,
    layer_norm: LayerNorm,
}

fn layers(p: &tchtrain_nn::Path<'_>, c: &BartConfig, decoder: bool, name: &str) -> Vec<Layer> {
    let n = if decoder {
        c.decoder_layers
    } else {
        c.encoder_layers
    };
    (0..n)
        .map(|i| {
            Layer::new(
                p / "layers" / i,
                c,
                decoder,
                i,
                format!("{name}.layers.{i}"),
            )
        })
        .collect()
}

/// The layers of a stack with upstream's LayerDrop (one `torch.rand([])` per layer in
/// training).
fn run_layers(layers: &[Layer], layerdrop: f64, h: Tensor, s: &StackInputs<'_>) -> Result<Tensor> {
    let mut h = h;
    for layer in layers {
        if s.train && layerdrop > 0.0 {
            let draw = Tensor::rand([], (Kind::Float, Device::Cpu)).double_value(&[]);
            if draw < layerdrop {
                continue;
            }
        }
        h = layer.forward(&h, s)?;
    }
    Ok(h)
}

/// Upstream `WhisperForConditionalGeneration`: `model` (encoder, decoder) and `proj_out`
/// tied to `model.decoder.embed_tokens`.
#[derive(Debug)]
pub struct WhisperForConditionalGeneration {
    vs: nn::VarStore,
    ctx: Context,
    embed_tokens: Embedding,
    encoder: Encoder,
    decoder: Decoder,
    proj_out: Option<Tensor>,
    act: Activation,
    config: WhisperConfig,
    layers_config: BartConfig,
    training: bool,
    /// `generation_config` (as JSON).
    generation_config: serde_json::Value,
}

impl WhisperForConditionalGeneration {
    /// A freshly initialised model, seeded by tch's RNG.
    pub fn new(config: &WhisperConfig, device: Device) -> Result<Self> {
        Self::build(
            config,
            !config.tie_word_embeddings,
            true,
            device,
            &Context::new(),
        )
    }

    fn build(
        config: &WhisperConfig,
        untied_head: bool,
        frozen_positions: bool,
        device: Device,
        ctx: &Context,
    ) -> Result<Self> {
        config.validate()?;
        let lc = config.layers_config();
        let vs = nn::VarStore::new(device);
        let root = tchtrain_nn::Path::root(&vs, ctx);
        let model = &root / "model";
        let (d, std) = (config.d_model, config.init_std);
        // Created in upstream's registration order.
        let e = &model / "encoder";
        let conv1 = Conv1d::new(&e / "conv1", config.num_mel_bins, d, 1, std);
        let conv2 = Conv1d::new(&e / "conv2", d, d, 2, std);
        // `embed_positions.requires_grad_(False)` in a model built from a config; loading
        // (`from_pretrained`) replaces the parameter and it trains again, as upstream's.
        let embed_positions = if frozen_positions {
            (&e / "embed_positions").zeros_no_train("weight", &[config.max_source_positions, d])
        } else {
            (&e / "embed_positions").zeros("weight", &[config.max_source_positions, d])
        };
        tch::no_grad(|| {
            let mut t = embed_positions.shallow_clone();
            t.copy_(&sinusoids(config.max_source_positions, d).to_device(device));
        });
        let encoder = Encoder {
            conv1,
            conv2,
            embed_positions,
            layers: layers(&e, &lc, false, "model.encoder"),
            layer_norm: LayerNorm::new(&e / "layer_norm", d, 1e-5),
        };
        let dp = &model / "decoder";
        let embed_tokens = Embedding::with_padding(
            &dp / "embed_tokens",
            config.vocab_size,
            d,
            std,
            config.pad_token_id,
        );
        let decoder = Decoder {
            embed_positions: tchtrain_nn::initialization::var(
                &(&dp / "embed_positions"),
                "weight",
                &[config.max_target_positions, d],
                tchtrain_nn::initialization::normal(std),
            ),
            layers: layers(&dp, &lc, true, "model.decoder"),
            layer_norm: LayerNorm::new(&dp / "layer_norm", d, 1e-5),
        };
        let proj_out = untied_head.then(|| {
            tchtrain_nn::initialization::var(
                &(&root / "proj_out"),
                "weight",
                &[config.vocab_size, d],
                tchtrain_nn::initialization::normal(std),
            )
        });
        Ok(Self {
            vs,
            ctx: ctx.clone(),
            embed_tokens,
            encoder,
            decoder,
            proj_out,
            act: Activation::parse(&config.activation_function, "activation_function")?,
            generation_config: crate::generation::generation_fields_of(&config.to_json_value()?),
            layers_config: lc,
            config: config.clone(),
            training: false,
        })
    }

    /// Upstream `from_pretrained` on a resolved local folder. The head is tied unless the
    /// config unties it or the checkpoint holds a `proj_out.weight` that differs from the
    /// embeddings. The encoder's sinusoidal positions come back trainable, as transformers
    /// 5.23's loading leaves them (its loaded parameters require gradients again).
    pub fn from_pretrained_dir(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let config = WhisperConfig::from_file(&dir.join(loading::CONFIG_NAME))?;
        let differ = loading::checkpoint_tensors_differ(
            dir,
            "proj_out.weight",
            "model.decoder.embed_tokens.weight",
        )?;
        let untied = differ || !config.tie_word_embeddings;
        let mut loaded = loading::from_pretrained_with(dir, "model", &[], options, |ctx| {
            Self::build(&config, untied, false, device, ctx)
        })?;
        loaded.model.generation_config =
            crate::generation::model_generation_config(dir, &config.to_json_value()?)?;
        Ok(loaded)
    }

    /// The config.
    pub fn whisper_config(&self) -> &WhisperConfig {
        &self.config
    }

    /// The config, to change as upstream's scripts do before training (`config.update(...)`;
    /// the layers read their settings when built, so only the fields read at run time take
    /// effect: `apply_spec_augment`, `use_cache`, `suppress_tokens`, `forced_decoder_ids`).
    pub fn whisper_config_mut(&mut self) -> &mut WhisperConfig {
        &mut self.config
    }

    /// The generation configuration (as JSON), to change as upstream's
    /// `model.generation_config.language = ...`; `save_pretrained` writes it.
    pub fn generation_config_mut(&mut self) -> &mut serde_json::Value {
        &mut self.generation_config
    }

    /// Upstream `config.save_pretrained(dir)`: `config.json` alone.
    pub fn save_config(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        loading::write_config(self, dir, self.embed_tokens.ws.kind())
    }

    /// Upstream `freeze_encoder`: the encoder's parameters stop requiring gradients (the
    /// optimizer then leaves them out, as upstream's Trainer does).
    pub fn freeze_encoder(&mut self) {
        for (name, t) in self.vs.variables() {
            if name.starts_with("model.encoder.") {
                let _ = t.set_requires_grad(false);
            }
        }
    }

    fn decoder_start_of(&self) -> Result<tchtrain_collators::DecoderStart> {
        let pad_token_id = self.config.pad_token_id.ok_or(Error::InvalidConfig {
            field: "pad_token_id",
            value: "null".into(),
            fix: "self.model.config.pad_token_id has to be defined. (upstream's message)",
        })?;
        let decoder_start_token_id =
            self.config
                .decoder_start_token_id
                .ok_or(Error::InvalidConfig {
                    field: "decoder_start_token_id",
                    value: "null".into(),
                    fix: "set decoder_start_token_id in config.json (Whisper's is <|startoftranscript|>, 50257 / 50258)",
                })?;
        Ok(tchtrain_collators::DecoderStart::Token {
            decoder_start_token_id,
            pad_token_id,
        })
    }

    /// Upstream `WhisperEncoder.forward` on `input_features` `[batch, num_mel_bins,
    /// 2 * max_source_positions]`: its last hidden state.
    pub fn run_encoder(&self, input_features: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let size = input_features.size();
        let expected = c.expected_seq_length();
        if size.len() != 3 || size[1] != c.num_mel_bins {
            return Err(Error::InvalidInput {
                name: "input_features",
                detail: format!(
                    "shape {size:?}: expected [batch, num_mel_bins = {}, {expected}]",
                    c.num_mel_bins
                ),
            });
        }
        if size[2] != expected {
            return Err(Error::InvalidInput {
                name: "input_features",
                detail: format!(
                    "Whisper expects the mel input features to be of length {expected}, but found {}. Make sure to pad the input mel features to {expected}. (upstream's message)",
                    size[2]
                ),
            });
        }
        if self.training
            && c.apply_spec_augment
            && (c.mask_time_prob > 0.0 || c.mask_feature_prob > 0.0)
        {
            return Err(Error::InvalidArgument {
                field: "apply_spec_augment",
                detail: "SpecAugment's masks are drawn with numpy's generator upstream and are not reproduced here; set apply_spec_augment to false (or mask_time_prob and mask_feature_prob to 0)".into(),
            });
        }
        let device = self.encoder.conv1.weight.device();
        let x = input_features.f_to_device(device)?;
        let x = self.encoder.conv1.forward(&self.ctx, &x)?.f_gelu("none")?;
        let x = self.encoder.conv2.forward(&self.ctx, &x)?.f_gelu("none")?;
        let h = x.f_permute([0, 2, 1])? + &self.encoder.embed_positions;
        let h = tchtrain_nn::dropout_traced(&self.ctx, &h, c.dropout, self.training, || {
            "model.encoder.dropout".into()
        });
        let (batch, seq) = (h.size()[0], h.size()[1]);
        let s = StackInputs {
            config: &self.layers_config,
            act: self.act,
            train: self.training,
            mask: attention::attention_mask(None, batch, seq, false, device),
            encoder: None,
            cache: None,
            unpadded: None,
        };
        let h = run_layers(&self.encoder.layers, c.encoder_layerdrop, h, &s)?;
        Ok(self.encoder.layer_norm.forward(&h))
    }

    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        crate::check_ids(ids, self.config.vocab_size, i64::MAX)?;
        let ids = ids.f_to_device(self.embed_tokens.ws.device())?;
        let e = self.embed_tokens.lookup(&ids);
        let e = neftune_post_forward_hook(&self.ctx, e, self.training)?;
        self.ctx.leaf(
            || "model.decoder.embed_tokens".into(),
            "Embedding",
            &[("weight", &self.embed_tokens.ws)],
            &ids,
            &e,
        );
        Ok(e)
    }
}

impl WhisperForConditionalGeneration {
    /// What `print(model)` shows: the encoder (two `Conv1d`s, the sinusoidal positions as an
    /// `Embedding`), the decoder (`WhisperPositionalEmbedding`), BART's layers with
    /// `k_proj` unbiased, `proj_out`.
    fn whisper_module_repr(&self) -> ModuleRepr {
        let c = &self.config;
        let d = c.d_model;
        let ln = || ModuleRepr::layer_norm(d, 1e-5, true, true);
        let attention = || {
            ModuleRepr::new("WhisperAttention")
                .child("k_proj", ModuleRepr::linear(d, d, false))
                .child("v_proj", ModuleRepr::linear(d, d, true))
                .child("q_proj", ModuleRepr::linear(d, d, true))
                .child("out_proj", ModuleRepr::linear(d, d, true))
        };
        let act = ModuleRepr::new(self.act.class_name());
        let layer = |decoder: bool| {
            let (class, ffn) = match decoder {
                true => ("WhisperDecoderLayer", c.decoder_ffn_dim),
                false => ("WhisperEncoderLayer", c.encoder_ffn_dim),
            };
            crate::bart::layer_repr(class, decoder, (d, ffn), &attention(), &act)
        };
        let conv = |i: i64, o: i64, stride: i64| {
            ModuleRepr::with_extra(
                "Conv1d",
                format!("{i}, {o}, kernel_size=(3,), stride=({stride},), padding=(1,)"),
            )
        };
        let encoder = ModuleRepr::new("WhisperEncoder")
            .child("conv1", conv(c.num_mel_bins, d, 1))
            .child("conv2", conv(d, d, 2))
            .child(
                "embed_positions",
                ModuleRepr::embedding(c.max_source_positions, d, None),
            )
            .child(
                "layers",
                ModuleRepr::module_list(vec![layer(false); self.encoder.layers.len()]),
            )
            .child("layer_norm", ln());
        let decoder = ModuleRepr::new("WhisperDecoder")
            .child(
                "embed_tokens",
                ModuleRepr::embedding(c.vocab_size, d, c.pad_token_id),
            )
            .child(
                "embed_positions",
                ModuleRepr::embedding(c.max_target_positions, d, None)
                    .renamed("WhisperPositionalEmbedding"),
            )
            .child(
                "layers",
                ModuleRepr::module_list(vec![layer(true); self.decoder.layers.len()]),
            )
            .child("layer_norm", ln());
        ModuleRepr::new("WhisperForConditionalGeneration")
            .child(
                "model",
                ModuleRepr::new("WhisperModel")
                    .child("encoder", encoder)
                    .child("decoder", decoder),
            )
            .child("proj_out", ModuleRepr::linear(d, c.vocab_size, false))
    }
}

impl PreTrainedModel for WhisperForConditionalGeneration {
    fn architecture(&self) -> &'static str {
        "WhisperForConditionalGeneration"
    }
    fn module_repr(&self) -> Option<ModuleRepr> {
        Some(self.whisper_module_repr())
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn generation_config(&self) -> Option<&serde_json::Value> {
        Some(&self.generation_config)
    }
}

impl TrainableModel for WhisperForConditionalGeneration {
    crate::modeling_utils::model_plumbing!();

    fn activation_checkpointing_enable(
        &mut self,
        settings: crate::ActivationCheckpointing,
    ) -> Result<()> {
        let _ = settings;
        Err(Error::InvalidArgument {
            field: "activation_checkpointing",
            detail: "WhisperForConditionalGeneration: activation checkpointing of its blocks is not implemented here yet (upstream supports it); train without --gradient_checkpointing".into(),
        })
    }
    fn supports_cache(&self) -> bool {
        true
    }
    fn is_encoder_decoder(&self) -> bool {
        true
    }
    fn decoder_start(&self) -> Result<Option<tchtrain_collators::DecoderStart>> {
        self.decoder_start_of().map(Some)
    }
    fn encode(&self, input_features: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        // Upstream: "Whisper does not support masking of the `input_features`".
        let _ = attention_mask;
        self.run_encoder(input_features)
    }
    fn output_embeddings(&self) -> Option<String> {
        Some("proj_out".into())
    }
    fn own_generate(
        &self,
        inputs: &ModelInputs<'_>,
        config: &crate::GenerationConfig,
    ) -> Option<Result<Tensor>> {
        Some(match inputs.input_features {
            Some(features) => crate::whisper_generate(self, &self.config, features, config),
            None => Err(Error::MissingInput {
                name: "input_features",
            }),
        })
    }
    fn main_input_name(&self) -> &'static str {
        "input_features"
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        name == "model.decoder.embed_tokens.weight" || name.ends_with(".embed_positions.weight")
    }
    fn tied_weights(&self) -> Vec<(String, String)> {
        if self.proj_out.is_none() {
            vec![(
                "proj_out.weight".into(),
                "model.decoder.embed_tokens.weight".into(),
            )]
        } else {
            Vec::new()
        }
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let c = &self.config;
        let device = self.embed_tokens.ws.device();
        if inputs.logits_to_keep.is_some_and(|n| n > 0) {
            return Err(Error::InvalidArgument {
                field: "logits_to_keep",
                detail: "WhisperForConditionalGeneration's forward takes no logits_to_keep (upstream's neither); leave it unset".into(),
            });
        }
        if let Some(labels) = inputs.labels
            && labels
                .size()
                .get(1)
                .is_some_and(|&n| n > c.max_target_positions)
        {
            return Err(Error::InvalidInput {
                name: "labels",
                detail: format!(
                    "Labels' sequence length {} cannot exceed the maximum allowed length of {} tokens. (upstream's message)",
                    labels.size()[1],
                    c.max_target_positions
                ),
            });
        }
        let encoder_hidden = match inputs.encoder_outputs {
            Some(h) => h.f_to_device(device)?,
            None => {
                let features = inputs.input_features.ok_or(Error::MissingInput {
                    name: "input_features",
                })?;
                self.run_encoder(features)?
            }
        };
        let labels = inputs.labels.map(|l| l.f_to_device(device)).transpose()?;
        let decoder_input_ids =
            match (inputs.decoder_input_ids, &labels) {
                (Some(d), _) => d.f_to_device(device)?,
                (None, Some(l)) => self.decoder_start_of()?.decoder_input_ids(l).map_err(|e| {
                    Error::InvalidInput {
                        name: "labels",
                        detail: e.to_string(),
                    }
                })?,
                (None, None) => {
                    return Err(Error::MissingInput {
                        name: "decoder_input_ids",
                    });
                }
            };
        let batch = encoder_hidden.size()[0];
        if decoder_input_ids.dim() != 2 || decoder_input_ids.size()[0] != batch {
            return Err(Error::InvalidInput {
                name: "decoder_input_ids",
                detail: format!(
                    "shape {:?}: expected [batch, target_len] with the encoder's batch of {batch}",
                    decoder_input_ids.size()
                ),
            });
        }
        let embeds = self.embed(&decoder_input_ids)?;
        let seq = embeds.size()[1];
        // Upstream builds a cache when `use_cache` (the config's, default true) and no
        // labels ask otherwise; the given one is used when there is one.
        let use_cache = labels.is_none() && configuration_utils::use_cache(&c.extra);
        let own_cache = (inputs.past_key_values.is_none() && use_cache).then(DynamicCache::new);
        let cache = inputs.past_key_values.or(own_cache.as_ref());
        let past = cache.map_or(0, DynamicCache::get_seq_length);
        if past + seq > c.max_target_positions {
            return Err(Error::InvalidInput {
                name: "decoder_input_ids",
                detail: format!(
                    "{past} cached and {seq} new tokens exceed the decoder's {} positions (max_target_positions)",
                    c.max_target_positions
                ),
            });
        }
        // `WhisperPositionalEmbedding`: `weight[position_ids]`, positions past..past+seq
        // repeated over the batch.
        let position_ids = Tensor::arange_start(past, past + seq, (Kind::Int64, device))
            .unsqueeze(0)
            .repeat([batch, 1]);
        let positions = self
            .decoder
            .embed_positions
            .f_index(&[Some(position_ids)])?;
        let h = embeds + positions;
        let h = tchtrain_nn::dropout_traced(&self.ctx, &h, c.dropout, self.training, || {
            "model.decoder.dropout".into()
        });
        let enc_seq = encoder_hidden.size()[1];
        let s = StackInputs {
            config: &self.layers_config,
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
                &encoder_hidden,
                attention::attention_mask(None, batch, enc_seq, false, device),
            )),
            cache,
            unpadded: None,
        };
        let h = run_layers(&self.decoder.layers, c.decoder_layerdrop, h, &s)?;
        let h = self.decoder.layer_norm.forward(&h);
        let weight = self.proj_out.as_ref().unwrap_or(&self.embed_tokens.ws);
        let logits = h.matmul(&weight.tr());
        self.ctx.leaf(
            || "proj_out".into(),
            "Linear",
            &[("weight", weight)],
            &h,
            &logits,
        );
        let loss = match &labels {
            Some(labels) => Some(
                logits
                    .f_view([-1, c.vocab_size])?
                    .f_cross_entropy_loss::<Tensor>(
                        &labels.f_reshape([-1])?,
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
