//! `nn.Linear` and GPT-2's `Conv1D` (a linear map whose weight is stored `[in, out]`):
//! each owns its module name, its LoRA slot and its tracer report.

use std::sync::{Arc, Mutex};

use tch::nn::Init;
use tch::{Kind, Tensor};

use crate::bitsandbytes::QuantState;
use crate::context::{Context, lock};
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
    quant: QuantSlot,
}

/// bitsandbytes' `Linear4bit` weight: the packed 4-bit codes and their state, and the
/// compute dtype the input is cast to (`bnb_4bit_compute_dtype`).
#[derive(Debug)]
pub struct Linear4bit {
    /// The packed codes `[(out · in + 1) / 2, 1]` (uint8), the checkpoint's `weight`.
    pub packed: Tensor,
    /// Their `QuantState`.
    pub state: QuantState,
    /// `compute_dtype` (`None`: the input's).
    pub compute_dtype: Option<Kind>,
}

impl Linear4bit {
    /// `Linear4bit.forward`: the input cast to the compute dtype, the weight dequantized in
    /// it (`gemm_4bit`'s default: `code[q] · absmax` in float32, then cast), `linear`, the
    /// output back in the input's dtype. The input's gradient is `grad · W` as
    /// `MatMul4Bit.backward` computes it; the weight takes none.
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> crate::Result<Tensor> {
        let inp = x.kind();
        let x = match self.compute_dtype {
            Some(k) if k != inp => x.f_to_kind(k)?,
            _ => x.shallow_clone(),
        };
        let bias = match bias {
            Some(b) if b.kind() != x.kind() => Some(b.f_to_kind(x.kind())?),
            Some(b) => Some(b.shallow_clone()),
            None => None,
        };
        let needs_grad = x.requires_grad() || bias.as_ref().is_some_and(Tensor::requires_grad);
        let y = if needs_grad {
            // `MatMul4Bit`: the graph keeps the packed codes, the backward dequantizes again.
            let packed = self.packed.shallow_clone();
            let state = self.state.shallow_clone();
            matmul_4bit(
                &x,
                bias.as_ref(),
                Box::new(move |kind| state.dequantize(&packed, kind.unwrap_or(state.dtype))),
            )?
        } else {
            // `gemm_4bit` (nothing to differentiate).
            let w = self.state.dequantize(&self.packed, x.kind())?;
            x.f_linear(&w, bias.as_ref())?
        };
        Ok(if y.kind() == inp {
            y
        } else {
            y.f_to_kind(inp)?
        })
    }
}

/// A 4-bit weight's dequantization in a dtype (`None`: its own), kept by the autograd graph.
type Dequantize = Box<dyn Fn(Option<Kind>) -> crate::Result<Tensor> + Send>;

/// A malloc'd copy of `text` for the shim (which throws and frees it).
#[allow(unsafe_code)]
fn shim_text(text: &str) -> *mut std::ffi::c_char {
    let text = std::ffi::CString::new(text.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `text` is a live NUL-terminated string; the shim copies it.
    unsafe { tchtrain_sys::tchtrain_checkpoint_message(text.as_ptr()) }
}

/// Called by the shim: the weight dequantized in the dtype of code `dtype` (-1: its own).
#[allow(unsafe_code)]
unsafe extern "C" fn run_dequantize(
    weight: *mut std::ffi::c_void,
    dtype: std::ffi::c_int,
    out: *mut *mut torch_sys::C_tensor,
) -> *mut std::ffi::c_char {
    let kind = match dtype {
        d if d < 0 => None,
        5 => Some(Kind::Half),
        6 => Some(Kind::Float),
        7 => Some(Kind::Double),
        15 => Some(Kind::BFloat16),
        other => return shim_text(&format!("4-bit matmul: no floating dtype of code {other}")),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `weight` is the `Box<Dequantize>` leaked by `matmul_4bit`, alive until
        // `drop_dequantize`.
        let f = unsafe { &*(weight as *const Dequantize) };
        f(kind)
    }));
    match result {
        Ok(Ok(mut w)) => {
            // SAFETY: the shim takes ownership of the tensor (and deletes it).
            unsafe { *out = w.as_mut_ptr() };
            std::mem::forget(w);
            std::ptr::null_mut()
        }
        Ok(Err(e)) => shim_text(&e.to_string()),
        Err(_) => shim_text("4-bit matmul: the dequantization panicked"),
    }
}

/// Called by the shim when the graph lets go of the weight's closure.
#[allow(unsafe_code)]
unsafe extern "C" fn drop_dequantize(weight: *mut std::ffi::c_void) {
    // SAFETY: the pointer `matmul_4bit` leaked, dropped once.
    drop(unsafe { Box::from_raw(weight as *mut Dequantize) });
}

/// `MatMul4Bit.apply(x, W, bias)` through `tchtrain-sys` (`csrc/matmul_4bit.cpp`).
#[allow(unsafe_code)]
fn matmul_4bit(x: &Tensor, bias: Option<&Tensor>, dequantize: Dequantize) -> crate::Result<Tensor> {
    let weight: *mut Dequantize = Box::into_raw(Box::new(dequantize));
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: `x` and `bias` are live for the call; `weight` is handed over (the shim frees it
    // through `drop_dequantize`, also on failure); the callbacks live as long as the program.
    let err = unsafe {
        tchtrain_sys::tchtrain_matmul_4bit(
            x.as_ptr(),
            bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            weight.cast(),
            run_dequantize,
            drop_dequantize,
            &mut out,
        )
    };
    // SAFETY: the shim's result, freed by `take_error`.
    unsafe { tchtrain_sys::take_error(err) }
        .map_err(|m| crate::Error::Torch(tch::TchError::Torch(m)))?;
    // SAFETY: allocated by the shim with `new at::Tensor(..)`, owned by nobody else.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// A linear part's 4-bit weight, once quantized (shared by the part and the model's
/// [`Context`], through which the loader quantizes).
#[derive(Debug, Clone, Default)]
pub struct QuantSlot(Arc<Mutex<Option<Linear4bit>>>);

impl QuantSlot {
    /// Whether the part is quantized.
    pub fn is_set(&self) -> bool {
        lock(&self.0).is_some()
    }

    /// Runs `f` on the 4-bit weight (none: the part is not quantized).
    pub fn with<R>(&self, f: impl FnOnce(Option<&Linear4bit>) -> R) -> R {
        f(lock(&self.0).as_ref())
    }

    /// Makes the part a `Linear4bit` over `weight` (none: the float weight again).
    pub fn set(&self, weight: Option<Linear4bit>) {
        *lock(&self.0) = weight;
    }
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
        let quant = QuantSlot::default();
        p.ctx().register_quant_slot(name.clone(), quant.clone());
        Self {
            ws,
            bs,
            name,
            class: "Linear".into(),
            ctx: p.ctx().clone(),
            in_layer: false,
            lora,
            quant,
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
        let quantized = self.quant.with(|q| {
            q.map(|q| {
                // The state was checked against the packed codes when it was installed
                // (`QuantState::validate`): its forward does not fail on them.
                let y = q
                    .forward(x, self.bs.as_ref())
                    .unwrap_or_else(|e| panic!("{}: 4-bit forward: {e}", self.name));
                let y = self.lora.apply_linear_quantized(x, y);
                if self.ctx.traced() {
                    let mut params = vec![("weight", &q.packed)];
                    params.extend(self.bs.as_ref().map(|b| ("bias", b)));
                    self.ctx
                        .leaf(|| self.name.clone(), &self.class, &params, x, &y);
                }
                y
            })
        });
        if let Some(y) = quantized {
            return y;
        }
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
