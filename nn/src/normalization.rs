//! `nn.LayerNorm` and the RMS norms (Llama's, Gemma's `1 + weight`, T5's): each owns its
//! module name, its class for the tracer and its report.

use tch::nn::{self, Init};
use tch::{Kind, Tensor};

use crate::context::Context;
use crate::initialization;
use crate::path::Path;

/// `nn.LayerNorm(dim, eps)` (weight ones, bias zeros).
#[derive(Debug)]
pub struct LayerNorm {
    /// `weight`.
    pub ws: Option<Tensor>,
    /// `bias`.
    pub bs: Option<Tensor>,
    dim: i64,
    eps: f64,
    name: String,
    class: String,
    ctx: Context,
}

impl LayerNorm {
    /// `nn.LayerNorm(dim, eps)` at `p`.
    pub fn new(p: Path<'_>, dim: i64, eps: f64) -> Self {
        let ln = nn::layer_norm(
            &*p,
            vec![dim],
            nn::LayerNormConfig {
                eps,
                ..Default::default()
            },
        );
        Self {
            ws: ln.ws,
            bs: ln.bs,
            dim,
            eps,
            name: p.name(),
            class: "LayerNorm".into(),
            ctx: p.ctx().clone(),
        }
    }

    /// The tracer reports this part as class `class`.
    pub fn with_class(mut self, class: impl Into<String>) -> Self {
        self.class = class.into();
        self
    }

    /// `F.layer_norm(x, (dim,), weight, bias, eps)`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = Tensor::layer_norm(
            x,
            [self.dim],
            self.ws.as_ref(),
            self.bs.as_ref(),
            self.eps,
            true,
        );
        if self.ctx.traced() {
            let mut params: Vec<(&str, &Tensor)> = self.ws.iter().map(|w| ("weight", w)).collect();
            params.extend(self.bs.as_ref().map(|b| ("bias", b)));
            self.ctx
                .leaf(|| self.name.clone(), &self.class, &params, x, &y);
        }
        y
    }
}

/// Llama's `RMSNorm`: computed in float32, scaled by `weight` in the input dtype; or
/// Gemma's: scaled by `1 + weight` in float32, then cast (weights initialised to zeros); or
/// OLMo 2's: scaled by `weight` in float32, then cast; or Gemma 4's: `x · (mean(x²) + eps) **
/// -0.5` (a power, as upstream's, whose backward differs from `rsqrt`'s), scaled by `weight`
/// in float32 or not scaled at all (`with_scale=False`), then cast.
#[derive(Debug)]
pub struct RmsNorm {
    /// `weight` (`None` for Gemma 4's scale-less norm).
    pub weight: Option<Tensor>,
    eps: f64,
    variant: RmsNormVariant,
    name: String,
    class: String,
    ctx: Context,
}

/// Where an RMSNorm applies its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RmsNormVariant {
    /// `weight * x.to(dtype)`.
    Llama,
    /// `(x * (1 + weight.float())).to(dtype)`.
    Gemma,
    /// `(weight * x).to(dtype)`.
    Olmo,
    /// `(x * pow(mean(x²) + eps, -0.5) [* weight.float()]).to(dtype)`.
    Gemma4,
}

impl RmsNorm {
    /// Llama's `RMSNorm(dim, eps)` at `p`, reported as class `class`.
    pub fn new(p: Path<'_>, dim: i64, eps: f64, class: impl Into<String>) -> Self {
        Self::build(p, dim, eps, class.into(), RmsNormVariant::Llama)
    }

    /// Upstream `GemmaRMSNorm` (Gemma 1–3) at `p`, reported as class `class`.
    pub fn gemma(p: Path<'_>, dim: i64, eps: f64, class: impl Into<String>) -> Self {
        Self::build(p, dim, eps, class.into(), RmsNormVariant::Gemma)
    }

    /// Upstream `Olmo2RMSNorm` (OLMo 2 / 3) at `p`, reported as class `class`.
    pub fn olmo(p: Path<'_>, dim: i64, eps: f64, class: impl Into<String>) -> Self {
        Self::build(p, dim, eps, class.into(), RmsNormVariant::Olmo)
    }

    /// Upstream `Gemma4RMSNorm(dim, eps, with_scale)` at `p`, reported as class `class`
    /// (weights initialised to ones; none without `with_scale`).
    pub fn gemma4(
        p: Path<'_>,
        dim: i64,
        eps: f64,
        with_scale: bool,
        class: impl Into<String>,
    ) -> Self {
        if with_scale {
            return Self::build(p, dim, eps, class.into(), RmsNormVariant::Gemma4);
        }
        Self {
            weight: None,
            eps,
            variant: RmsNormVariant::Gemma4,
            name: p.name(),
            class: class.into(),
            ctx: p.ctx().clone(),
        }
    }

    fn build(p: Path<'_>, dim: i64, eps: f64, class: String, variant: RmsNormVariant) -> Self {
        let init = Init::Const(if variant == RmsNormVariant::Gemma {
            0.0
        } else {
            1.0
        });
        Self {
            weight: Some(initialization::var(&p, "weight", &[dim], init)),
            eps,
            variant,
            name: p.name(),
            class,
            ctx: p.ctx().clone(),
        }
    }

    /// The norm (see the type's documentation).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let h = x.to_kind(Kind::Float);
        let variance = h.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let y = match (self.variant, &self.weight) {
            (RmsNormVariant::Gemma4, w) => {
                let h = h * (variance + self.eps).pow_tensor_scalar(-0.5);
                match w {
                    Some(w) => (h * w.to_kind(Kind::Float)).to_kind(kind),
                    None => h.to_kind(kind),
                }
            }
            (_, None) => (h * (variance + self.eps).rsqrt()).to_kind(kind),
            (variant, Some(w)) => {
                let h = h * (variance + self.eps).rsqrt();
                match variant {
                    RmsNormVariant::Gemma => (h * (w.to_kind(Kind::Float) + 1.0)).to_kind(kind),
                    RmsNormVariant::Olmo => (w * h).to_kind(kind),
                    _ => w * h.to_kind(kind),
                }
            }
        };
        if self.ctx.traced() {
            let params: Vec<(&str, &Tensor)> = self.weight.iter().map(|w| ("weight", w)).collect();
            self.ctx
                .leaf(|| self.name.clone(), &self.class, &params, x, &y);
        }
        y
    }
}
