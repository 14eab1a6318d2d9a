//! Upstream `activations.py`: the `ACT2FN` entries the supported architectures use.

use tch::Tensor;

use crate::context::Context;
use crate::error::{Error, Result};

/// Upstream `ACT2FN` entries used by the supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
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
    pub fn parse(name: &str, field: &'static str) -> Result<Self> {
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
    pub fn class_name(self) -> &'static str {
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

    /// [`apply`](Self::apply), reported to the tracer of `ctx` as the module `name`.
    pub fn apply_traced(self, ctx: &Context, x: &Tensor, name: impl FnOnce() -> String) -> Tensor {
        let y = self.apply(x);
        ctx.leaf(name, self.class_name(), &[], x, &y);
        y
    }

    /// The function.
    pub fn apply(self, x: &Tensor) -> Tensor {
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
