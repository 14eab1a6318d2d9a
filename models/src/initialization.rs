//! Upstream `initialization.py` and `from_pretrained`'s `_initialize_missing_keys`: the
//! weights a checkpoint lacks (a new head on a pretrained body, sizes refused with
//! `ignore_mismatched_sizes`) are drawn from the global generator with each module's
//! `_init_weights`, in module order, and nothing else is drawn: after `set_seed(42)`,
//! `from_pretrained(..., num_labels=2)` gives MiniLM's classifier exactly
//! `torch.empty(2, 384).normal_(0, 0.02)` and leaves the generator right after it.
//!
//! A model's constructor draws every weight (upstream's `Model(config)`). `from_pretrained`
//! builds it inside [`deferred`] instead: each variable is created without drawing (its
//! constant, or zeros for a random init) and its init is recorded; once the checkpoint is
//! loaded, [`initialize_missing`] applies the recorded init to the missing variables only,
//! in creation order (which is upstream's registration order).

use std::cell::RefCell;

use tch::Tensor;
use tch::nn::{self, Init, VarStore};

use crate::error::{Error, Result};

/// A variable's upstream initialisation: its init, and for an embedding with a
/// `padding_idx` the row `_init_weights` zeroes after the draw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VarInit {
    pub(crate) init: Init,
    pub(crate) zero_row: Option<i64>,
}

thread_local! {
    static DEFERRED: RefCell<Option<Vec<(String, VarInit)>>> = const { RefCell::new(None) };
}

/// The init to create `name` under `p` with: `init` itself, or, inside [`deferred`], one
/// that draws nothing (the recorded `init` is applied later if the checkpoint lacks it).
pub(crate) fn init(p: &nn::Path<'_>, name: &str, init: Init) -> Init {
    init_zero_row(p, name, init, None)
}

/// [`init`] for an embedding whose `padding_idx` row is zeroed after the draw (inside
/// [`deferred`], recorded for [`initialize_missing`]; otherwise the caller zeroes it).
pub(crate) fn init_zero_row(
    p: &nn::Path<'_>,
    name: &str,
    init: Init,
    zero_row: Option<i64>,
) -> Init {
    DEFERRED.with(|d| match d.borrow_mut().as_mut() {
        None => init,
        Some(recorded) => {
            recorded.push((p.path(name), VarInit { init, zero_row }));
            match init {
                Init::Const(_) => init,
                _ => Init::Const(0.0),
            }
        }
    })
}

/// `p.var(name, dims, init)` through [`init`].
pub(crate) fn var(p: &nn::Path<'_>, name: &str, dims: &[i64], i: Init) -> Tensor {
    p.var(name, dims, init(p, name, i))
}

/// Whether variables are being created inside [`deferred`] (nothing drawn now).
pub(crate) fn is_deferred() -> bool {
    DEFERRED.with(|d| d.borrow().is_some())
}

/// Runs `build` (a model's constructor) with initialisation deferred; returns what it built
/// and the init of every variable, in creation order.
pub(crate) fn deferred<T>(
    build: impl FnOnce() -> Result<T>,
) -> Result<(T, Vec<(String, VarInit)>)> {
    struct Restore(Option<Vec<(String, VarInit)>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            DEFERRED.with(|d| *d.borrow_mut() = prev);
        }
    }
    let prev = DEFERRED.with(|d| d.borrow_mut().replace(Vec::new()));
    let restore = Restore(prev);
    let built = build();
    let recorded = DEFERRED.with(|d| d.borrow_mut().take()).unwrap_or_default();
    drop(restore);
    Ok((built?, recorded))
}

/// `_initialize_missing_keys`: the variables named in `missing` get their recorded init, in
/// creation order, from the global generator (`normal_(mean, std)` for a normal init, as
/// upstream's `init.normal_`), an embedding's padding row zeroed after.
pub(crate) fn initialize_missing(
    vs: &VarStore,
    inits: &[(String, VarInit)],
    missing: &[String],
) -> Result<()> {
    let vars = vs.variables();
    tch::no_grad(|| -> Result<()> {
        for (name, VarInit { init, zero_row }) in inits {
            if !missing.contains(name) {
                continue;
            }
            let Some(var) = vars.get(name) else {
                continue;
            };
            let mut var = var.shallow_clone();
            match *init {
                Init::Const(c) => {
                    let _ = var.f_fill_(c)?;
                }
                Init::Randn { mean, stdev } => {
                    let _ = var.f_normal_(mean, stdev)?;
                }
                Init::Uniform { lo, up } => {
                    let _ = var.f_uniform_(lo, up)?;
                }
                other => {
                    return Err(Error::InvalidArgument {
                        field: "from_pretrained",
                        detail: format!(
                            "{name}: no upstream initialisation for {other:?}; the checkpoint must hold this weight"
                        ),
                    });
                }
            }
            if let Some(row) = *zero_row {
                let _ = var.f_select(0, row)?.f_zero_()?;
            }
        }
        Ok(())
    })
}
