//! Building blocks with upstream's parameter names and `_init_weights` initialisation:
//! Linear, GPT-2's Conv1D (`[in, out]` weights), LayerNorm, RMSNorm, Embedding, and the
//! activation functions of upstream's `ACT2FN`.

use tch::nn::{self, Init, Module};
use tch::{Kind, Tensor};

use crate::{Error, Result, initialization};

/// Upstream `_init_weights` for Linear / Conv1D / Embedding: `normal(0, initializer_range)`.
pub(crate) fn normal(std: f64) -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: std,
    }
}

/// `nn.Linear(in, out, bias)` initialised as upstream (normal weights, zero bias). The
/// weight is created before the bias, as torch registers them (tch's `nn::linear` creates
/// the bias first): `model.parameters()` follows this order, and gradient clipping sums the
/// per-parameter norms in it.
pub(crate) fn linear(
    p: nn::Path<'_>,
    in_dim: i64,
    out_dim: i64,
    bias: bool,
    std: f64,
) -> nn::Linear {
    let ws = initialization::var(&p, "weight", &[out_dim, in_dim], normal(std));
    let bs = bias.then(|| initialization::var(&p, "bias", &[out_dim], Init::Const(0.0)));
    nn::Linear { ws, bs }
}

/// A linear layer inside a transformer layer: [`linear`]'s `nn::Linear`, computed by
/// [`crate::layer_hooks::linear`] so that under hooks that release the layer's parameters
/// between its forward and its backward (ZeRO-3) autograd saves the weight itself.
#[derive(Debug)]
pub(crate) struct LayerLinear(pub(crate) nn::Linear);

impl nn::Module for LayerLinear {
    fn forward(&self, xs: &Tensor) -> Tensor {
        crate::layer_hooks::linear(xs, &self.0)
    }
}

/// [`linear`] for a layer inside a transformer layer.
pub(crate) fn layer_linear(
    p: nn::Path<'_>,
    in_dim: i64,
    out_dim: i64,
    bias: bool,
    std: f64,
) -> LayerLinear {
    LayerLinear(linear(p, in_dim, out_dim, bias, std))
}

/// `nn.LayerNorm(dim, eps)`: weight ones, bias zeros.
pub(crate) fn layer_norm(p: nn::Path<'_>, dim: i64, eps: f64) -> nn::LayerNorm {
    nn::layer_norm(
        p,
        vec![dim],
        nn::LayerNormConfig {
            eps,
            ..Default::default()
        },
    )
}

/// `nn.Embedding(n, dim)` initialised as upstream.
pub(crate) fn embedding(p: nn::Path<'_>, n: i64, dim: i64, std: f64) -> nn::Embedding {
    embedding_with_padding(p, n, dim, std, None)
}

/// `nn.Embedding(n, dim, padding_idx)`: the padding row gets no gradient, and
/// `_init_weights` zeroes it after the normal draw. The caller's config validation refuses
/// a `padding_idx` outside the vocabulary, as upstream's `nn.Embedding` asserts.
pub(crate) fn embedding_with_padding(
    p: nn::Path<'_>,
    n: i64,
    dim: i64,
    std: f64,
    padding_idx: Option<i64>,
) -> nn::Embedding {
    let padding_idx = padding_idx.map(|i| if i < 0 { i + n } else { i });
    let ws_init = initialization::init_zero_row(&p, "weight", normal(std), padding_idx);
    let deferred = initialization::is_deferred();
    let e = nn::embedding(
        p,
        n,
        dim,
        nn::EmbeddingConfig {
            ws_init,
            padding_idx: padding_idx.unwrap_or(-1),
            ..Default::default()
        },
    );
    if let Some(row) = padding_idx.filter(|_| !deferred) {
        tch::no_grad(|| {
            let _ = e.ws.select(0, row).zero_();
        });
    }
    e
}

/// GPT-2's `Conv1D`: a linear layer whose weight is stored transposed, `[in, out]`.
#[derive(Debug)]
pub(crate) struct Conv1D {
    weight: Tensor,
    bias: Tensor,
}

impl Conv1D {
    pub(crate) fn new(p: nn::Path<'_>, out_dim: i64, in_dim: i64, std: f64) -> Self {
        Self {
            weight: initialization::var(&p, "weight", &[in_dim, out_dim], normal(std)),
            bias: initialization::var(&p, "bias", &[out_dim], Init::Const(0.0)),
        }
    }
}

impl Module for Conv1D {
    /// `torch.addmm(bias, x.view(-1, in), weight).view(..., out)`, as upstream.
    fn forward(&self, x: &Tensor) -> Tensor {
        let mut shape = x.size();
        let in_dim = *shape
            .last()
            .expect("Conv1D input has at least one dimension");
        let out = self.bias.addmm(&x.reshape([-1, in_dim]), &self.weight);
        *shape.last_mut().expect("non-empty shape") = self.weight.size()[1];
        out.reshape(shape)
    }
}

/// Llama's `RMSNorm`: computed in float32, scaled by `weight` in the input dtype; or
/// Gemma's: scaled by `1 + weight` in float32, then cast (weights initialised to zeros).
#[derive(Debug)]
pub(crate) struct RmsNorm {
    weight: Tensor,
    eps: f64,
    /// Gemma's `(1 + weight)` in float32.
    gemma: bool,
}

impl RmsNorm {
    pub(crate) fn new(p: nn::Path<'_>, dim: i64, eps: f64) -> Self {
        Self {
            weight: initialization::var(&p, "weight", &[dim], Init::Const(1.0)),
            eps,
            gemma: false,
        }
    }

    /// Upstream `GemmaRMSNorm` (Gemma 1–3).
    pub(crate) fn gemma(p: nn::Path<'_>, dim: i64, eps: f64) -> Self {
        Self {
            weight: initialization::var(&p, "weight", &[dim], Init::Const(0.0)),
            eps,
            gemma: true,
        }
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let h = x.to_kind(Kind::Float);
        let variance = h.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let h = h * (variance + self.eps).rsqrt();
        if self.gemma {
            (h * (self.weight.to_kind(Kind::Float) + 1.0)).to_kind(kind)
        } else {
            &self.weight * h.to_kind(kind)
        }
    }
}

/// Upstream `ACT2FN` entries used by the supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// `gelu`: exact (erf) GELU.
    Gelu,
    /// `gelu_new`: the tanh formula written out, as upstream's `NewGELUActivation`.
    GeluNew,
    /// `gelu_pytorch_tanh`: libtorch's tanh approximation.
    GeluPytorchTanh,
    /// `relu`.
    Relu,
    /// `silu` (upstream's `SiLUActivation`).
    Silu,
    /// `swish` (upstream's `nn.SiLU`): the same function as `silu`.
    Swish,
    /// `tanh`.
    Tanh,
}

impl Activation {
    /// Parses an upstream activation name; `field` names the config key for the error.
    pub(crate) fn parse(name: &str, field: &'static str) -> Result<Self> {
        Ok(match name {
            "gelu" => Self::Gelu,
            "gelu_new" => Self::GeluNew,
            "gelu_pytorch_tanh" => Self::GeluPytorchTanh,
            "relu" => Self::Relu,
            "silu" => Self::Silu,
            "swish" => Self::Swish,
            "tanh" => Self::Tanh,
            other => {
                return Err(Error::InvalidConfig {
                    field,
                    value: other.to_string(),
                    fix: "supported activations: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish, tanh",
                });
            }
        })
    }

    /// The class `ACT2FN` instantiates for it (what the underflow / overflow tracer names).
    pub(crate) fn class_name(self) -> &'static str {
        match self {
            Self::Gelu => "GELUActivation",
            Self::GeluNew => "NewGELUActivation",
            Self::GeluPytorchTanh => "GELUTanh",
            Self::Relu => "ReLU",
            Self::Silu => "SiLUActivation",
            Self::Swish => "SiLU",
            Self::Tanh => "Tanh",
        }
    }

    /// [`apply`](Self::apply), reported to the underflow / overflow tracer as the module
    /// `name`.
    pub(crate) fn apply_traced(self, x: &Tensor, name: impl FnOnce() -> String) -> Tensor {
        let y = self.apply(x);
        crate::debug_utils::leaf(name, self.class_name(), &[], x, &y);
        y
    }

    pub(crate) fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Self::Gelu => x.gelu("none"),
            Self::GeluNew => {
                // Upstream's evaluation order, op for op: autograd sums the three gradients
                // that reach `x` in the reverse order of creation, and in bf16 that order
                // shows in the result.
                let half = x * 0.5;
                let inner = (x + x.pow_tensor_scalar(3.0) * 0.044715)
                    * (2.0f64 / std::f64::consts::PI).sqrt();
                half * (inner.tanh() + 1.0)
            }
            Self::GeluPytorchTanh => x.gelu("tanh"),
            Self::Relu => x.relu(),
            Self::Silu | Self::Swish => x.silu(),
            Self::Tanh => x.tanh(),
        }
    }
}

/// A module's own parameters in upstream's registration order (`named_parameters(recurse=False)`),
/// for the underflow / overflow tracer.
pub(crate) trait Params {
    /// `(name, tensor)` pairs.
    fn params(&self) -> Vec<(&'static str, &Tensor)>;
}

impl Params for nn::Linear {
    fn params(&self) -> Vec<(&'static str, &Tensor)> {
        let mut out = vec![("weight", &self.ws)];
        out.extend(self.bs.as_ref().map(|b| ("bias", b)));
        out
    }
}

impl Params for LayerLinear {
    fn params(&self) -> Vec<(&'static str, &Tensor)> {
        self.0.params()
    }
}

impl Params for Conv1D {
    fn params(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("weight", &self.weight), ("bias", &self.bias)]
    }
}

impl Params for nn::LayerNorm {
    fn params(&self) -> Vec<(&'static str, &Tensor)> {
        let mut out: Vec<(&'static str, &Tensor)> = self.ws.iter().map(|w| ("weight", w)).collect();
        out.extend(self.bs.as_ref().map(|b| ("bias", b)));
        out
    }
}

impl Params for nn::Embedding {
    fn params(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("weight", &self.ws)]
    }
}

impl Params for RmsNorm {
    fn params(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("weight", &self.weight)]
    }
}

/// `x.apply(module)`, reported to the underflow / overflow tracer as the module `name` of
/// class `class`.
pub(crate) fn apply_traced<M: Module + Params>(
    x: &Tensor,
    module: &M,
    name: impl FnOnce() -> String,
    class: &str,
) -> Tensor {
    let traced = crate::debug_utils::active();
    let adapted = crate::peft::adapters_active();
    if !traced && !adapted {
        return x.apply(module);
    }
    let name = name();
    let y = x.apply(module);
    // An active LoRA adapter of this layer adds its term (peft's `Linear.forward`).
    let y = if adapted {
        crate::peft::apply_adapter(&name, x, y)
    } else {
        y
    };
    // `params` allocates: only when a tracer listens (this runs in every training step).
    if traced {
        crate::debug_utils::leaf(|| name, class, &module.params(), x, &y);
    }
    y
}

/// Dropout as upstream's `nn.Dropout` module `name` (which reports in evaluation too).
pub(crate) fn dropout_traced(
    x: &Tensor,
    p: f64,
    train: bool,
    name: impl FnOnce() -> String,
) -> Tensor {
    let y = crate::dropout::dropout(x, p, train);
    crate::debug_utils::leaf(name, "Dropout", &[], x, &y);
    y
}
