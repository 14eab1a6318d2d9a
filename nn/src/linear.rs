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
            quantized_linear(
                &x,
                bias.as_ref(),
                Box::new(move |op: Op<'_>| match op {
                    Op::Forward(x, bias) => {
                        let w = state.dequantize(&packed, x.kind())?;
                        Ok(x.f_linear(&w, bias)?)
                    }
                    // `grad · W`, W dequantized in its own dtype then the gradient's.
                    Op::InputGrad(g, _) => {
                        let w = state.dequantize(&packed, state.dtype)?;
                        Ok(g.f_matmul(&w.f_to_kind(g.kind())?)?)
                    }
                }),
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

/// bitsandbytes' `Linear8bitLt` weight (LLM.int8, `has_fp16_weights=False`): the int8 rows
/// (`CB`, the checkpoint's `weight`), their scales (`SCB`) and the outlier threshold.
#[derive(Debug)]
pub struct Linear8bitLt {
    /// `weight` / `CB` `[out, in]` (int8).
    pub weight: Tensor,
    /// `SCB` `[out]` (float32): each row's absmax.
    pub scb: Tensor,
    /// `threshold` (`llm_int8_threshold`): inputs of this magnitude or more are outliers,
    /// whose columns the evaluation multiplies in the input's dtype.
    pub threshold: f64,
}

impl Linear8bitLt {
    /// The weight as `MatMul8bitFp` dequantizes it in `kind`:
    /// `CB.to(kind).mul_(SCB[:, None] · (1/127))`.
    fn dequantize(weight: &Tensor, scb: &Tensor, kind: Kind) -> crate::Result<Tensor> {
        let scale = scb.f_unsqueeze(1)?.f_mul_scalar(1.0 / 127.0)?;
        let mut w = weight.f_to_kind(kind)?;
        let _ = w.f_mul_(&scale)?;
        Ok(w)
    }

    /// `bnb.matmul(x, weight, bias, state)` on the CPU: in training mode `MatMul8bitFp` (the
    /// weight dequantized in the input's dtype, `linear`); in evaluation `MatMul8bitLt`, LLM.int8
    /// itself: the input (in float16) quantized per row with its outlier columns held out,
    /// the int8 product in int32 scaled back in float32 (plus the bias, then the input's
    /// dtype), the outlier columns' product added in the input's dtype. Both take the input's
    /// gradient as `grad · W` (W dequantized as `MatMul8bitFp`, in the input's dtype); the
    /// weight takes none.
    pub fn forward(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        training: bool,
    ) -> crate::Result<Tensor> {
        // `Linear8bitLt.forward` casts the bias to the input's dtype.
        let bias = match bias {
            Some(b) if b.kind() != x.kind() => Some(b.f_to_kind(x.kind())?),
            Some(b) => Some(b.shallow_clone()),
            None => None,
        };
        let weight = self.weight.shallow_clone();
        let scb = self.scb.shallow_clone();
        let threshold = self.threshold;
        let output = move |x: &Tensor, bias: Option<&Tensor>| -> crate::Result<Tensor> {
            if training {
                let w = Self::dequantize(&weight, &scb, x.kind())?;
                Ok(x.f_linear(&w, bias)?)
            } else {
                int8_linear(x, &weight, &scb, threshold, bias)
            }
        };
        let needs_grad = x.requires_grad() || bias.as_ref().is_some_and(Tensor::requires_grad);
        if !needs_grad {
            return output(x, bias.as_ref());
        }
        let weight = self.weight.shallow_clone();
        let scb = self.scb.shallow_clone();
        quantized_linear(
            x,
            bias.as_ref(),
            Box::new(move |op: Op<'_>| match op {
                Op::Forward(x, bias) => output(x, bias),
                Op::InputGrad(g, input) => {
                    let out = *g.size().last().unwrap_or(&0);
                    let mut shape = g.size();
                    if let Some(last) = shape.last_mut() {
                        *last = weight.size()[1];
                    }
                    let w = Self::dequantize(&weight, &scb, input)?;
                    Ok(g.f_reshape([-1, out])?
                        .f_to_kind(input)?
                        .f_matmul(&w)?
                        .f_view(shape.as_slice())?)
                }
            }),
        )
    }
}

/// `MatMul8bitLt.forward` (no gradient through it): see [`Linear8bitLt::forward`].
fn int8_linear(
    x: &Tensor,
    weight: &Tensor,
    scb: &Tensor,
    threshold: f64,
    bias: Option<&Tensor>,
) -> crate::Result<Tensor> {
    use crate::bitsandbytes::{
        int8_linear_matmul, int8_mm_dequant, int8_vectorwise_dequant, int8_vectorwise_quant,
    };
    let mut shape = x.size();
    let k = *shape.last().unwrap_or(&0);
    let a = x.f_reshape([-1, k])?;
    let (ca, sca, cols) = int8_vectorwise_quant(&a.f_to_kind(Kind::Half)?, threshold)?;
    let product = int8_linear_matmul(&ca, weight)?;
    let mut y = int8_mm_dequant(&product, &sca, scb, a.kind(), bias)?;
    if let Some(cols) = cols.filter(|c| c.numel() > 0) {
        // `int8_mixed_scaled_mm`: the outlier columns in the input's dtype.
        let sub_a = a.f_index_select(1, &cols)?;
        let sub_b = int8_vectorwise_dequant(&weight.f_index_select(1, &cols)?, scb)?
            .f_to_kind(a.kind())?
            .f_tr()?;
        y = y.f_addmm(&sub_a, &sub_b)?;
    }
    if let Some(last) = shape.last_mut() {
        *last = weight.size()[0];
    }
    Ok(y.f_reshape(shape.as_slice())?)
}

/// A linear part's quantized weight: bitsandbytes' `Linear4bit` or `Linear8bitLt`.
#[derive(Debug)]
pub enum QuantizedWeight {
    /// 4-bit (`load_in_4bit`).
    FourBit(Linear4bit),
    /// 8-bit LLM.int8 (`load_in_8bit`).
    EightBit(Linear8bitLt),
}

impl From<Linear4bit> for QuantizedWeight {
    fn from(w: Linear4bit) -> Self {
        Self::FourBit(w)
    }
}

impl From<Linear8bitLt> for QuantizedWeight {
    fn from(w: Linear8bitLt) -> Self {
        Self::EightBit(w)
    }
}

impl QuantizedWeight {
    /// The checkpoint's `weight` (the packed 4-bit codes or the int8 rows).
    pub fn weight(&self) -> &Tensor {
        match self {
            Self::FourBit(w) => &w.packed,
            Self::EightBit(w) => &w.weight,
        }
    }

    /// The float weight's shape `[out, in]`.
    pub fn shape(&self) -> Vec<i64> {
        match self {
            Self::FourBit(w) => w.state.shape.clone(),
            Self::EightBit(w) => w.weight.size(),
        }
    }

    /// The weight dequantized in float32, as peft's `dequantize_bnb_weight` (for merging):
    /// `dequantize_4bit`, or `int8_vectorwise_dequant`.
    pub fn dequantize(&self) -> crate::Result<Tensor> {
        match self {
            Self::FourBit(w) => w.state.dequantize(&w.packed, w.state.dtype),
            Self::EightBit(w) => crate::bitsandbytes::int8_vectorwise_dequant(&w.weight, &w.scb),
        }
    }

    /// The part's forward (`training`: the model's mode).
    pub fn forward(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        training: bool,
    ) -> crate::Result<Tensor> {
        match self {
            Self::FourBit(w) => w.forward(x, bias),
            Self::EightBit(w) => w.forward(x, bias, training),
        }
    }
}

/// What the autograd node asks of a quantized weight's closure.
enum Op<'a> {
    /// The output of the input (and the bias).
    Forward(&'a Tensor, Option<&'a Tensor>),
    /// The input's gradient from the output's gradient, in the input's dtype's terms.
    InputGrad(&'a Tensor, Kind),
}

/// A quantized weight's closure, kept by the autograd graph.
type QuantizedFn = Box<dyn Fn(Op<'_>) -> crate::Result<Tensor> + Send>;

/// A malloc'd copy of `text` for the shim (which throws and frees it).
#[allow(unsafe_code)]
fn shim_text(text: &str) -> *mut std::ffi::c_char {
    let text = std::ffi::CString::new(text.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `text` is a live NUL-terminated string; the shim copies it.
    unsafe { tchtrain_sys::tchtrain_checkpoint_message(text.as_ptr()) }
}

/// The floating dtype of a `c10::ScalarType` code.
fn kind_of_code(code: std::ffi::c_int) -> Option<Kind> {
    match code {
        5 => Some(Kind::Half),
        6 => Some(Kind::Float),
        7 => Some(Kind::Double),
        15 => Some(Kind::BFloat16),
        _ => None,
    }
}

/// Called by the shim: runs the closure (`op` 0 the forward, 1 the input's gradient).
#[allow(unsafe_code)]
unsafe extern "C" fn run_quantized(
    weight: *mut std::ffi::c_void,
    op: std::ffi::c_int,
    t: *const torch_sys::C_tensor,
    bias: *const torch_sys::C_tensor,
    dtype: std::ffi::c_int,
    out: *mut *mut torch_sys::C_tensor,
) -> *mut std::ffi::c_char {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `weight` is the `Box<QuantizedFn>` leaked by `quantized_linear`, alive until
        // `drop_quantized`; `t` and `bias` (when not null) are live for the call and are
        // borrowed here, not owned (forgotten after use).
        let f = unsafe { &*(weight as *const QuantizedFn) };
        let t = std::mem::ManuallyDrop::new(unsafe { Tensor::from_ptr(t as *mut _) });
        let bias = (!bias.is_null())
            .then(|| std::mem::ManuallyDrop::new(unsafe { Tensor::from_ptr(bias as *mut _) }));
        match op {
            0 => f(Op::Forward(&t, bias.as_deref())),
            _ => match kind_of_code(dtype) {
                Some(kind) => f(Op::InputGrad(&t, kind)),
                None => Err(crate::Error::InvalidArgument {
                    field: "input",
                    detail: format!("quantized linear: no floating dtype of code {dtype}"),
                }),
            },
        }
    }));
    match result {
        Ok(Ok(mut w)) => {
            // SAFETY: the shim takes ownership of the tensor (and deletes it).
            unsafe { *out = w.as_mut_ptr() };
            std::mem::forget(w);
            std::ptr::null_mut()
        }
        Ok(Err(e)) => shim_text(&e.to_string()),
        Err(_) => shim_text("quantized linear: the closure panicked"),
    }
}

/// Called by the shim when the graph lets go of the weight's closure.
#[allow(unsafe_code)]
unsafe extern "C" fn drop_quantized(weight: *mut std::ffi::c_void) {
    // SAFETY: the pointer `quantized_linear` leaked, dropped once.
    drop(unsafe { Box::from_raw(weight as *mut QuantizedFn) });
}

/// bitsandbytes' autograd function (`MatMul4Bit` / `MatMul8bitFp` / `MatMul8bitLt`) through
/// `tchtrain-sys` (`csrc/quantized_linear.cpp`): `f` computes the output and the input's
/// gradient; the bias's gradient is `grad.sum(0)` in its dtype.
#[allow(unsafe_code)]
fn quantized_linear(x: &Tensor, bias: Option<&Tensor>, f: QuantizedFn) -> crate::Result<Tensor> {
    let weight: *mut QuantizedFn = Box::into_raw(Box::new(f));
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: `x` and `bias` are live for the call; `weight` is handed over (the shim frees it
    // through `drop_quantized`, also on failure); the callbacks live as long as the program.
    let err = unsafe {
        tchtrain_sys::tchtrain_quantized_linear(
            x.as_ptr(),
            bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            weight.cast(),
            run_quantized,
            drop_quantized,
            &mut out,
        )
    };
    // SAFETY: the shim's result, freed by `take_error`.
    unsafe { tchtrain_sys::take_error(err) }
        .map_err(|m| crate::Error::Torch(tch::TchError::Torch(m)))?;
    // SAFETY: allocated by the shim with `new at::Tensor(..)`, owned by nobody else.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// A linear part's quantized weight, once quantized (shared by the part and the model's
/// [`Context`], through which the loader quantizes).
#[derive(Debug, Clone, Default)]
pub struct QuantSlot(Arc<Mutex<Option<QuantizedWeight>>>);

impl QuantSlot {
    /// Whether the part is quantized.
    pub fn is_set(&self) -> bool {
        lock(&self.0).is_some()
    }

    /// Runs `f` on the quantized weight (none: the part is not quantized).
    pub fn with<R>(&self, f: impl FnOnce(Option<&QuantizedWeight>) -> R) -> R {
        f(lock(&self.0).as_ref())
    }

    /// Makes the part quantized over `weight` (none: the float weight again).
    pub fn set(&self, weight: Option<QuantizedWeight>) {
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
                    .forward(x, self.bs.as_ref(), self.ctx.is_training())
                    .unwrap_or_else(|e| panic!("{}: quantized forward: {e}", self.name));
                let y = self.lora.apply_linear_quantized(x, y);
                if self.ctx.traced() {
                    let mut params = vec![("weight", q.weight())];
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
