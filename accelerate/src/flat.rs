//! `FlatBuffer`: a set of parameters laid end to end in one flat, padded 1-D buffer, cut
//! into `world_size` equal contiguous slices, one owned by each rank (DeepSpeed's flat
//! `bit16_groups` partitions, FSDP's `FlatParameter` shards).
//!
//! A buffer holds parameters of one dtype, one optimizer param group and one wrap unit.
//! Its length is padded with zeros up to a multiple of the world size, so every rank's
//! slice has the same length (`shard_numel`); rank `r` owns elements
//! `[r * shard_numel, (r + 1) * shard_numel)`.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// Where one parameter lies in its flat buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlatParamInfo {
    /// The parameter's `state_dict` name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// First element in the flat buffer.
    pub offset: i64,
    /// Number of elements.
    pub numel: i64,
}

/// The layout of one flat buffer (what a checkpoint records to consolidate shards).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlatLayout {
    /// Wrap unit (0-based; the root unit is the last).
    pub unit: usize,
    /// Optimizer param group.
    pub group: usize,
    /// The dtype, as safetensors names it (`F32`, `BF16`, `F16`, `F64`).
    pub dtype: String,
    /// Elements of all parameters.
    pub numel: i64,
    /// `numel` rounded up to a multiple of the world size.
    pub padded_numel: i64,
    /// Elements per rank (`padded_numel / world_size`).
    pub shard_numel: i64,
    /// The parameters, in buffer order.
    pub params: Vec<FlatParamInfo>,
}

/// A live flat buffer: its layout and handles on the model's variables.
#[derive(Debug)]
pub struct FlatBuffer {
    /// The layout.
    pub layout: FlatLayout,
    /// The model's variables (same order as `layout.params`; they share their TensorImpl
    /// with the model, so `set_data` on them changes what the model computes with).
    pub vars: Vec<Tensor>,
    /// The dtype.
    pub kind: Kind,
    /// The device.
    pub device: Device,
}

/// The safetensors name of a dtype.
pub fn dtype_name(kind: Kind) -> Result<&'static str> {
    Ok(match kind {
        Kind::Float => "F32",
        Kind::Double => "F64",
        Kind::Half => "F16",
        Kind::BFloat16 => "BF16",
        other => {
            return Err(Error::Sharding {
                detail: format!(
                    "parameters of dtype {other:?} cannot be sharded (floating point only)"
                ),
            });
        }
    })
}

impl FlatBuffer {
    /// Lays `params` (`(name, variable)`, one dtype and device) end to end, padded for
    /// `world_size` ranks.
    pub fn new(
        unit: usize,
        group: usize,
        params: Vec<(String, Tensor)>,
        world_size: i64,
    ) -> Result<Self> {
        let first = params.first().ok_or_else(|| Error::Sharding {
            detail: "a flat buffer needs at least one parameter".into(),
        })?;
        let (kind, device) = (first.1.kind(), first.1.device());
        let dtype = dtype_name(kind)?.to_string();
        let world = world_size.max(1);
        let mut infos = Vec::with_capacity(params.len());
        let mut vars = Vec::with_capacity(params.len());
        let mut offset = 0i64;
        for (name, var) in params {
            if var.kind() != kind || var.device() != device {
                return Err(Error::Sharding {
                    detail: format!(
                        "`{name}` is {:?} on {:?}, the buffer {kind:?} on {device:?}",
                        var.kind(),
                        var.device()
                    ),
                });
            }
            let numel = var.numel() as i64;
            infos.push(FlatParamInfo {
                name,
                shape: var.size(),
                offset,
                numel,
            });
            vars.push(var);
            offset += numel;
        }
        let shard_numel = (offset + world - 1) / world;
        Ok(Self {
            layout: FlatLayout {
                unit,
                group,
                dtype,
                numel: offset,
                padded_numel: shard_numel * world,
                shard_numel,
                params: infos,
            },
            vars,
            kind,
            device,
        })
    }

    /// The variables' current values (or `.grad`s with `grads`) concatenated and
    /// zero-padded: a new `[padded_numel]` tensor. A missing gradient counts as zeros.
    pub fn flatten(&self, grads: bool) -> Result<Tensor> {
        let mut pieces = Vec::with_capacity(self.vars.len() + 1);
        for (v, info) in self.vars.iter().zip(&self.layout.params) {
            let t = if grads { v.grad() } else { v.f_detach()? };
            if !t.defined() {
                pieces.push(Tensor::f_zeros([info.numel], (self.kind, self.device))?);
            } else if t.numel() as i64 != info.numel {
                return Err(Error::Sharding {
                    detail: format!(
                        "`{}` holds {} elements, its flat layout {} (parameters released? gather them first)",
                        info.name,
                        t.numel(),
                        info.numel
                    ),
                });
            } else {
                pieces.push(t.f_reshape([-1])?);
            }
        }
        let pad = self.layout.padded_numel - self.layout.numel;
        if pad > 0 {
            pieces.push(Tensor::f_zeros([pad], (self.kind, self.device))?);
        }
        Ok(Tensor::f_cat(&pieces, 0)?)
    }

    /// `rank`'s slice of a `[padded_numel]` tensor (a view).
    pub fn slice_of(&self, flat: &Tensor, rank: i64) -> Result<Tensor> {
        let n = self.layout.shard_numel;
        Ok(flat.f_narrow(0, rank * n, n)?)
    }

    /// Points every variable at its piece of `full` (a `[padded_numel]` tensor): the
    /// model computes with `full`'s storage from now on (`param.data = view`).
    pub fn materialise(&mut self, full: &Tensor) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for (v, info) in self.vars.iter_mut().zip(&self.layout.params) {
                let view = full
                    .f_narrow(0, info.offset, info.numel)?
                    .f_view(info.shape.as_slice())?;
                v.f_set_data(&view)?;
            }
            Ok(())
        })
    }

    /// Copies each variable's piece of `full` into the variable (its storage is kept).
    pub fn copy_into_vars(&mut self, full: &Tensor) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for (v, info) in self.vars.iter_mut().zip(&self.layout.params) {
                let view = full
                    .f_narrow(0, info.offset, info.numel)?
                    .f_view(info.shape.as_slice())?;
                v.f_copy_(&view)?;
            }
            Ok(())
        })
    }

    /// Releases the variables' storage (`param.data = torch.empty(0)`): they hold no
    /// elements until [`FlatBuffer::materialise`] points them at a gathered buffer again.
    pub fn release(&mut self) -> Result<()> {
        let empty = Tensor::f_empty([0], (self.kind, self.device))?;
        tch::no_grad(|| -> Result<()> {
            for v in &mut self.vars {
                v.f_set_data(&empty)?;
            }
            Ok(())
        })
    }

    /// Bytes the variables hold now (0 once released).
    pub fn materialised_bytes(&self) -> usize {
        self.vars
            .iter()
            .map(|v| v.numel() * self.kind.elt_size_in_bytes())
            .sum()
    }

    /// Bytes the variables' gradients hold now.
    pub fn grad_bytes(&self) -> usize {
        self.vars
            .iter()
            .map(|v| {
                let g = v.grad();
                if g.defined() {
                    g.numel() * self.kind.elt_size_in_bytes()
                } else {
                    0
                }
            })
            .sum()
    }
}
