//! `nn.Linear` and GPT-2's `Conv1D` (a linear map whose weight is stored `[in, out]`):
//! each owns its module name, its LoRA slot and its tracer report.

use tch::Tensor;
use tch::nn::Init;

use crate::context::Context;
use crate::initialization::{self, normal};
use crate::lora::LoraSlot;
use crate::path::Path;

/// `nn.Linear(in, out, bias)`: `x Wᵀ + b`, plus its LoRA adapter's term when one is set,
/// reported to the tracer as module `name` of class `Linear`.
#[derive(Debug)]
pub struct Linear {
    /// `weight` `[out, in]`.
    pub ws: Tensor,
    /// `bias` `[out]`.
    pub bs: Option<Tensor>,
    name: String,
    class: String,
    ctx: Context,
    /// Inside a transformer layer: under hooks that release parameters (ZeRO-3) the map
    /// is computed so that autograd saves the weight itself.
    in_layer: bool,
    lora: LoraSlot,
}

impl Linear {
    /// `nn.Linear(in, out, bias)` at `p`, initialised as upstream's `_init_weights`
    /// (`normal(0, std)` weight, zero bias). The weight is created before the bias, as
    /// torch registers them (tch's `nn::linear` creates the bias first):
    /// `model.parameters()` follows this order, and gradient clipping sums the
    /// per-parameter norms in it.
    pub fn new(p: Path<'_>, in_dim: i64, out_dim: i64, bias: bool, std: f64) -> Self {
        let ws = initialization::var(&p, "weight", &[out_dim, in_dim], normal(std));
        let bs = bias.then(|| initialization::var(&p, "bias", &[out_dim], Init::Const(0.0)));
        Self::from_parts(&p, ws, bs)
    }

    /// [`new`](Self::new) for a linear map inside a transformer layer (see
    /// [`LayerHooks::releases_parameters`](crate::LayerHooks::releases_parameters)).
    pub fn in_layer(p: Path<'_>, in_dim: i64, out_dim: i64, bias: bool, std: f64) -> Self {
        Self {
            in_layer: true,
            ..Self::new(p, in_dim, out_dim, bias, std)
        }
    }

    /// A linear part at `p` over variables already created.
    pub fn from_parts(p: &Path<'_>, ws: Tensor, bs: Option<Tensor>) -> Self {
        let name = p.name();
        let lora = LoraSlot::default();
        p.ctx().register_lora_slot(name.clone(), lora.clone());
        Self {
            ws,
            bs,
            name,
            class: "Linear".into(),
            ctx: p.ctx().clone(),
            in_layer: false,
            lora,
        }
    }

    /// This part as a linear map inside a transformer layer (see
    /// [`in_layer`](Self::in_layer)).
    pub fn layer_form(mut self) -> Self {
        self.in_layer = true;
        self
    }

    /// The tracer reports this part as class `class` (upstream's subclasses of
    /// `nn.Linear`).
    pub fn with_class(mut self, class: impl Into<String>) -> Self {
        self.class = class.into();
        self
    }

    /// The module name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The part's forward (see the type's documentation).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = if self.in_layer && self.ctx.releases_parameters() {
            releasing_linear(x, &self.ws, self.bs.as_ref())
        } else {
            x.linear(&self.ws, self.bs.as_ref())
        };
        let y = self.lora.apply_linear(x, y);
        if self.ctx.traced() {
            let mut params = vec![("weight", &self.ws)];
            params.extend(self.bs.as_ref().map(|b| ("bias", b)));
            self.ctx
                .leaf(|| self.name.clone(), &self.class, &params, x, &y);
        }
        y
    }
}

/// `(W xᵀ)ᵀ + b`: a linear map whose matrix product saves `W` itself for the backward.
fn releasing_linear(xs: &Tensor, ws: &Tensor, bs: Option<&Tensor>) -> Tensor {
    let mut size = xs.size();
    let in_dim = size.last().copied().unwrap_or(0);
    let y = ws.mm(&xs.reshape([-1, in_dim]).tr()).tr();
    let y = match bs {
        Some(b) => y + b,
        None => y,
    };
    if let Some(last) = size.last_mut() {
        *last = ws.size()[0];
    }
    y.reshape(size)
}

/// GPT-2's `Conv1D`: a linear map whose weight is stored transposed, `[in, out]`.
#[derive(Debug)]
pub struct Conv1D {
    /// `weight` `[in, out]`.
    pub weight: Tensor,
    /// `bias` `[out]`.
    pub bias: Tensor,
    name: String,
    ctx: Context,
    lora: LoraSlot,
}

impl Conv1D {
    /// `Conv1D(out, in)` at `p`, initialised as upstream (`normal(0, std)`, zero bias).
    pub fn new(p: Path<'_>, out_dim: i64, in_dim: i64, std: f64) -> Self {
        let name = p.name();
        let lora = LoraSlot::default();
        p.ctx().register_lora_slot(name.clone(), lora.clone());
        Self {
            weight: initialization::var(&p, "weight", &[in_dim, out_dim], normal(std)),
            bias: initialization::var(&p, "bias", &[out_dim], Init::Const(0.0)),
            name,
            ctx: p.ctx().clone(),
            lora,
        }
    }

    /// `torch.addmm(bias, x.view(-1, in), weight).view(..., out)`, as upstream, plus its
    /// LoRA adapter's term; reported to the tracer as class `Conv1D`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mut shape = x.size();
        let in_dim = shape.last().copied().unwrap_or(0);
        let out = self.bias.addmm(&x.reshape([-1, in_dim]), &self.weight);
        if let Some(last) = shape.last_mut() {
            *last = self.weight.size()[1];
        }
        let y = self.lora.apply_linear(x, out.reshape(shape));
        if self.ctx.traced() {
            let params = [("weight", &self.weight), ("bias", &self.bias)];
            self.ctx
                .leaf(|| self.name.clone(), "Conv1D", &params, x, &y);
        }
        y
    }
}
