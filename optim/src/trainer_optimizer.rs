//! The Trainer's optimizer factory: `OptimizerNames` → optimizer and arguments, as upstream
//! `trainer_optimizer.py` (`Trainer.get_optimizer_cls_and_kwargs` and its handlers), and
//! `Trainer.create_scheduler` from `TrainingArguments`.

use tchtrain_training_args::TrainingArguments;

use crate::optim_args::{bool_arg, float_arg, parse_optim_args};
use crate::{
    Adafactor, AdafactorConfig, Adagrad, AdagradConfig, AdamW, AdamWConfig, Error, GroupSpec, Lion,
    LionConfig, LrScheduler, Optimizer, Result, RmsProp, RmsPropConfig, Sgd, SgdConfig,
};

/// The optimizer names (upstream `OptimizerNames` values) that [`create_optimizer`] builds.
pub const SUPPORTED_OPTIMIZERS: [&str; 8] = [
    "adamw_torch",
    "adamw_torch_fused",
    "adafactor",
    "sgd",
    "adagrad",
    "rmsprop",
    "lion_32bit",
    "paged_lion_32bit",
];

/// The `TrainingArguments` fields the optimizer factory reads (defaults as upstream).
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerArgs {
    /// `optim` (an `OptimizerNames` value; default `adamw_torch`, upstream picks
    /// `adamw_torch_fused` on CUDA / torch >= 2.8).
    pub optim: String,
    /// `learning_rate` (default 5e-5).
    pub learning_rate: f64,
    /// `adam_beta1` (default 0.9).
    pub adam_beta1: f64,
    /// `adam_beta2` (default 0.999).
    pub adam_beta2: f64,
    /// `adam_epsilon` (default 1e-8).
    pub adam_epsilon: f64,
    /// `optim_args` (`"k=v,k2=v2"`).
    pub optim_args: Option<String>,
}

impl Default for OptimizerArgs {
    fn default() -> Self {
        Self {
            optim: "adamw_torch".into(),
            learning_rate: 5e-5,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            optim_args: None,
        }
    }
}

impl From<&TrainingArguments> for OptimizerArgs {
    fn from(args: &TrainingArguments) -> Self {
        Self {
            optim: args.optim.as_str().to_string(),
            learning_rate: args.learning_rate,
            adam_beta1: args.adam_beta1,
            adam_beta2: args.adam_beta2,
            adam_epsilon: args.adam_epsilon,
            optim_args: args.optim_args.clone(),
        }
    }
}

/// `Trainer.create_scheduler`: `get_scheduler(args.lr_scheduler_type, optimizer,
/// args.get_warmup_steps(num_training_steps), num_training_steps, args.lr_scheduler_kwargs)`.
pub fn create_scheduler(
    args: &TrainingArguments,
    optimizer: &mut dyn Optimizer,
    num_training_steps: usize,
) -> Result<Box<dyn LrScheduler>> {
    crate::get_scheduler(
        args.lr_scheduler_type.as_str(),
        optimizer,
        Some(args.get_warmup_steps(num_training_steps) as i64),
        Some(num_training_steps as i64),
        args.lr_scheduler_kwargs.as_ref(),
    )
}

/// Builds the optimizer `args.optim` names over `groups` with the arguments upstream's
/// handler passes (`lr`, the Adam betas / eps, `optim_args` keys). Weight decay comes from
/// the groups (see [`decay_param_groups`](crate::decay_param_groups)).
///
/// Handlers mirrored: `adamw_torch` / `adamw_torch_fused` (`_get_adamw_torch`), `adafactor`
/// (`scale_parameter=False, relative_step=False`), `sgd` (`momentum`, `dampening`,
/// `weight_decay`, `nesterov`), `adagrad` (`lr_decay`, `weight_decay`, `eps`), `rmsprop`
/// (`momentum`, `alpha`, `eps`, `weight_decay`, `centered`), `lion_32bit` /
/// `paged_lion_32bit` (bitsandbytes' 32-bit Lion with `betas=(adam_beta1, adam_beta2)`).
/// Other names are [`Error::UnsupportedOptimizer`].
#[doc(alias = "get_optimizer_cls_and_kwargs")]
pub fn create_optimizer(
    args: &OptimizerArgs,
    groups: Vec<GroupSpec>,
) -> Result<Box<dyn Optimizer>> {
    let optim_args = parse_optim_args(args.optim_args.as_deref())?;
    let lr = args.learning_rate;
    let betas = (args.adam_beta1, args.adam_beta2);
    Ok(match args.optim.as_str() {
        name @ ("adamw_torch" | "adamw_torch_fused") => Box::new(AdamW::new(
            groups,
            AdamWConfig {
                lr,
                betas,
                eps: args.adam_epsilon,
                fused: name == "adamw_torch_fused",
                ..Default::default()
            },
        )?),
        "adafactor" => Box::new(Adafactor::new(
            groups,
            AdafactorConfig {
                lr: Some(lr),
                scale_parameter: false,
                relative_step: false,
                ..Default::default()
            },
        )?),
        "sgd" => {
            let mut c = SgdConfig {
                lr,
                ..Default::default()
            };
            c.momentum = float_arg(&optim_args, "momentum")?.unwrap_or(c.momentum);
            c.dampening = float_arg(&optim_args, "dampening")?.unwrap_or(c.dampening);
            c.weight_decay = float_arg(&optim_args, "weight_decay")?.unwrap_or(c.weight_decay);
            c.nesterov = bool_arg(&optim_args, "nesterov").unwrap_or(c.nesterov);
            Box::new(Sgd::new(groups, c)?)
        }
        "adagrad" => {
            let mut c = AdagradConfig {
                lr,
                ..Default::default()
            };
            c.lr_decay = float_arg(&optim_args, "lr_decay")?.unwrap_or(c.lr_decay);
            c.weight_decay = float_arg(&optim_args, "weight_decay")?.unwrap_or(c.weight_decay);
            c.eps = float_arg(&optim_args, "eps")?.unwrap_or(c.eps);
            Box::new(Adagrad::new(groups, c)?)
        }
        "rmsprop" => {
            let mut c = RmsPropConfig {
                lr,
                ..Default::default()
            };
            c.momentum = float_arg(&optim_args, "momentum")?.unwrap_or(c.momentum);
            c.alpha = float_arg(&optim_args, "alpha")?.unwrap_or(c.alpha);
            c.eps = float_arg(&optim_args, "eps")?.unwrap_or(c.eps);
            c.weight_decay = float_arg(&optim_args, "weight_decay")?.unwrap_or(c.weight_decay);
            c.centered = bool_arg(&optim_args, "centered").unwrap_or(c.centered);
            Box::new(RmsProp::new(groups, c)?)
        }
        "lion_32bit" | "paged_lion_32bit" => Box::new(Lion::new(
            groups,
            LionConfig {
                lr,
                betas,
                ..Default::default()
            },
        )?),
        other => {
            return Err(Error::UnsupportedOptimizer {
                name: other.to_string(),
                supported: SUPPORTED_OPTIMIZERS.join(", "),
            });
        }
    })
}
