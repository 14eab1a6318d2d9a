//! `nn.Embedding`: owns its module name, its `padding_idx`, its LoRA slot (peft's
//! `lora.Embedding`) and its tracer report.

use tch::Tensor;
use tch::nn::{self, Init};

use crate::context::Context;
use crate::initialization::{self, normal};
use crate::lora::LoraSlot;
use crate::path::Path;

/// `nn.Embedding(n, dim, padding_idx)`.
#[derive(Debug)]
pub struct Embedding {
    /// `weight` `[n, dim]`.
    pub ws: Tensor,
    padding_idx: Option<i64>,
    name: String,
    class: String,
    ctx: Context,
    lora: LoraSlot,
}

impl Embedding {
    /// `nn.Embedding(n, dim)` at `p`, initialised as upstream (`normal(0, std)`).
    pub fn new(p: Path<'_>, n: i64, dim: i64, std: f64) -> Self {
        Self::with_padding(p, n, dim, std, None)
    }

    /// `nn.Embedding(n, dim, padding_idx)`: the padding row gets no gradient, and
    /// `_init_weights` zeroes it after the normal draw. A negative `padding_idx` counts
    /// from `n`. The caller's config validation refuses one outside the vocabulary, as
    /// upstream's `nn.Embedding` asserts.
    pub fn with_padding(p: Path<'_>, n: i64, dim: i64, std: f64, padding_idx: Option<i64>) -> Self {
        Self::with_init(p, n, dim, normal(std), padding_idx)
    }

    /// [`with_padding`](Self::with_padding) with the weight drawn from `init`.
    pub fn with_init(p: Path<'_>, n: i64, dim: i64, init: Init, padding_idx: Option<i64>) -> Self {
        let padding_idx = padding_idx.map(|i| if i < 0 { i + n } else { i });
        let ws_init = initialization::init_zero_row(&p, "weight", init, padding_idx);
        let deferred = p.ctx().is_deferred();
        let e = nn::embedding(
            &*p,
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
        Self::from_parts(&p, e.ws, padding_idx)
    }

    /// An embedding part at `p` over a weight already created (`padding_idx`
    /// non-negative).
    pub fn from_parts(p: &Path<'_>, ws: Tensor, padding_idx: Option<i64>) -> Self {
        let name = p.name();
        let lora = LoraSlot::default();
        p.ctx().register_lora_slot(name.clone(), lora.clone());
        Self {
            ws,
            padding_idx,
            name,
            class: "Embedding".into(),
            ctx: p.ctx().clone(),
            lora,
        }
    }

    /// The tracer reports this part as class `class` (upstream's subclasses of
    /// `nn.Embedding`).
    pub fn with_class(mut self, class: impl Into<String>) -> Self {
        self.class = class.into();
        self
    }

    /// The module name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `padding_idx` (non-negative).
    pub fn padding_idx(&self) -> Option<i64> {
        self.padding_idx
    }

    /// The lookup alone: `F.embedding(ids, weight, padding_idx)`.
    pub fn lookup(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.ws, ids, self.padding_idx.unwrap_or(-1), false, false)
    }

    /// `y` (this part's output on `ids`, possibly scaled) with its LoRA adapter's term
    /// added, scaled by `embed_scale` where the module has one (Gemma); `y` itself
    /// without an adapter.
    pub fn adapt(&self, ids: &Tensor, y: Tensor, embed_scale: Option<&Tensor>) -> Tensor {
        self.lora
            .apply_embedding(ids, y, self.padding_idx, embed_scale)
    }

    /// Reports `y`, this part's output on `ids`, to the tracer.
    pub fn report(&self, ids: &Tensor, y: &Tensor) {
        if self.ctx.traced() {
            self.ctx.leaf(
                || self.name.clone(),
                &self.class,
                &[("weight", &self.ws)],
                ids,
                y,
            );
        }
    }

    /// The model's input embeddings (upstream's `get_input_embeddings()`): `y` (this part's
    /// lookup of `ids`, possibly scaled) [`adapt`](Self::adapt)ed, NEFTune's noise added
    /// while `training` (its forward hook), made to require a gradient after
    /// [`Context::enable_input_require_grads`](crate::Context::enable_input_require_grads),
    /// then [`report`](Self::report)ed.
    pub fn input_forward(
        &self,
        ids: &Tensor,
        y: Tensor,
        embed_scale: Option<&Tensor>,
        training: bool,
    ) -> crate::Result<Tensor> {
        let y = self.adapt(ids, y, embed_scale);
        let y = crate::neftune_post_forward_hook(&self.ctx, y, training)?;
        // `enable_input_require_grads`' hook: `output.requires_grad_(True)`.
        let y = if self.ctx.input_require_grads() && !y.requires_grad() {
            y.f_set_requires_grad(true)?
        } else {
            y
        };
        self.report(ids, &y);
        Ok(y)
    }

    /// The module's forward: [`lookup`](Self::lookup), [`adapt`](Self::adapt), reported.
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        let y = self.adapt(ids, self.lookup(ids), None);
        self.report(ids, &y);
        y
    }
}
