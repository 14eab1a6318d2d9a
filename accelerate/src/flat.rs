//! `FlatBuffer`: a set of parameters laid out in one flat, padded 1-D buffer, cut into
//! `world_size` equal contiguous slices, one owned by each rank.
//!
//! A buffer holds parameters of one dtype, one optimizer param group and one wrap unit.
//! Every rank's slice has the same length (`shard_numel`); rank `r` owns elements
//! `[r * shard_numel, (r + 1) * shard_numel)`. Two layouts:
//!
//! * contiguous (DeepSpeed's flat `bit16_groups` partitions, FSDP1's `FlatParameter`): the
//!   parameters end to end, padded with zeros to a multiple of the world size; a rank's
//!   slice cuts through parameters wherever it falls;
//! * per parameter ([`FlatLayout::per_parameter`], FSDP2's `fully_shard`): every parameter
//!   is chunked along dim 0 as `torch.chunk(param, world_size)` (chunks of
//!   `ceil(dim0 / world_size)` rows, the last ones short or empty, each padded to the full
//!   chunk), and rank `r`'s slice is chunk `r` of every parameter, in order: FSDP2's
//!   reduce-scatter input (`chunk_cat`) and all-gather output. Each rank then holds the
//!   local tensor of each parameter's `Shard(0)` DTensor ([`FlatLayout::local_chunk`]).

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
    /// Per-parameter layout: the dim-0 rows of each rank's chunk (`ceil(dim0 /
    /// world_size)`); `offset` is then the chunk's place within every rank's slice. 0 in a
    /// contiguous layout.
    #[serde(default)]
    pub chunk_rows: i64,
}

impl FlatParamInfo {
    /// `(dim0, elements per dim-0 row)`; a 0-d parameter is one row of one element.
    fn rows(&self) -> (i64, i64) {
        match self.shape.first() {
            None => (1, 1),
            Some(&0) => (0, 0),
            Some(&d) => (d, self.numel / d),
        }
    }
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
    /// FSDP2's per-parameter dim-0 sharding (see the module docs); false: contiguous.
    #[serde(default)]
    pub per_parameter: bool,
}

impl FlatLayout {
    fn world(&self) -> i64 {
        if self.shard_numel == 0 {
            1
        } else {
            self.padded_numel / self.shard_numel
        }
    }

    fn info(&self, i: usize) -> Result<&FlatParamInfo> {
        self.params.get(i).ok_or_else(|| Error::Sharding {
            detail: format!("no parameter {i} in a buffer of {}", self.params.len()),
        })
    }

    /// Parameter `i`'s values in `full` (a `[padded_numel]` tensor), in its shape: a view in
    /// a contiguous layout, a copy in a per-parameter one.
    pub fn piece(&self, full: &Tensor, i: usize) -> Result<Tensor> {
        let info = self.info(i)?;
        if !self.per_parameter {
            return Ok(full
                .f_narrow(0, info.offset, info.numel)?
                .f_view(info.shape.as_slice())?);
        }
        let (dim0, rest) = info.rows();
        let world = self.world();
        Ok(full
            .f_view([world, self.shard_numel])?
            .f_narrow(1, info.offset, info.chunk_rows * rest)?
            .f_contiguous()?
            .f_view([world * info.chunk_rows, rest])?
            .f_narrow(0, 0, dim0)?
            .f_reshape(info.shape.as_slice())?)
    }

    /// Writes `value` (parameter `i`'s values, any shape of its numel) into its place in
    /// `full` (a contiguous `[padded_numel]` tensor); the padding is left as it is.
    pub fn place(&self, full: &Tensor, i: usize, value: &Tensor) -> Result<()> {
        let info = self.info(i)?;
        let value = value.f_reshape([-1])?.f_to_kind(full.kind())?;
        if !self.per_parameter {
            full.f_narrow(0, info.offset, info.numel)?.f_copy_(&value)?;
            return Ok(());
        }
        let (dim0, rest) = info.rows();
        let world = self.world();
        let padded_rows = world * info.chunk_rows;
        let rows = value.f_view([dim0, rest])?;
        let rows = if padded_rows > dim0 {
            let pad = Tensor::f_zeros([padded_rows - dim0, rest], (full.kind(), full.device()))?;
            Tensor::f_cat(&[rows.f_to_device(full.device())?, pad], 0)?
        } else {
            rows
        };
        full.f_view([world, self.shard_numel])?
            .f_narrow(1, info.offset, info.chunk_rows * rest)?
            .f_copy_(&rows.f_view([world, info.chunk_rows * rest])?)?;
        Ok(())
    }

    /// Per-parameter layout: parameter `i`'s unpadded chunk on `rank` within that rank's
    /// slice `shard` (a view; empty where the parameter has no rows left for the rank).
    pub fn local_chunk(&self, shard: &Tensor, i: usize, rank: i64) -> Result<Tensor> {
        let info = self.info(i)?;
        let (dim0, rest) = info.rows();
        let rows = (dim0 - rank * info.chunk_rows).clamp(0, info.chunk_rows);
        Ok(shard.f_narrow(0, info.offset, rows * rest)?)
    }
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
    /// Lays `params` (`(name, variable)`, one dtype and device) out for `world_size`
    /// ranks: end to end and padded, or chunked per parameter with `per_parameter`.
    pub fn new(
        unit: usize,
        group: usize,
        params: Vec<(String, Tensor)>,
        world_size: i64,
        per_parameter: bool,
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
        let mut numel_total = 0i64;
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
            let mut info = FlatParamInfo {
                name,
                shape: var.size(),
                offset,
                numel,
                chunk_rows: 0,
            };
            if per_parameter {
                let (dim0, rest) = info.rows();
                info.chunk_rows = (dim0 + world - 1) / world;
                offset += info.chunk_rows * rest;
            } else {
                offset += numel;
            }
            numel_total += numel;
            infos.push(info);
            vars.push(var);
        }
        let shard_numel = if per_parameter {
            offset
        } else {
            (offset + world - 1) / world
        };
        Ok(Self {
            layout: FlatLayout {
                unit,
                group,
                dtype,
                numel: numel_total,
                padded_numel: shard_numel * world,
                shard_numel,
                params: infos,
                per_parameter,
            },
            vars,
            kind,
            device,
        })
    }

    /// The variables' current values (or `.grad`s with `grads`) concatenated and
    /// zero-padded: a new `[padded_numel]` tensor. A missing gradient counts as zeros.
    pub fn flatten(&self, grads: bool) -> Result<Tensor> {
        if self.layout.per_parameter {
            return self.flatten_per_parameter(grads);
        }
        let mut pieces = Vec::with_capacity(self.vars.len() + 1);
        for (v, info) in self.vars.iter().zip(&self.layout.params) {
            match Self::value_of(v, info, grads)? {
                None => pieces.push(Tensor::f_zeros([info.numel], (self.kind, self.device))?),
                Some(t) => pieces.push(t.f_reshape([-1])?),
            }
        }
        let pad = self.layout.padded_numel - self.layout.numel;
        if pad > 0 {
            pieces.push(Tensor::f_zeros([pad], (self.kind, self.device))?);
        }
        Ok(Tensor::f_cat(&pieces, 0)?)
    }

    fn flatten_per_parameter(&self, grads: bool) -> Result<Tensor> {
        let full = Tensor::f_zeros([self.layout.padded_numel], (self.kind, self.device))?;
        for (i, (v, info)) in self.vars.iter().zip(&self.layout.params).enumerate() {
            if let Some(t) = Self::value_of(v, info, grads)? {
                self.layout.place(&full, i, &t)?;
            }
        }
        Ok(full)
    }

    /// `v`'s value (or `.grad` with `grads`), `None` for a missing gradient; an error when
    /// it does not hold the layout's element count (a released parameter).
    fn value_of(v: &Tensor, info: &FlatParamInfo, grads: bool) -> Result<Option<Tensor>> {
        let t = if grads { v.grad() } else { v.f_detach()? };
        if !t.defined() {
            return Ok(None);
        }
        if t.numel() as i64 != info.numel {
            return Err(Error::Sharding {
                detail: format!(
                    "`{}` holds {} elements, its flat layout {} (parameters released? gather them first)",
                    info.name,
                    t.numel(),
                    info.numel
                ),
            });
        }
        Ok(Some(t))
    }

    /// `rank`'s slice of a `[padded_numel]` tensor (a view).
    pub fn slice_of(&self, flat: &Tensor, rank: i64) -> Result<Tensor> {
        let n = self.layout.shard_numel;
        Ok(flat.f_narrow(0, rank * n, n)?)
    }

    /// Parameter `i`'s piece of `full` (a `[padded_numel]` tensor), in its shape.
    pub fn piece(&self, full: &Tensor, i: usize) -> Result<Tensor> {
        self.layout.piece(full, i)
    }

    /// Points every variable at its piece of `full` (a `[padded_numel]` tensor): the
    /// model computes with `full`'s storage from now on (`param.data = view`; in a
    /// per-parameter layout, a copy of its piece, as FSDP2 copies out of the all-gather).
    pub fn materialise(&mut self, full: &Tensor) -> Result<()> {
        let layout = &self.layout;
        tch::no_grad(|| -> Result<()> {
            for (i, v) in self.vars.iter_mut().enumerate() {
                v.f_set_data(&layout.piece(full, i)?)?;
            }
            Ok(())
        })
    }

    /// Copies each variable's piece of `full` into the variable (its storage is kept).
    pub fn copy_into_vars(&mut self, full: &Tensor) -> Result<()> {
        let layout = &self.layout;
        tch::no_grad(|| -> Result<()> {
            for (i, v) in self.vars.iter_mut().enumerate() {
                v.f_copy_(&layout.piece(full, i)?)?;
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
