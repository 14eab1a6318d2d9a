//! The process-and-world helpers of upstream `TrainingArguments` (`world_size`,
//! `process_index`, `parallel_mode`, `train_batch_size`, `should_log`, ...) and `ParallelMode`,
//! read from the torchrun environment (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`).
//!
//! Upstream asks Accelerate's `PartialState`; tchtrain runs one process per device (DDP,
//! launched like torchrun), so there is no `torch.nn.DataParallel` mode: `n_gpu` is at most 1
//! per process and the batch sizes are the per-device ones.

use crate::string_enum::string_enum;
use crate::training_args::TrainingArguments;

string_enum! {
    /// The kind of parallelism in use: upstream `ParallelMode`.
    pub enum ParallelMode ("ParallelMode") {
        /// One process, no parallelism (CPU or one GPU).
        NotParallel = "not_parallel",
        /// Several GPUs in one process (`torch.nn.DataParallel`; not used by tchtrain).
        NotDistributed = "not_distributed",
        /// Several processes, one per device.
        Distributed = "distributed",
        /// SageMaker model parallelism (not used by tchtrain).
        SagemakerModelParallel = "sagemaker_model_parallel",
        /// SageMaker data parallelism (not used by tchtrain).
        SagemakerDataParallel = "sagemaker_data_parallel",
        /// TPU cores (not used by tchtrain).
        Tpu = "tpu",
    }
    default = NotParallel;
}

/// An integer environment variable, if set and valid.
fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl TrainingArguments {
    /// Number of processes in the run: `WORLD_SIZE` from the torchrun environment, else 1.
    pub fn world_size(&self) -> usize {
        env_usize("WORLD_SIZE").filter(|&n| n > 0).unwrap_or(1)
    }

    /// Global rank of this process: `RANK`, else 0.
    pub fn process_index(&self) -> usize {
        env_usize("RANK").unwrap_or(0)
    }

    /// Rank of this process on its node: `LOCAL_RANK`, else `local_rank` when >= 0, else 0.
    pub fn local_process_index(&self) -> usize {
        env_usize("LOCAL_RANK")
            .or_else(|| usize::try_from(self.local_rank).ok())
            .unwrap_or(0)
    }

    /// [`ParallelMode::Distributed`] when `world_size() > 1`, else [`ParallelMode::NotParallel`].
    pub fn parallel_mode(&self) -> ParallelMode {
        if self.world_size() > 1 {
            ParallelMode::Distributed
        } else {
            ParallelMode::NotParallel
        }
    }

    /// The batch size of one training step on this process: upstream
    /// `per_device_train_batch_size * max(1, n_gpu)`, with `n_gpu <= 1` here.
    pub fn train_batch_size(&self) -> usize {
        self.per_device_train_batch_size
    }

    /// The batch size of one evaluation step on this process (see [`Self::train_batch_size`]).
    pub fn eval_batch_size(&self) -> usize {
        self.per_device_eval_batch_size
    }

    /// Whether this process should log: the local main process when `log_on_each_node`, else the global one.
    pub fn should_log(&self) -> bool {
        if self.log_on_each_node {
            self.local_process_index() == 0
        } else {
            self.process_index() == 0
        }
    }

    /// Whether this process should write checkpoints: as [`Self::should_log`], with `save_on_each_node`.
    pub fn should_save(&self) -> bool {
        if self.save_on_each_node {
            self.local_process_index() == 0
        } else {
            self.process_index() == 0
        }
    }
}
