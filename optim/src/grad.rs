//! Assigning a parameter's gradient, torch's `p.grad = g` / `p.grad = None`.
//!
//! Lets code that computes gradients itself (a sharded data-parallel engine reducing
//! gradients into flat shards, gradient surgery, gradients loaded from elsewhere) hand them
//! to any [`Optimizer`](crate::Optimizer): set the gradients, then call `step()` as after a
//! `backward()`.

use tch::Tensor;

use crate::{Result, ffi};

/// Sets the gradient of `param` (torch's `param.grad = grad`), sharing `grad`'s storage;
/// `None` removes it (`param.grad = None`, freeing its memory). The gradient must have the
/// parameter's shape, dtype and device, else an error as torch raises.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use tchtrain_optim::{GroupSpec, Optimizer, Sgd, SgdConfig, set_grad};
///
/// let p = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
/// set_grad(&p, Some(&Tensor::from_slice(&[1.0f32, -2.0])))?;
/// let mut opt = Sgd::new(vec![GroupSpec::unnamed(vec![p.shallow_clone()])], SgdConfig { lr: 0.5, ..Default::default() })?;
/// opt.step()?;
/// assert_eq!(Vec::<f32>::try_from(&p).unwrap(), [0.5, 2.0]);
/// set_grad(&p, None)?;
/// assert!(!p.grad().defined());
/// # Ok::<(), tchtrain_optim::Error>(())
/// ```
pub fn set_grad(param: &Tensor, grad: Option<&Tensor>) -> Result<()> {
    // The gradient lives on the TensorImpl every handle shares: a shallow clone reaches it.
    let mut handle = param.shallow_clone();
    ffi::set_grad(&mut handle, grad)
}
