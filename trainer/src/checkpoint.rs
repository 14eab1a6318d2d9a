//! Checkpoints in upstream's layout, `output_dir/checkpoint-{global_step}/`:
//!
//! | file | content |
//! |---|---|
//! | `model.safetensors`, `config.json` | `save_pretrained` (Python's `from_pretrained` loads them) |
//! | `trainer_state.json` | upstream's schema, byte-compatible |
//! | `training_args.json` | the arguments as JSON (upstream pickles `training_args.bin`) |
//! | `optimizer.safetensors` + `optimizer.json` | the optimizer state (upstream: `optimizer.pt`) |
//! | `scheduler.json` | the scheduler state (upstream: `scheduler.pt`) |
//! | `rng_state.json` | the data order's seed and position |
//! | `rng_state.safetensors` | libtorch's default generators: `cpu` (and `cuda` on a GPU), as upstream's `rng_state.pth` keys |
//! | `optimizer.pt`, `scheduler.pt`, `scaler.pt`, `rng_state.pth` | upstream's own files, so that Python's Trainer resumes this checkpoint (see `torch_checkpoint.rs`); read in place of ours when a checkpoint written by Python lacks ours |
//!
//! A checkpoint is written into `tmp-checkpoint-{step}/`, its files and the folder are
//! fsynced, it is renamed to `checkpoint-{step}` and the parent folder is fsynced: a crash
//! or power loss never leaves a half-written `checkpoint-N`. Rotation deletes older
//! checkpoints only after that. A write that fails (the disk full, a file-size limit, a
//! read-only folder) removes the partial folder and stops the training with
//! [`Error::CheckpointSave`] (see `save_failure.rs`). Resuming restores the weights, the
//! optimizer and scheduler, the trainer state and callbacks, and the data position (the
//! sampler's order is a function of its seed and the epoch, the batches already used are
//! skipped), and libtorch's default generators (dropout masks, unseeded collators) at the
//! point upstream's `_load_rng_state` restores them: a resumed run equals the uninterrupted
//! one exactly, dropout on. In a data-parallel run, rank 0 writes the one generator file and
//! every rank restores it (upstream writes `rng_state_{rank}.pth` per process, which rank 0
//! writes here for every rank: the ranks start from the same seed and draw the same
//! amounts, so their states agree).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};
use tchtrain_models::{TrainableModel, read_checkpoint};
use tchtrain_optim::{OPTIMIZER_STATE_NAME, SCHEDULER_NAME};

use crate::error::{Error, Result};
use crate::trainer::Trainer;

/// Prefix of checkpoint folders (`checkpoint-{step}`).
pub const PREFIX_CHECKPOINT_DIR: &str = "checkpoint";
/// The trainer state file of a checkpoint.
pub const TRAINER_STATE_NAME: &str = "trainer_state.json";
/// The training arguments file of a checkpoint.
pub const TRAINING_ARGS_NAME: &str = "training_args.json";
/// The data-order state file of a checkpoint.
pub const RNG_STATE_NAME: &str = "rng_state.json";

/// libtorch's generator states in a checkpoint (upstream: `rng_state.pth`'s `cpu` / `cuda`).
pub const RNG_GENERATOR_STATE_NAME: &str = "rng_state.safetensors";

/// Writes the default generators' states (`cpu`, and `cuda` when training on a GPU) into
/// `dir/rng_state.safetensors` (upstream `_save_rng_state`).
pub(crate) fn save_generator_states(dir: &Path, device: Device) -> Result<()> {
    let mut named = vec![("cpu", tchtrain_accelerate::get_rng_state(Device::Cpu)?)];
    if device.is_cuda() {
        named.push(("cuda", tchtrain_accelerate::get_rng_state(device)?));
    }
    let path = dir.join(RNG_GENERATOR_STATE_NAME);
    Tensor::write_safetensors(&named, &path).map_err(|e| Error::InvalidCheckpoint {
        dir: dir.to_path_buf(),
        detail: format!("writing {RNG_GENERATOR_STATE_NAME} failed: {e}"),
    })
}

/// Reads and checks a checkpoint's generator states before training starts: from
/// `rng_state.safetensors`, else from upstream's `rng_state.pth` (`rng_state_{rank}.pth`
/// in a multi-process run; a Python checkpoint);
/// `None` when the checkpoint has neither (the run then continues from the reseeded
/// generator), an error naming the file when it cannot be used.
pub(crate) fn read_generator_states(
    dir: &Path,
    device: Device,
    world_size: usize,
    process_index: usize,
) -> Result<Option<Vec<(String, Tensor)>>> {
    let path = dir.join(RNG_GENERATOR_STATE_NAME);
    if !path.is_file() {
        if let Some((file, states)) =
            crate::torch_checkpoint::read_generator_states(dir, device, world_size, process_index)?
        {
            return check_generator_states(dir, &file, states, device).map(Some);
        }
        log::info!(
            "{} has no {RNG_GENERATOR_STATE_NAME}: dropout masks after the resume will differ from an uninterrupted run",
            dir.display()
        );
        return Ok(None);
    }
    let states = Tensor::read_safetensors(&path).map_err(|e| Error::InvalidCheckpoint {
        dir: dir.to_path_buf(),
        detail: format!(
            "{RNG_GENERATOR_STATE_NAME}: unreadable ({e}); delete that file to resume without restoring the generators"
        ),
    })?;
    check_generator_states(dir, RNG_GENERATOR_STATE_NAME, states, device).map(Some)
}

/// The `cpu` (and on a GPU `cuda`) states of `states`, each checked against libtorch's own
/// (dtype and size).
fn check_generator_states(
    dir: &Path,
    file: &str,
    states: Vec<(String, Tensor)>,
    device: Device,
) -> Result<Vec<(String, Tensor)>> {
    let invalid = |reason: String| Error::InvalidCheckpoint {
        dir: dir.to_path_buf(),
        detail: format!(
            "{file}: {reason}; delete that file to resume without restoring the generators"
        ),
    };
    let mut out = Vec::new();
    for (key, dev) in [("cpu", Device::Cpu), ("cuda", device)] {
        if key == "cuda" && !device.is_cuda() {
            continue;
        }
        let Some((_, state)) = states.iter().find(|(k, _)| k == key) else {
            if key == "cuda" {
                continue;
            }
            return Err(invalid(format!("no `{key}` generator state")));
        };
        let current = tchtrain_accelerate::get_rng_state(dev)?;
        if state.kind() != current.kind() || state.size() != current.size() {
            return Err(invalid(format!(
                "the `{key}` state is {:?} {:?}, libtorch's is {:?} {:?}",
                state.kind(),
                state.size(),
                current.kind(),
                current.size()
            )));
        }
        out.push((key.to_string(), state.shallow_clone()));
    }
    Ok(out)
}

/// Restores generator states [`read_generator_states`] returned (upstream `_load_rng_state`).
pub(crate) fn restore_generator_states(states: &[(String, Tensor)], device: Device) -> Result<()> {
    for (key, state) in states {
        let dev = if key == "cuda" { device } else { Device::Cpu };
        tchtrain_accelerate::set_rng_state(dev, state)?;
    }
    Ok(())
}

/// What `rng_state.json` holds: enough to check that a resumed run draws its data in the
/// same order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngState {
    /// `TrainingArguments.seed` (libtorch's generator was seeded with it at the start).
    pub seed: u64,
    /// The training sampler's name (`"random"`, `"sequential"`).
    pub sampler: String,
    /// The training sampler's seed, when it has one.
    pub sampler_seed: Option<u64>,
    /// `global_step` at the save.
    pub global_step: i64,
    /// `state.epoch` at the save.
    pub epoch: f64,
}

fn step_of(name: &str) -> Option<i64> {
    name.strip_prefix(PREFIX_CHECKPOINT_DIR)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

/// The `checkpoint-N` folders of `dir`, by increasing N (upstream `sort_checkpoints`
/// without `use_mtime`); with `best_model_checkpoint`, that one is moved just before the
/// newest. A missing `dir` has none.
pub fn sort_checkpoints(dir: &Path, best_model_checkpoint: Option<&str>) -> Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    let mut found: Vec<(i64, PathBuf)> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
        let path = entry.path();
        if let Some(step) = entry.file_name().to_str().and_then(step_of)
            && path.is_dir()
        {
            found.push((step, path));
        }
    }
    found.sort();
    let mut sorted: Vec<PathBuf> = found.into_iter().map(|(_, p)| p).collect();
    if let Some(best) = best_model_checkpoint.map(PathBuf::from)
        && sorted.contains(&best)
        && sorted.last() != Some(&best)
        && let Some(newest) = sorted.pop()
    {
        sorted.retain(|p| *p != best);
        sorted.push(best);
        sorted.push(newest);
    }
    Ok(sorted)
}

/// Upstream `get_last_checkpoint`: the `checkpoint-N` folder of `dir` with the largest N.
pub fn get_last_checkpoint(dir: &Path) -> Result<Option<PathBuf>> {
    Ok(sort_checkpoints(dir, None)?.pop())
}

/// Upstream `rotate_checkpoints`: deletes the oldest checkpoints of `dir` until
/// `save_total_limit` remain, never the newest nor `best_model_checkpoint`.
pub fn rotate_checkpoints(
    dir: &Path,
    save_total_limit: Option<i64>,
    best_model_checkpoint: Option<&str>,
) -> Result<()> {
    let Some(limit) = save_total_limit.filter(|&l| l > 0) else {
        return Ok(());
    };
    let checkpoints = sort_checkpoints(dir, None)?;
    if checkpoints.len() as i64 <= limit {
        return Ok(());
    }
    let mut protected: Vec<PathBuf> = checkpoints.last().cloned().into_iter().collect();
    if let Some(best) = best_model_checkpoint.map(PathBuf::from)
        && !protected.contains(&best)
    {
        protected.push(best);
    }
    let keep = (limit as usize).max(protected.len());
    let mut remaining = checkpoints.len();
    for ckpt in &checkpoints {
        if remaining <= keep {
            break;
        }
        if !protected.contains(ckpt) {
            log::info!(
                "Deleting older checkpoint [{}] due to args.save_total_limit",
                ckpt.display()
            );
            std::fs::remove_dir_all(ckpt).map_err(|e| Error::io("deleting", ckpt, e))?;
            remaining -= 1;
        }
    }
    Ok(())
}

/// Loads the weights of checkpoint `dir` into `model`, which must have exactly the
/// checkpoint's parameters (names and shapes; tied weights may be absent), else
/// [`Error::InvalidCheckpoint`] naming the first difference.
pub fn load_model_weights(model: &mut dyn TrainableModel, dir: &Path) -> Result<()> {
    let invalid = |detail: String| Error::InvalidCheckpoint {
        dir: dir.to_path_buf(),
        detail,
    };
    if !dir.is_dir() {
        return Err(invalid("not a folder".into()));
    }
    // A LoRA run's checkpoint holds the adapter alone (as upstream's Trainer saves a
    // `PeftModel`).
    if dir
        .join(tchtrain_models::ADAPTER_SAFE_WEIGHTS_NAME)
        .is_file()
        && !dir.join(tchtrain_models::SAFE_WEIGHTS_NAME).is_file()
    {
        return model.load_adapter(dir).map_err(|e| invalid(e.to_string()));
    }
    let tensors = read_checkpoint(dir)?;
    // A mixture of experts' checkpoint holds the experts one by one, as upstream writes it.
    let tensors = match model.weight_conversion() {
        Some(conversion) => conversion.convert(tensors)?,
        None => tensors,
    };
    let tied: Vec<String> = model.tied_weights().into_iter().map(|(k, _)| k).collect();
    let vars = model.var_store().variables();
    for (name, _) in &tensors {
        if !vars.contains_key(name) && !tied.contains(name) {
            return Err(invalid(format!(
                "tensor `{name}` is not a parameter of this {} (a checkpoint of another model?)",
                model.model_name()
            )));
        }
    }
    let mut vars: Vec<(String, Tensor)> = vars.into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    // Every name and shape is checked before the first copy: a checkpoint that does not
    // fit leaves the model as it was.
    let mut pairs = Vec::with_capacity(vars.len());
    for (name, var) in vars {
        let Some((_, t)) = tensors.iter().find(|(k, _)| *k == name) else {
            return Err(invalid(format!("parameter `{name}` is missing")));
        };
        if t.size() != var.size() {
            return Err(invalid(format!(
                "parameter `{name}` has shape {:?} in the checkpoint but {:?} in the model",
                t.size(),
                var.size()
            )));
        }
        pairs.push((var, t));
    }
    tch::no_grad(|| -> Result<()> {
        for (mut var, t) in pairs {
            var.f_copy_(t)?;
        }
        Ok(())
    })
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text + "\n").map_err(|e| Error::io("writing", path, e))
}

/// fsyncs the folder `dir` itself, which makes the creation, removal and renaming of its
/// entries durable.
fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io("syncing", dir, e))
}

/// fsyncs every file under `dir` (recursively), then the folders themselves.
fn fsync_tree(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| Error::io("inspecting", &path, e))?;
        if kind.is_dir() {
            fsync_tree(&path)?;
        } else if kind.is_file() {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io("syncing", &path, e))?;
        }
    }
    fsync_dir(dir)
}

/// Makes the complete checkpoint `tmp` durable under the name `final_dir`: fsyncs its
/// files and itself, renames it (replacing an older `final_dir`), then fsyncs the parent.
fn commit_checkpoint(tmp: &Path, final_dir: &Path) -> Result<()> {
    fsync_tree(tmp)?;
    if final_dir.exists() {
        std::fs::remove_dir_all(final_dir).map_err(|e| Error::io("deleting", final_dir, e))?;
    }
    std::fs::rename(tmp, final_dir).map_err(|e| Error::io("renaming", tmp, e))?;
    match final_dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => fsync_dir(parent),
        _ => fsync_dir(Path::new(".")),
    }
}

impl Trainer {
    /// Upstream `_save_checkpoint`: writes `output_dir/checkpoint-{global_step}/` (see the
    /// module docs), records the best checkpoint, then rotates (`save_total_limit`).
    pub fn save_checkpoint(&mut self) -> Result<()> {
        if !self.args.should_save() {
            return self.save_checkpoint_elsewhere();
        }
        self.store_flos()?;
        crate::save_failure::catch_file_size_signal();
        let run_dir = PathBuf::from(self.args.output_dir());
        let name = format!("{PREFIX_CHECKPOINT_DIR}-{}", self.state.global_step);
        let final_dir = run_dir.join(&name);
        let tmp = run_dir.join(format!("tmp-{name}"));
        // The newest complete checkpoint before this one: untouched whatever happens here.
        let previous = get_last_checkpoint(&run_dir).ok().flatten();
        if let Err(e) = self
            .write_checkpoint(&tmp, &run_dir)
            .and_then(|()| commit_checkpoint(&tmp, &final_dir))
        {
            return Err(crate::save_failure::failed_save(
                e, &final_dir, &tmp, previous,
            ));
        }
        // Upstream's `_push_from_checkpoint`: a failed push leaves training going.
        if self.args.push_to_hub
            && let Err(e) = self.push_from_checkpoint(&final_dir)
        {
            log::error!(
                "pushing {} to the hub failed, training goes on: {e}",
                final_dir.display()
            );
        }
        // Only now that the new checkpoint is complete and durable.
        rotate_checkpoints(
            &run_dir,
            self.args.save_total_limit,
            self.state.best_model_checkpoint.as_deref(),
        )
    }

    /// The files of a checkpoint, written into `tmp` (see [`save_checkpoint`](Self::save_checkpoint)).
    fn write_checkpoint(&mut self, tmp: &Path, run_dir: &Path) -> Result<()> {
        if tmp.exists() {
            std::fs::remove_dir_all(tmp).map_err(|e| Error::io("deleting", tmp, e))?;
        }
        std::fs::create_dir_all(tmp).map_err(|e| Error::io("creating", tmp, e))?;
        let state_dict = self.save_sharded_state(tmp)?;
        if !self.saves_sharded_model() {
            // ZeRO-3 (gathered unit by unit) and FSDP's mixed precision (the float32
            // shards) come consolidated; stages 1 and 2 write the model's variables.
            self.write_model_weights(tmp, state_dict)?;
        }
        // Upstream `_save`: the processing class beside the model.
        self.data.save_processing_class(tmp)?;
        if self.args.save_strategy != tchtrain_training_args::SaveStrategy::No
            && let Some(best_step) = self.state.best_global_step
        {
            // Paired with the barrier of the other processes (`save_checkpoint_elsewhere`).
            self.accelerator.wait_for_everyone()?;
            let best = run_dir.join(format!("{PREFIX_CHECKPOINT_DIR}-{best_step}"));
            if best.exists() || best_step == self.state.global_step {
                self.state.best_model_checkpoint = Some(best.display().to_string());
            }
        }
        if !self.args.save_only_model {
            if let Some(opt) = &self.optimization.optimizer
                && self.sharding.is_none()
            {
                opt.save(tmp)?;
            }
            if let Some(sched) = &self.optimization.lr_scheduler {
                sched.save(tmp)?;
            }
            // Upstream `_save_scaler` (`scaler.pt`; here `scaler.json`).
            self.accelerator.save_state(tmp)?;
            let (sampler, sampler_seed) = self.train_order();
            let rng = RngState {
                seed: self.args.seed,
                sampler,
                sampler_seed,
                global_step: self.state.global_step,
                epoch: self.state.epoch,
            };
            write_json(&tmp.join(RNG_STATE_NAME), &rng)?;
            save_generator_states(tmp, self.device())?;
            // Upstream's own files beside ours, so that Python's Trainer resumes this
            // checkpoint.
            let scaler = match self.accelerator.scaler() {
                Some(s) => s.state_dict()?,
                None => None,
            };
            let order = crate::torch_checkpoint::upstream_parameter_order(&*self.model);
            crate::torch_checkpoint::write_torch_files(
                tmp,
                &order,
                self.optimization
                    .optimizer
                    .as_deref()
                    .filter(|_| self.sharding.is_none()),
                self.optimization.lr_scheduler.as_deref(),
                scaler,
                &self.args,
                self.device(),
            )?;
        }
        let states = self.callback_handler.exportable_states(&self.control);
        self.state.update_stateful_callbacks(states);
        self.state.save_to_json(tmp.join(TRAINER_STATE_NAME))?;
        self.args.to_json_file(tmp.join(TRAINING_ARGS_NAME))?;
        Ok(())
    }

    /// A checkpoint save on a process that does not write (`should_save` is false): the
    /// bookkeeping upstream's `_save_checkpoint` does on every rank (flos, the barrier
    /// before the best checkpoint is looked up, `best_model_checkpoint`).
    pub(crate) fn save_checkpoint_elsewhere(&mut self) -> Result<()> {
        self.store_flos()?;
        let tmp = std::path::PathBuf::from(self.args.output_dir()).join(format!(
            "tmp-{}-{}",
            PREFIX_CHECKPOINT_DIR, self.state.global_step
        ));
        // Writes this rank's shards into rank 0's folder (zero.rs); nothing unsharded.
        self.save_sharded_state(&tmp)?;
        if self.args.save_strategy != tchtrain_training_args::SaveStrategy::No
            && let Some(best_step) = self.state.best_global_step
        {
            self.accelerator.wait_for_everyone()?;
            let run_dir = std::path::PathBuf::from(self.args.output_dir());
            let best = run_dir.join(format!("{}-{best_step}", PREFIX_CHECKPOINT_DIR));
            if best.exists() || best_step == self.state.global_step {
                self.state.best_model_checkpoint = Some(best.display().to_string());
            }
        }
        Ok(())
    }

    /// Upstream `_load_optimizer_and_scheduler`: restores their states when the checkpoint
    /// has them.
    pub(crate) fn load_optimizer_and_scheduler(&mut self, dir: &Path) -> Result<()> {
        let sharded = self.load_sharded_state(dir)?;
        if !sharded && let Some(opt) = self.optimization.optimizer.as_mut() {
            if dir.join(OPTIMIZER_STATE_NAME).is_file() {
                opt.load(dir)?;
            } else {
                // A checkpoint of Python's Trainer: its `optimizer.pt`.
                let order = crate::torch_checkpoint::upstream_parameter_order(&*self.model);
                crate::torch_checkpoint::load_optimizer(opt.as_mut(), dir, &order)?;
            }
        }
        if let Some(sched) = self.optimization.lr_scheduler.as_mut() {
            if dir.join(SCHEDULER_NAME).is_file() {
                sched.load(dir)?;
            } else {
                crate::torch_checkpoint::load_scheduler(sched.as_mut(), dir)?;
            }
        }
        // Upstream `_load_scaler`: when the checkpoint has the scaler's state.
        self.accelerator.load_state(dir)?;
        if let Some(mut scaler) = self.accelerator.scaler() {
            crate::torch_checkpoint::load_scaler(&mut scaler, dir)?;
        }
        crate::torch_checkpoint::compare_training_args(dir, &self.args)?;
        Ok(())
    }

    /// Upstream's end-of-training cleanup with `save_total_limit=1`: every checkpoint but
    /// the best is deleted.
    pub(crate) fn delete_all_but_best(&mut self) -> Result<()> {
        let Some(best) = self.state.best_model_checkpoint.clone() else {
            return Ok(());
        };
        if self.args.save_total_limit != Some(1) || !self.args.should_save() {
            return Ok(());
        }
        let run_dir = PathBuf::from(self.args.output_dir());
        for ckpt in sort_checkpoints(&run_dir, Some(&best))? {
            if ckpt != Path::new(&best) {
                std::fs::remove_dir_all(&ckpt).map_err(|e| Error::io("deleting", &ckpt, e))?;
            }
        }
        Ok(())
    }
}

/// Checks a checkpoint's `rng_state.json` against this Trainer's data order and reseeds
/// libtorch with `seed`, as upstream reseeds before `_load_rng_state`; the generators' saved
/// states (`rng_state.safetensors`) are restored after this, at the point upstream restores
/// them (see the module docs).
pub(crate) fn check_rng_state(dir: &Path, trainer: &Trainer) -> Result<()> {
    let path = dir.join(RNG_STATE_NAME);
    if !path.is_file() {
        return Ok(());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
    let saved: RngState = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.clone(),
        source,
    })?;
    let (sampler, sampler_seed) = trainer.train_order();
    if sampler != saved.sampler || sampler_seed != saved.sampler_seed {
        log::warn!(
            "The checkpoint's data order ({} sampler, seed {:?}) differs from this run's ({sampler} sampler, seed {sampler_seed:?}); the resumed run will not see the same batches.",
            saved.sampler,
            saved.sampler_seed,
        );
    }
    tch::manual_seed(saved.seed as i64);
    Ok(())
}
