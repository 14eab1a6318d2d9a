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
/// OLMo 2's: scaled by `weight` in float32, then cast.
#[derive(Debug)]
pub struct RmsNorm {
    /// `weight`.
    pub weight: Tensor,
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

    fn build(p: Path<'_>, dim: i64, eps: f64, class: String, variant: RmsNormVariant) -> Self {
        let init = Init::Const(if variant == RmsNormVariant::Gemma {
            0.0
        } else {
            1.0
        });
        Self {
            weight: initialization::var(&p, "weight", &[dim], init),
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
        let h = h * (variance + self.eps).rsqrt();
        let y = match self.variant {
            RmsNormVariant::Gemma => (h * (self.weight.to_kind(Kind::Float) + 1.0)).to_kind(kind),
            RmsNormVariant::Olmo => (&self.weight * h).to_kind(kind),
            RmsNormVariant::Llama => &self.weight * h.to_kind(kind),
        };
        if self.ctx.traced() {
            self.ctx.leaf(
                || self.name.clone(),
                &self.class,
                &[("weight", &self.weight)],
                x,
                &y,
            );
        }
        y
    }
}
