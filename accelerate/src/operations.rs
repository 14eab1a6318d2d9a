//! accelerate's `utils/operations.py` pieces the accelerator gathers with:
//! `pad_across_processes` + `gather` in the global batch order, and the concatenation of a
//! process's evaluation tensors (transformers' `nested_concat` with `padding_index=-100`).

use tch::Tensor;
use tchtrain_distributed::{ProcessGroup, ReduceOp};

use crate::error::Result;

/// Upstream `nested_concat` with `padding_index=-100`: concatenates along the first
/// dimension, padding the second dimension to the longest with -100 when they differ.
pub fn concat_padded(tensors: &[Tensor]) -> Result<Tensor> {
    let same = tensors
        .windows(2)
        .all(|w| w[0].size().get(1..) == w[1].size().get(1..));
    if same || tensors.iter().any(|t| t.dim() < 2) {
        return Ok(Tensor::f_cat(tensors, 0)?);
    }
    let max_len = tensors.iter().map(|t| t.size()[1]).max().unwrap_or(0);
    let padded = tensors
        .iter()
        .map(|t| {
            let mut size = t.size();
            let pad = max_len - size[1];
            if pad == 0 {
                return Ok(t.shallow_clone());
            }
            size[1] = pad;
            let fill = Tensor::f_full(&size, -100.0, (t.kind(), t.device()))?;
            Ok(Tensor::f_cat(&[t.shallow_clone(), fill], 1)?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::f_cat(&padded, 0)?)
}

/// All-gathers `local` (`[steps * rows_per_batch, ...]` on each process) and reorders it
/// from rank-major to the global batch order; keeps the first `keep` rows when given.
pub(crate) fn gather_in_batch_order(
    pg: &mut ProcessGroup,
    local: &Tensor,
    rows_per_batch: i64,
    keep: Option<i64>,
) -> Result<Tensor> {
    let world = i64::from(pg.world_size());
    // The group's device (NCCL: this rank's GPU; evaluation lists may sit on the CPU).
    let mut local = local.f_to_device(pg.device())?.f_contiguous()?;
    if local.dim() >= 2 {
        // pad_across_processes(dim=1, pad_index=-100)
        let len = local.size()[1];
        let mut max = Tensor::f_from_slice(&[len])?.f_to_device(pg.device())?;
        pg.all_reduce(&mut max, ReduceOp::Max)?;
        let max = max.f_int64_value(&[0])?;
        if max > len {
            let mut size = local.size();
            size[1] = max - len;
            let fill = Tensor::f_full(&size, -100.0, (local.kind(), local.device()))?;
            local = Tensor::f_cat(&[local, fill], 1)?.f_contiguous()?;
        }
    }
    let size = local.size();
    let rows = size.first().copied().unwrap_or(1);
    let mut out_size = size.clone();
    if out_size.is_empty() {
        out_size.push(world);
    } else {
        out_size[0] = rows * world;
    }
    let mut out = Tensor::f_empty(&out_size, (local.kind(), local.device()))?;
    pg.all_gather_into(&mut out, &local)?;
    let steps = if rows_per_batch > 0 && rows % rows_per_batch == 0 {
        rows / rows_per_batch
    } else {
        0
    };
    let mut ordered = if steps > 0 && !size.is_empty() {
        // [world, steps, batch, ...] -> [steps, world, batch, ...]
        let mut split = vec![world, steps, rows_per_batch];
        split.extend_from_slice(&size[1..]);
        out.f_view(split.as_slice())?
            .f_transpose(0, 1)?
            .f_contiguous()?
            .f_view(out_size.as_slice())?
    } else {
        log::warn!(
            "gather_for_metrics: a process's evaluation rows ({rows}) are not whole batches of {rows_per_batch}; gathered in rank order"
        );
        out
    };
    if let Some(keep) = keep
        && ordered.dim() >= 1
        && keep < ordered.size()[0]
    {
        ordered = ordered.f_narrow(0, 0, keep)?;
    }
    Ok(ordered)
}
