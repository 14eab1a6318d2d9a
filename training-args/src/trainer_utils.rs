//! The strategy and scheduler enums of upstream `trainer_utils.py`: `IntervalStrategy`,
//! `SaveStrategy`, `HubStrategy`, `SchedulerType` and `FSDPOption`.

use crate::string_enum::string_enum;

string_enum! {
    /// When to log or evaluate: upstream `IntervalStrategy`.
    pub enum IntervalStrategy ("IntervalStrategy") {
        /// Never.
        No = "no",
        /// Every `*_steps` optimizer steps.
        Steps = "steps",
        /// At the end of every epoch.
        Epoch = "epoch",
    }
    default = No;
}

string_enum! {
    /// When to save a checkpoint: upstream `SaveStrategy`.
    pub enum SaveStrategy ("SaveStrategy") {
        /// Never.
        No = "no",
        /// Every `save_steps` optimizer steps.
        Steps = "steps",
        /// At the end of every epoch.
        Epoch = "epoch",
        /// Whenever a new best metric is reached.
        Best = "best",
    }
    default = Steps;
}

string_enum! {
    /// What to push to the Hub and when: upstream `HubStrategy`.
    pub enum HubStrategy ("HubStrategy") {
        /// Push the model once, when `save_model` is called at the end.
        End = "end",
        /// Push the model each time it is saved.
        EverySave = "every_save",
        /// Like `EverySave`, and also push the latest checkpoint to `last-checkpoint/`.
        Checkpoint = "checkpoint",
        /// Like `Checkpoint`, but push every checkpoint folder.
        AllCheckpoints = "all_checkpoints",
    }
    default = EverySave;
}

string_enum! {
    /// The learning-rate scheduler: upstream `SchedulerType` (all 12 names of transformers 5.23).
    pub enum SchedulerType ("SchedulerType") {
        /// `get_linear_schedule_with_warmup`.
        Linear = "linear",
        /// `get_cosine_schedule_with_warmup`.
        Cosine = "cosine",
        /// `get_cosine_with_hard_restarts_schedule_with_warmup`.
        CosineWithRestarts = "cosine_with_restarts",
        /// `get_polynomial_decay_schedule_with_warmup`.
        Polynomial = "polynomial",
        /// `get_constant_schedule`.
        Constant = "constant",
        /// `get_constant_schedule_with_warmup`.
        ConstantWithWarmup = "constant_with_warmup",
        /// `get_inverse_sqrt_schedule`.
        InverseSqrt = "inverse_sqrt",
        /// `get_reduce_on_plateau_schedule` (upstream `REDUCE_ON_PLATEAU`); needs an eval strategy.
        #[doc(alias = "REDUCE_ON_PLATEAU")]
        ReduceLrOnPlateau = "reduce_lr_on_plateau" as "REDUCE_ON_PLATEAU",
        /// `get_cosine_with_min_lr_schedule_with_warmup`.
        CosineWithMinLr = "cosine_with_min_lr",
        /// `get_cosine_with_min_lr_schedule_with_warmup_lr_rate`.
        CosineWarmupWithMinLr = "cosine_warmup_with_min_lr",
        /// `get_wsd_schedule`.
        WarmupStableDecay = "warmup_stable_decay",
        /// `get_greedy_schedule`; needs an eval strategy.
        Greedy = "greedy",
    }
    default = Linear;
}

string_enum! {
    /// The legacy string options of `fsdp` (`--fsdp "full_shard auto_wrap"`): upstream `FSDPOption`.
    #[doc(alias = "FSDPOption")]
    pub enum FsdpOption ("FSDPOption") {
        /// Shard parameters, gradients and optimizer states (`reshard_after_forward = true`).
        FullShard = "full_shard",
        /// Shard gradients and optimizer states only (`reshard_after_forward = false`).
        ShardGradOp = "shard_grad_op",
        /// No sharding (FSDP1 only).
        NoShard = "no_shard",
        /// Full shard within a node, replicate across nodes (FSDP1 only).
        HybridShard = "hybrid_shard",
        /// Shard grad/optimizer within a node, replicate across nodes (FSDP1 only).
        HybridShardZero2 = "hybrid_shard_zero2",
        /// Offload parameters and gradients to CPU (`cpu_offload = true`).
        Offload = "offload",
        /// Wrap layers automatically (the default policy already does).
        AutoWrap = "auto_wrap",
    }
    default = FullShard;
}
