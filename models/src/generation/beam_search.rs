//! Upstream's `_beam_search` (transformers 5.23, the vectorised form): beam search and
//! beam sampling for decoder-only models, op for op: the log-softmax of each step's float32
//! logits through the processors, plus the running beam scores; the best (or sampled)
//! `max(2, 1 + eos ids) · num_beams` continuations; the finished ones scored by
//! `sum of log-probs / generated length ** length_penalty` into the kept hypotheses; the
//! running beams for the next step and the cache reordered to them; upstream's early-stop
//! heuristic (`early_stopping` false, true or `"never"`).

use tch::{Kind, Tensor};

use super::configuration_utils::EarlyStopping;
use super::logits_process::LogitsProcessor;
use super::utils::Decoding;
use crate::Result;
use crate::modeling_utils::TrainableModel;

/// What one beam search needs besides the model and the (expanded) inputs.
pub(crate) struct BeamSettings<'a> {
    pub num_beams: i64,
    pub max_length: i64,
    pub eos: &'a [i64],
    pub pad: Option<i64>,
    pub do_sample: bool,
    pub length_penalty: f64,
    pub early_stopping: EarlyStopping,
    pub num_return_sequences: i64,
    pub keep_scores: bool,
}

/// The result: the best `num_return_sequences` hypotheses per prompt, their scores, and
/// each step's processed log-probabilities.
pub(crate) struct BeamOutput {
    pub sequences: Tensor,
    pub sequences_scores: Tensor,
    pub scores: Vec<Tensor>,
}

/// `[batch * beams, ...]` to `[batch, beams, ...]`.
fn unflatten(t: &Tensor, batch: i64, beams: i64) -> Result<Tensor> {
    let mut shape = vec![batch, beams];
    shape.extend_from_slice(&t.size()[1..]);
    Ok(t.f_reshape(shape)?)
}

/// `[batch, beams, ...]` to `[batch * beams, ...]`.
fn flatten(t: &Tensor) -> Result<Tensor> {
    let s = t.size();
    let mut shape = vec![s[0] * s[1]];
    shape.extend_from_slice(&s[2..]);
    Ok(t.f_reshape(shape)?)
}

/// `_gather_beams`: `take_along_dim(tensor, indices, dim=1)` with the indices broadcast.
fn gather_beams(t: &Tensor, indices: &Tensor) -> Result<Tensor> {
    let mut idx = indices.shallow_clone();
    while idx.dim() < t.dim() {
        idx = idx.unsqueeze(-1);
    }
    Ok(t.f_take_along_dim(&idx, Some(1))?)
}

/// Runs the search on `input_ids` `[batch * beams, prompt]` (each prompt repeated per beam),
/// with what `decoding` carries (mask, positions, encoder output) expanded alike.
pub(crate) fn beam_search(
    model: &dyn TrainableModel,
    input_ids: &Tensor,
    mut decoding: Decoding,
    processors: &[LogitsProcessor],
    s: &BeamSettings<'_>,
) -> Result<BeamOutput> {
    let device = input_ids.device();
    let nb = s.num_beams;
    let (flat_batch, prompt_len) = (input_ids.size()[0], input_ids.size()[1]);
    let batch = flat_batch / nb;
    let n_eos = s.eos.len() as i64;
    let beams_to_keep = 2.max(1 + n_eos) * nb;
    let top_num_beam_mask = Tensor::f_cat(
        &[
            Tensor::f_ones([nb], (Kind::Bool, device))?,
            Tensor::f_zeros([beams_to_keep - nb], (Kind::Bool, device))?,
        ],
        0,
    )?;
    // `pad_token_id or eos_token_id[0] if eos_token_id is not None else -1`: a pad id of 0
    // counts as unset there.
    let fill = if s.eos.is_empty() {
        -1
    } else {
        s.pad.filter(|p| *p != 0).unwrap_or(s.eos[0])
    };
    let max_length = s.max_length;
    let mut running_sequences =
        Tensor::f_full([batch, nb, max_length], fill, (Kind::Int64, device))?;
    running_sequences
        .f_narrow(2, 0, prompt_len)?
        .f_copy_(&unflatten(input_ids, batch, nb)?)?;
    let mut sequences = running_sequences.f_detach_copy()?;
    let mut running_beam_scores = Tensor::f_zeros([batch, nb], (Kind::Float, device))?;
    let _ = running_beam_scores.f_narrow(1, 1, nb - 1)?.f_fill_(-1e9)?;
    let mut beam_scores = Tensor::f_full([batch, nb], -1e9, (Kind::Float, device))?;
    let mut is_sent_finished = Tensor::f_zeros([batch, nb], (Kind::Bool, device))?;
    let mut heuristic_unsatisfied = Tensor::f_ones([batch, 1], (Kind::Bool, device))?;
    let mut running_beam_indices = Tensor::f_full(
        [batch, nb, max_length - prompt_len],
        -1,
        (Kind::Int, device),
    )?;
    let mut beam_indices = running_beam_indices.f_detach_copy()?;
    let eos_ids = Tensor::f_from_slice(s.eos)?.f_to_device(device)?;
    let mut all_scores = Vec::new();
    let mut cur_len = prompt_len;
    loop {
        let flat_running = flatten(&running_sequences.f_narrow(2, 0, cur_len)?)?;
        let logits = decoding.step(model, &flat_running)?;
        let mut log_probs = logits.f_log_softmax(-1, Kind::Float)?;
        for p in processors {
            log_probs = p.process(&flat_running, log_probs)?;
        }
        if s.keep_scores {
            all_scores.push(log_probs.f_detach_copy()?);
        }
        let vocab = log_probs.size()[1];
        let accumulated = (unflatten(&log_probs, batch, nb)? + running_beam_scores.unsqueeze(2))
            .f_reshape([batch, -1])?;

        // `_get_top_k_continuations`.
        let (topk_log_probs, topk_indices) = if s.do_sample {
            let idx = accumulated
                .f_softmax(-1, Kind::Float)?
                .f_multinomial(beams_to_keep, false)?;
            (accumulated.f_gather(1, &idx, false)?, idx)
        } else {
            accumulated.f_topk(beams_to_keep, -1, true, true)?
        };
        let topk_current_beam = topk_indices.f_floor_divide_scalar(vocab)?;
        let topk_running_beam_indices = gather_beams(&running_beam_indices, &topk_current_beam)?;
        let topk_running_sequences = gather_beams(&running_sequences, &topk_current_beam)?;
        let topk_ids = topk_indices.f_remainder(vocab)?;
        topk_running_sequences
            .f_select(2, cur_len)?
            .f_copy_(&topk_ids)?;
        let batch_offset = Tensor::f_arange(batch, (Kind::Int64, device))?.f_view([-1, 1])? * nb;
        topk_running_beam_indices
            .f_select(2, cur_len - prompt_len)?
            .f_copy_(&(&topk_current_beam + batch_offset))?;

        // The stopping criteria on every candidate: the length, an end-of-sequence id.
        let candidates = topk_running_sequences.f_narrow(2, 0, cur_len + 1)?;
        let mut stop = Tensor::f_full(
            [batch, beams_to_keep],
            i64::from(cur_len + 1 >= max_length),
            (Kind::Bool, device),
        )?;
        if !s.eos.is_empty() {
            let last = candidates.f_select(2, cur_len)?;
            stop = stop.f_logical_or(&Tensor::f_isin(&last, &eos_ids, false, false)?)?;
        }
        let hits = stop;

        // `_get_running_beams_for_next_iteration`.
        let topk_running_log_probs = &topk_log_probs + hits.f_to_kind(Kind::Float)? * -1.0e9;
        let (_, next_topk) = topk_running_log_probs.f_topk(nb, -1, true, true)?;
        running_sequences = gather_beams(&topk_running_sequences, &next_topk)?;
        running_beam_scores = gather_beams(&topk_running_log_probs, &next_topk)?;
        running_beam_indices = gather_beams(&topk_running_beam_indices, &next_topk)?;

        // `_update_finished_beams`.
        let did_finish = hits.f_logical_and(&top_num_beam_mask.unsqueeze(0))?;
        let generated = (cur_len + 1 - prompt_len) as f64;
        let mut finished_scores = &topk_log_probs / generated.powf(s.length_penalty);
        let full = is_sent_finished
            .f_all_dims(&[-1i64][..], true)?
            .f_logical_and_(&Tensor::from(s.early_stopping == EarlyStopping::True))?;
        // In place, as upstream's `+=`.
        let _ = finished_scores.f_add_(&(full.f_to_kind(Kind::Float)? * -1.0e9))?;
        let _ = finished_scores.f_add_(
            &(heuristic_unsatisfied
                .f_logical_not()?
                .f_to_kind(Kind::Float)?
                * -1.0e9),
        )?;
        let _ = finished_scores
            .f_add_(&(did_finish.f_logical_not()?.f_to_kind(Kind::Float)? * -1.0e9))?;
        let merged_sequences = Tensor::f_cat(&[&sequences, &topk_running_sequences], 1)?;
        let merged_scores = Tensor::f_cat(&[&beam_scores, &finished_scores], 1)?;
        let merged_indices = Tensor::f_cat(&[&beam_indices, &topk_running_beam_indices], 1)?;
        let merged_finished = Tensor::f_cat(&[&is_sent_finished, &did_finish], 1)?;
        let (_, keep) = merged_scores.f_topk(nb, -1, true, true)?;
        sequences = gather_beams(&merged_sequences, &keep)?;
        beam_scores = gather_beams(&merged_scores, &keep)?;
        beam_indices = gather_beams(&merged_indices, &keep)?;
        is_sent_finished = gather_beams(&merged_finished, &keep)?;

        if let Some(c) = &decoding.cache {
            let beam_idx = flatten(&running_beam_indices.f_select(2, cur_len - prompt_len)?)?;
            c.reorder_cache(&beam_idx)?;
        }
        cur_len += 1;

        // `_check_early_stop_heuristic`.
        let best_len = if s.early_stopping == EarlyStopping::Never && s.length_penalty > 0.0 {
            max_length - prompt_len
        } else {
            cur_len - prompt_len
        };
        let best_possible =
            running_beam_scores.f_narrow(1, 0, 1)? / (best_len as f64).powf(s.length_penalty);
        let (worst, _) = beam_scores.f_min_dim(1, true)?;
        let worst = worst.f_where_self(&is_sent_finished, &Tensor::from(-1.0e9f32))?;
        heuristic_unsatisfied = heuristic_unsatisfied.f_logical_and(
            &best_possible
                .f_gt_tensor(&worst)?
                .f_any_dims(&[-1i64][..], true)?,
        )?;
        // `_beam_search_has_unfinished_sequences`.
        let improvement_possible = bool::try_from(heuristic_unsatisfied.f_any()?)?;
        let all_finished = bool::try_from(is_sent_finished.f_all()?)?;
        let open_beam = !(all_finished && s.early_stopping == EarlyStopping::True);
        let valid_continuations = !bool::try_from(hits.f_all()?)?;
        if !(improvement_possible && open_beam && valid_continuations) {
            break;
        }
    }
    let nrs = s.num_return_sequences;
    let sequences = flatten(&sequences.f_narrow(1, 0, nrs)?)?;
    let sequences_scores = beam_scores.f_narrow(1, 0, nrs)?.f_reshape([-1])?;
    let beam_indices = flatten(&beam_indices.f_narrow(1, 0, nrs)?)?;
    let generated = i64::try_from(
        (beam_indices + 1)
            .f_to_kind(Kind::Bool)?
            .f_sum_dim_intlist(&[1i64][..], false, Kind::Int64)?
            .f_max()?,
    )?;
    Ok(BeamOutput {
        sequences: sequences.f_narrow(1, 0, prompt_len + generated)?,
        sequences_scores,
        scores: all_scores,
    })
}
