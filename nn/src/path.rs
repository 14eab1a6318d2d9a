//! [`Path`]: where a part is built. Its components are the `state_dict` key of the part's
//! variables and the part's upstream module name; it carries the model's [`Context`].

use std::ops::{Deref, Div};

use tch::nn::{self, VarStore};

use crate::context::Context;

/// A `tch` variable path with the model's [`Context`] (candle's `VarBuilder` idea). It
/// dereferences to `tch::nn::Path`, so `p.var(...)` and `p.device()` work as in tch.
#[derive(Debug)]
pub struct Path<'a> {
    inner: nn::Path<'a>,
    components: Vec<String>,
    vs: &'a VarStore,
    ctx: Context,
}

impl<'a> Path<'a> {
    /// The root of `vs`, for a model whose parts share `ctx`.
    pub fn root(vs: &'a VarStore, ctx: &Context) -> Self {
        Self {
            inner: vs.root(),
            components: Vec::new(),
            vs,
            ctx: ctx.clone(),
        }
    }

    /// The model's context.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The module name this path stands for (`model.layers.0.self_attn.q_proj`; `""` at
    /// the root).
    pub fn name(&self) -> String {
        self.components.join(".")
    }

    /// The same path as a plain `tch` one (for tch's own builders).
    pub fn tch(&self) -> nn::Path<'a> {
        self.components
            .iter()
            .fold(self.vs.root(), |p, c| p.sub(c.as_str()))
    }

    /// The sub-path `s`.
    pub fn sub<T: ToString>(&self, s: T) -> Path<'a> {
        let s = s.to_string();
        let mut components = self.components.clone();
        components.push(s.clone());
        Path {
            inner: self.inner.sub(s),
            components,
            vs: self.vs,
            ctx: self.ctx.clone(),
        }
    }
}

impl Clone for Path<'_> {
    fn clone(&self) -> Self {
        Self {
            inner: self.tch(),
            components: self.components.clone(),
            vs: self.vs,
            ctx: self.ctx.clone(),
        }
    }
}

impl<'a> Deref for Path<'a> {
    type Target = nn::Path<'a>;

    fn deref(&self) -> &nn::Path<'a> {
        &self.inner
    }
}

impl<'a, T: ToString> Div<T> for &Path<'a> {
    type Output = Path<'a>;

    fn div(self, rhs: T) -> Path<'a> {
        self.sub(rhs)
    }
}

impl<'a, T: ToString> Div<T> for Path<'a> {
    type Output = Path<'a>;

    fn div(self, rhs: T) -> Path<'a> {
        self.sub(rhs)
    }
}
