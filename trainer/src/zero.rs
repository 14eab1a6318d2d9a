//! Sharded data parallelism in the Trainer: DeepSpeed ZeRO 1/2/3 (`--deepspeed
//! ds_config.json`) and FSDP (`--fsdp ...`), both on the accelerator's ZeRO engine
//! (`tchtrain-accelerate`'s `ZeroEngine`). This file is the policy (upstream's
//! `deepspeed_init` and FSDP preparation: configs, checks, units, offload) and the shard
//! files of a checkpoint; the engine's step is the accelerator's.
//!
//! | upstream | here |
//! |---|---|
//! | `deepspeed_init`: `trainer_config_process` + `trainer_config_finalize` (mismatches raised before training) | [`Trainer::setup_sharding`], at the start of `train`, before any step |
//! | ZeRO stage from `zero_optimization.stage`; FSDP `reshard_after_forward` | stage 1 / 2 / 3; FSDP `shard_grad_op` = 2, `full_shard` = 3, `no_shard` = DDP |
//! | the Trainer's optimizer and scheduler, wrapped by DeepSpeed / FSDP | built by the Trainer as usual, over the engine's shards |
//! | `engine.backward` + `engine.step` (reduce, clip with the global norm, step, gather) | `Accelerator::backward`, `clip_grad_norm_`, `optimizer_step` |
//! | `checkpoint-N/global_step{N}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt`, `latest` | the same names, safetensors + JSON, written by every rank |
//! | FSDP `SHARDED_STATE_DICT`: `pytorch_model_fsdp_0/` | the shard files there, no `model.safetensors` |
//! | `FULL_STATE_DICT` / `stage3_gather_16bit_weights_on_model_save` | rank 0 writes the gathered `model.safetensors` |
//!
//! The DeepSpeed config's `optimizer` / `scheduler` sections are checked against the
//! arguments (the mismatch error) but the Trainer's `optim` and `lr_scheduler_type` run.
//!
//! Offload, `"device": "cpu"` with its `pin_memory`: `zero_optimization.offload_optimizer`
//! (any stage) keeps the optimizer's master shards and state on the CPU and steps there
//! ([`ZeroEngine::offload_optimizer`]); `offload_param` (stage 3) keeps the parameter shards
//! there between gathers ([`ZeroEngine::offload_param`]). Upstream logs that a
//! non-DeepSpeed optimizer with offload needs a CPU implementation, which every optimizer
//! here has. FSDP's `cpu_offload` is `offload_param` with `full_shard` and
//! `offload_optimizer` with `shard_grad_op`. On a CPU run offload changes nothing but memory
//! (the optimizer's masters are one more shard). Refused with an error naming the key: the
//! `nvme` device, FSDP `cpu_offload` with `no_shard`.

use std::path::Path;

use tchtrain_accelerate::{
    DistributedType, MixedPrecisionPolicy, ShardMemory, ZeroPlugin, ZeroStage,
    optimizer_state_bytes,
};
use tchtrain_deepspeed::{
    DeepSpeedOptimizer, HfTrainerDeepSpeedConfig, LATEST_NAME, global_step_dir, load_zero_shard,
    save_zero_shard,
};
use tchtrain_fsdp::{FsdpPlugin, StateDictType};

use tchtrain_training_args::DictOrPath;

use crate::error::{Error, Result};
use crate::model_info;
use crate::sharding::{
    Offload, ShardingSource, deepspeed_config, fsdp_requested, offload_settings,
    weights_only_in_shards,
};
use crate::trainer::Trainer;

/// Casts the model's floating-point variables to `kind` in place (DeepSpeed's
/// `_cast_module_mixed_precision` of the parameters); the model then computes in `kind`.
fn cast_parameters(model: &dyn tchtrain_models::TrainableModel, kind: tch::Kind) -> Result<()> {
    tch::no_grad(|| -> Result<()> {
        for (_, mut var) in model.var_store().variables() {
            if matches!(
                var.kind(),
                tch::Kind::Float | tch::Kind::Double | tch::Kind::Half | tch::Kind::BFloat16
            ) && var.kind() != kind
            {
                let cast = var.f_to_kind(kind)?;
                var.f_set_data(&cast)?;
            }
        }
        Ok(())
    })
}

/// FSDP's policy for what the engine does not shard: frozen parameters (FSDP shards them
/// too and gathers them in `param_dtype`) and, with FSDP1's `buffer_dtype`, the model's
/// buffers ([`TrainableModel::buffer_names`]), which FSDP2 leaves as they are: by target
/// dtype, the floating variables that do not train.
fn unsharded_by_dtype(
    model: &dyn tchtrain_models::TrainableModel,
    policy: MixedPrecisionPolicy,
) -> Vec<(tch::Kind, Vec<(String, tch::Tensor)>)> {
    let buffers = model.buffer_names();
    let mut out: Vec<(tch::Kind, Vec<(String, tch::Tensor)>)> = Vec::new();
    for (name, var) in model.var_store().variables() {
        if var.requires_grad() || !var.is_floating_point() {
            continue;
        }
        let kind = if buffers.contains(&name) {
            policy.buffer_dtype
        } else {
            policy.param_dtype
        };
        let Some(kind) = kind.filter(|k| *k != var.kind()) else {
            continue;
        };
        match out.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, vars)) => vars.push((name, var)),
            None => out.push((kind, vec![(name, var)])),
        }
    }
    out
}

/// The model's `hidden_size` (or GPT-2's `n_embd`) from its config, for `"auto"` buckets.
fn hidden_size(trainer: &Trainer) -> Option<i64> {
    let v = trainer
        .model
        .as_pretrained()?
        .config()
        .to_json_value()
        .ok()?;
    ["hidden_size", "n_embd", "d_model"]
        .iter()
        .find_map(|k| v.get(*k).and_then(serde_json::Value::as_i64))
}

impl Trainer {
    /// Upstream's `deepspeed_init` / FSDP preparation: reads `--deepspeed` (fills `"auto"`,
    /// raises the mismatch error) or `--fsdp`, checks upstream's constraints, and in a
    /// multi-process run builds the [`ZeroEngine`] and the optimizer over its shards.
    /// Returns whether the run is sharded (DDP is not used then). Runs before any step.
    pub(crate) fn setup_sharding(&mut self, num_training_steps: usize) -> Result<bool> {
        self.sharding = None;
        let ds = deepspeed_config(&self.args)?;
        let fsdp_on = fsdp_requested(&self.args);
        let mut offload = Offload::default();
        let mut half = None;
        let mut mp_policy = None;
        let mut per_parameter_order = None;
        let mut communication_data_type = None;
        let mut reduce_bucket_size = None;
        // FSDP overlaps its reduce-scatters with the backward; DeepSpeed as `overlap_comm` says.
        let mut overlap_comm = true;
        self.optimization.deepspeed = None;
        let (stage, source, units) = if let Some(mut ds) = ds {
            if fsdp_on {
                // Upstream's message (tchtrain-fsdp's check raises the same).
                return Err(tchtrain_fsdp::Error::Upstream("Using --fsdp xxx together with --deepspeed is not possible, deactivate one of those flags.".into()).into());
            }
            ds.check_trainer_compat(&self.args)?;
            // DeepSpeed maps its deprecated keys when it reads the config.
            for warning in ds.normalize_deprecated_keys()? {
                log::warn!("{warning}");
            }
            // With auto_find_batch_size, the batch size the search is at (upstream's
            // `_update_auto_batch_size` propagates it into the config).
            let mut args = self.args.clone();
            args.per_device_train_batch_size = self.data.train_batch_size;
            ds.trainer_config_process(&args, self.args.auto_find_batch_size);
            // accelerate's DeepSpeedPlugin, built after the arguments processed the config.
            ds.set_mixed_precision(&self.args.mixed_precision())?;
            let h = hidden_size(self);
            ds.trainer_config_finalize(&self.args, h, num_training_steps)?;
            crate::field_support::check_deepspeed_keys(&ds.config)?;
            half = ds.zero_mixed_precision()?;
            // DeepSpeed's gradient partitions are of `gradient_accumulation_dtype`: the
            // model's dtype unless `data_types.grad_accum_dtype` names another.
            let model_kind = half.as_ref().map_or(tch::Kind::Float, |(k, _)| *k);
            let accumulate = ds.grad_accum_dtype()?.unwrap_or(model_kind);
            communication_data_type = ds.communication_data_type()?.map(|kind| (kind, accumulate));
            reduce_bucket_size = Some(ds.reduce_bucket_size()?);
            overlap_comm = ds.overlap_comm()?;
            self.optimization.deepspeed = Some(Box::new(ds));
            let ds = self.optimization.deepspeed.as_deref().expect("just set");
            let Some(stage) = ZeroStage::from_stage(ds.zero_stage())? else {
                if let Some((kind, _)) = &half {
                    return Err(Error::InvalidArgument {
                        field: "deepspeed",
                        detail: format!(
                            "DeepSpeed's {kind:?} training without ZeRO (stage 0: its FP16_Optimizer / BF16_Optimizer) is not implemented; set zero_optimization.stage to 1, 2 or 3 (the same numbers on one process, and sharded on several)"
                        ),
                    });
                }
                return Ok(false);
            };
            offload = offload_settings(ds)?;
            let units = if stage == ZeroStage::Weights {
                layer_units(self)
            } else {
                Vec::new()
            };
            (stage, ShardingSource::DeepSpeed, units)
        } else if fsdp_on {
            let map =
                tchtrain_fsdp::fsdp_plugin_args(&self.args)?.ok_or(Error::InvalidArgument {
                    field: "fsdp",
                    detail: "the XLA FSDP path is not available".into(),
                })?;
            if let Some(DictOrPath::Dict(config)) = &self.args.fsdp_config {
                crate::field_support::check_fsdp_mixed_precision(config, &self.args)?;
                crate::field_support::check_fsdp_keys(config)?;
            }
            let plugin = FsdpPlugin::from_args(&map)?;
            // Checked on what the builder was given (upstream checks at `__init__`), not on
            // what an earlier `train()` built.
            let optimizers_passed = self.optimization.optimizers_passed;
            tchtrain_fsdp::check_trainer_compat(
                &self.args,
                &plugin,
                false,
                self.args.world_size(),
                optimizers_passed,
            )?;
            if plugin.activation_checkpointing {
                // FSDP's own activation checkpointing wraps the same layers.
                self.model.activation_checkpointing_enable(
                    tchtrain_models::ActivationCheckpointing::default(),
                )?;
            }
            let Some(stage) = tchtrain_fsdp::zero_stage_for(plugin.sharding_strategy) else {
                if plugin.cpu_offload {
                    return Err(Error::InvalidArgument {
                        field: "fsdp",
                        detail: "cpu_offload with no_shard: an unsharded run has no shards to offload here; use full_shard or shard_grad_op with it, or remove it".into(),
                    });
                }
                return Ok(false);
            };
            if plugin.cpu_offload {
                // torch's CPUOffload(offload_params=True): parameters and gradients on the
                // CPU, the optimizer stepping there. full_shard: the shards live there;
                // shard_grad_op (parameters whole on the device): the optimizer's masters.
                offload = if stage == ZeroStage::Weights {
                    Offload {
                        param: Some((tch::Device::Cpu, false)),
                        optimizer: None,
                    }
                } else {
                    Offload {
                        param: None,
                        optimizer: Some((tch::Device::Cpu, false)),
                    }
                };
            }
            // accelerate's `set_mixed_precision` on the plugin, from --bf16 / --fp16.
            mp_policy =
                MixedPrecisionPolicy::for_dtype(&self.args.mixed_precision(), plugin.version)?;
            let named = model_info::named_parameters(&*self.model);
            if plugin.version == 2 {
                per_parameter_order = Some(model_info::parameter_names_in_order(&*self.model));
            }
            // accelerate's `set_auto_wrap_policy`: each class to wrap must be in the model.
            tchtrain_fsdp::check_wrap_classes(&plugin, &self.model.no_split_modules())?;
            let units = tchtrain_fsdp::auto_wrap_units(&named, &plugin);
            (stage, ShardingSource::Fsdp(plugin), units)
        } else {
            return Ok(false);
        };
        if self.optimization.optimizer.is_some() {
            return Err(Error::InvalidArgument {
                field: "optimizers",
                detail: "a sharded run builds its optimizer over the shards: let the Trainer create it (set optim / learning_rate / weight_decay)".into(),
            });
        }
        if let Some((kind, _)) = &half {
            // DeepSpeed's engine casts the model's parameters (not its buffers) to the half
            // dtype before building the optimizer.
            cast_parameters(&*self.model, *kind)?;
            if *kind == tch::Kind::Half && self.device() == tch::Device::Cpu {
                log::warn!(
                    "DeepSpeed's fp16 regime on the CPU: DeepSpeed's own engine refuses fp16 on a CPU without mkldnn fp16 kernels; it runs here (float16 weights and activations, fp32 masters, the dynamic loss scaler) so that it can be tested, slowly"
                );
            }
        }
        let groups = self.optimizer_param_groups()?;
        let plugin = ZeroPlugin {
            distributed_type: match source {
                ShardingSource::DeepSpeed => DistributedType::DeepSpeed,
                ShardingSource::Fsdp(_) => DistributedType::Fsdp,
            },
            stage,
            units,
            offload_param: offload.param,
            offload_optimizer: offload.optimizer,
            mixed_precision: half.map(|(_, mp)| mp),
            mp_policy,
            per_parameter_order,
            communication_data_type,
            overlap_comm,
            reduce_bucket_size,
        };
        refuse_unshardable_optimizer(self.args.optim.as_str())?;
        let shard_groups = self.accelerator.prepare_zero(plugin, groups)?;
        if let Some(policy) = mp_policy {
            for (kind, vars) in unsharded_by_dtype(&*self.model, policy) {
                self.accelerator.with_zero_engine(|_, engine| {
                    Ok::<_, Error>(engine.cast_unsharded(vars, kind)?)
                })?;
            }
        }
        self.optimization.optimizer = Some(self.build_optimizer(shard_groups)?);
        self.sharding = Some(source);
        Ok(true)
    }

    /// The memory the sharded engine holds on this rank (`None` outside a sharded run).
    pub fn sharded_memory(&self) -> Option<ShardMemory> {
        self.accelerator.sharded_memory()
    }

    /// Bytes of the optimizer's state tensors on this rank (its shard under ZeRO / FSDP).
    pub fn optimizer_state_bytes(&self) -> usize {
        self.optimization
            .optimizer
            .as_deref()
            .map_or(0, optimizer_state_bytes)
    }

    /// DeepSpeed's loss scale now (`loss_scaler.cur_scale`) in a run of its fp16 / bf16
    /// regime; `None` otherwise.
    pub fn deepspeed_loss_scale(&self) -> Option<f64> {
        self.accelerator
            .zero_engine()
            .and_then(|e| e.loss_scaler().map(|s| s.loss_scale()))
    }

    /// The processed DeepSpeed config (`"auto"` values filled) of a `--deepspeed` run, once
    /// `train` has read it.
    pub fn hf_deepspeed_config(&self) -> Option<&HfTrainerDeepSpeedConfig> {
        self.optimization.deepspeed.as_deref()
    }

    /// Whether DeepSpeed's engine steps the scheduler (upstream hands it a
    /// `DummyScheduler` when the config has a `scheduler` or an `optimizer` section).
    pub(crate) fn deepspeed_steps_scheduler(&self) -> bool {
        self.optimization.deepspeed.as_ref().is_some_and(|ds| {
            ds.config.contains_key("scheduler") || ds.config.contains_key("optimizer")
        })
    }

    /// The DeepSpeed config's `optimizer` section, when this run has one.
    fn deepspeed_optimizer(&self) -> Result<Option<DeepSpeedOptimizer>> {
        match self
            .optimization
            .deepspeed
            .as_ref()
            .and_then(|ds| ds.config.get("optimizer"))
        {
            Some(section) => Ok(Some(DeepSpeedOptimizer::from_config(section)?)),
            None => Ok(None),
        }
    }

    /// The optimizer's parameter groups: DeepSpeed's one group of every parameter when the
    /// DeepSpeed config has an `optimizer` section (upstream hands DeepSpeed
    /// `model.parameters()`), else the Trainer's decay / no-decay groups.
    pub(crate) fn optimizer_param_groups(&self) -> Result<Vec<tchtrain_optim::GroupSpec>> {
        let named = model_info::named_parameters(&*self.model);
        Ok(match self.deepspeed_optimizer()? {
            Some(ds) => ds.param_groups(named),
            None => {
                let layernorms = self.model.layernorm_modules();
                tchtrain_optim::decay_param_groups(named, self.args.weight_decay, &layernorms)
            }
        })
    }

    /// The optimizer over `groups`: the DeepSpeed section's, else `optim` and its arguments.
    pub(crate) fn build_optimizer(
        &self,
        groups: Vec<tchtrain_optim::GroupSpec>,
    ) -> Result<Box<dyn tchtrain_optim::Optimizer>> {
        Ok(match self.deepspeed_optimizer()? {
            Some(ds) => ds.build(groups)?,
            None => {
                let mut args = tchtrain_optim::OptimizerArgs::from(&self.args);
                let named = model_info::named_parameters(&*self.model);
                args.embedding_weights = named
                    .iter()
                    .map(|(n, _)| n)
                    .filter(|n| self.model.is_embedding_weight(n))
                    .cloned()
                    .collect();
                // GaLore and APOLLO project `nn.Linear` only (GPT-2's `Conv1D` is not one).
                args.linear_modules = self
                    .model
                    .linear_modules()
                    .into_iter()
                    .filter(|m| !m.conv1d)
                    .map(|m| m.name)
                    .collect();
                let opt = tchtrain_optim::create_optimizer(&args, groups)?;
                if opt.fuses_backward() && self.args.fp16 {
                    // Upstream fails there too: accelerate scales an fp16 loss and calls
                    // `backward(learning_rate=...)` on it (LOMO), or the GradScaler finds no
                    // gradient left to unscale (the layer-wise forms).
                    return Err(Error::InvalidArgument {
                        field: "optim",
                        detail: format!(
                            "`{}` with fp16: it updates the parameters inside the backward, \
                             where fp16's loss scaler cannot unscale and check the gradients \
                             first (upstream fails there); use bf16 or fp32",
                            self.args.optim.as_str()
                        ),
                    });
                }
                opt
            }
        })
    }

    /// The ZeRO stage of the running sharded engine, if any.
    pub fn zero_stage(&self) -> Option<i64> {
        self.accelerator.zero_engine().map(|e| e.stage().number())
    }

    /// The buckets of the sharded engine's reduction overlapped with the backward
    /// (stages 1 and 2 on several processes, DeepSpeed's `reduce_bucket_size`); `None`
    /// when the gradients are reduced after the backward.
    pub fn zero_reduce_buckets(&self) -> Option<usize> {
        self.accelerator
            .zero_engine()
            .and_then(|e| e.overlap_buckets())
    }

    /// Whether checkpoints hold no `model.safetensors`, only shards (FSDP's
    /// SHARDED_STATE_DICT).
    pub(crate) fn saves_sharded_model(&self) -> bool {
        matches!(
            &self.sharding,
            Some(ShardingSource::Fsdp(p)) if p.state_dict_type == StateDictType::ShardedStateDict
        )
    }

    /// Under FSDP's mixed precision, the model as it is saved: the float32 shards gathered
    /// with the unsharded variables' originals (the model's variables hold the
    /// low-precision copies it computes with); on rank 0, `None` elsewhere and without the
    /// policy. A collective under the policy: every rank calls it, as every rank calls
    /// upstream's `save_model` under FSDP.
    pub(crate) fn policy_state_dict(&self) -> Result<Option<Vec<(String, tch::Tensor)>>> {
        let is_rank0 = self.args.process_index() == 0;
        let state_dict = self.accelerator.with_zero_engine(|pg, engine| {
            if engine.mp_policy().is_some_and(|p| p.param_dtype.is_some()) {
                Ok::<_, Error>(Some(engine.consolidated_state_dict(pg)?))
            } else {
                Ok(None)
            }
        })?;
        Ok(state_dict.flatten().filter(|_| is_rank0))
    }

    /// Writes the model's weights into `dir`: from `state_dict` (a consolidated sharded
    /// model) when given, with anything the engine does not hold taken from the model
    /// itself, else the model's variables.
    pub(crate) fn write_model_weights(
        &self,
        dir: &Path,
        state_dict: Option<Vec<(String, tch::Tensor)>>,
    ) -> Result<()> {
        let Some(mut state_dict) = state_dict else {
            self.model.save_weights(dir)?;
            return Ok(());
        };
        let held: std::collections::HashSet<String> =
            state_dict.iter().map(|(n, _)| n.clone()).collect();
        state_dict.extend(
            self.model
                .var_store()
                .variables()
                .into_iter()
                .filter(|(n, _)| !held.contains(n)),
        );
        match self.model.as_pretrained() {
            Some(m) => tchtrain_models::save_pretrained_state_dict(m, dir, state_dict)?,
            None => tchtrain_models::save_state_dict(dir, state_dict)?,
        }
        Ok(())
    }

    /// Every rank's part of a checkpoint save into `tmp` (the folder rank 0 renames when
    /// complete). At stage 3, unless the checkpoint holds only shards, the model's state
    /// dict is gathered one unit at a time ([`ZeroEngine::consolidated_state_dict`], as
    /// DeepSpeed's `stage3_gather_16bit_weights_on_model_save`): rank 0 gets it back to write
    /// `model.safetensors`, and no rank ever holds the whole model on its device. Then,
    /// between two barriers (rank 0 has created `tmp` before the first), every rank writes
    /// its shard files: `global_step{N}/` and `latest` for DeepSpeed,
    /// `pytorch_model_fsdp_0/` for FSDP. `None` outside a sharded run, at stages 1 and 2
    /// (the model's variables hold the full values) and on ranks other than 0.
    /// Collectives in the same order on every rank.
    pub(crate) fn save_sharded_state(
        &mut self,
        tmp: &Path,
    ) -> Result<Option<Vec<(String, tch::Tensor)>>> {
        let shards_only = self.saves_sharded_model();
        let Some(source) = self.sharding.as_ref() else {
            return Ok(None);
        };
        let step = self.state.global_step;
        let dir = match source {
            ShardingSource::DeepSpeed => global_step_dir(tmp, step),
            ShardingSource::Fsdp(_) => tmp.join(tchtrain_deepspeed::FSDP_MODEL_DIR),
        };
        let is_rank0 = self.args.process_index() == 0;
        let optimizer = if self.args.save_only_model {
            None
        } else {
            self.optimization.optimizer.as_deref()
        };
        let deepspeed = matches!(source, ShardingSource::DeepSpeed);
        let state_dict = self.accelerator.with_zero_engine(|pg, engine| {
            // Stage 3's variables are released; under FSDP's mixed precision they hold the
            // low-precision copies, and the float32 shards are the model.
            let consolidate = (engine.stage() == ZeroStage::Weights
                || engine.mp_policy().is_some_and(|p| p.param_dtype.is_some()))
                && !shards_only;
            let state_dict = if consolidate {
                Some(engine.consolidated_state_dict(pg)?)
            } else {
                None
            };
            pg.barrier()?;
            save_zero_shard(engine, optimizer, &dir)?;
            if is_rank0 && deepspeed {
                let latest = tmp.join(LATEST_NAME);
                std::fs::write(&latest, format!("global_step{step}"))
                    .map_err(|e| Error::io("writing", &latest, e))?;
            }
            pg.barrier()?;
            Ok::<_, Error>(state_dict)
        })?;
        Ok(state_dict.flatten().filter(|_| is_rank0))
    }

    /// Resuming a sharded run: this rank's shards and optimizer state from the
    /// checkpoint's shard files, when it has them. Returns whether it did.
    ///
    /// A checkpoint whose weights exist only as shards (FSDP's SHARDED_STATE_DICT) cannot
    /// resume a run that is not sharded the same way: [`Error::InvalidCheckpoint`].
    pub(crate) fn load_sharded_state(&mut self, ckpt: &Path) -> Result<bool> {
        if self.sharding.is_none() {
            if weights_only_in_shards(ckpt) {
                return Err(Error::InvalidCheckpoint {
                    dir: ckpt.to_path_buf(),
                    detail: format!(
                        "its weights exist only as per-rank shards ({}/): resume it with the same --fsdp / --deepspeed settings and WORLD_SIZE, or consolidate it with zero_to_fp32 and start from the consolidated model",
                        tchtrain_deepspeed::FSDP_MODEL_DIR
                    ),
                });
            }
            return Ok(false);
        }
        let Ok(dir) = tchtrain_deepspeed::find_shard_dir(ckpt) else {
            return Ok(false);
        };
        let optimizer = self
            .optimization
            .optimizer
            .as_mut()
            .map(|o| &mut **o as &mut dyn tchtrain_optim::Optimizer);
        self.accelerator.with_zero_engine(|pg, engine| {
            Ok::<_, Error>(load_zero_shard(engine, pg, optimizer, &dir)?)
        })?;
        Ok(true)
    }
}

/// ZeRO-3's units under DeepSpeed: each decoder layer (every `*.h.{i}.`, `*.layers.{i}.`,
/// `*.layer.{i}.` prefix), the rest in the root unit.
fn layer_units(trainer: &Trainer) -> Vec<String> {
    let named = model_info::named_parameters(&*trainer.model);
    let plugin = FsdpPlugin {
        version: 2,
        sharding_strategy: tchtrain_fsdp::ShardingStrategy::FullShard,
        cpu_offload: false,
        auto_wrap_policy: "TRANSFORMER_BASED_WRAP".into(),
        transformer_cls_names_to_wrap: Vec::new(),
        min_num_params: 0,
        cpu_ram_efficient_loading: false,
        state_dict_type: StateDictType::FullStateDict,
        activation_checkpointing: false,
    };
    tchtrain_fsdp::auto_wrap_units(&named, &plugin)
}

/// The `optim` names whose update cannot run on the flat shards of ZeRO / FSDP: refused
/// before the engine is built, naming why.
fn refuse_unshardable_optimizer(optim: &str) -> Result<()> {
    let why = if optim.starts_with("schedule_free") {
        "its train() / eval() move the parameters it holds, and under ZeRO / FSDP those are \
         the shards the model's weights are gathered from only after a step, so evaluation \
         and saving would not see the averaged weights"
    } else if optim == "lomo" || optim == "adalomo" {
        "it updates the model's parameters inside the backward pass, while the sharded engine \
         reduces the gradients into shards first"
    } else if optim.starts_with("galore") || optim.starts_with("apollo") {
        "it projects the gradients of whole 2-D linear weights, which the flat shards no \
         longer are"
    } else {
        return Ok(());
    };
    Err(Error::InvalidArgument {
        field: "optim",
        detail: format!(
            "`{optim}` cannot run under ZeRO / FSDP sharding: {why}; use `adamw_torch_fused` \
             or train without sharding"
        ),
    })
}
