//! The Trainer's optimizer factory: `OptimizerNames` → optimizer and arguments, as upstream
//! `trainer_optimizer.py` (`Trainer.get_optimizer_cls_and_kwargs` and its handlers), and
//! `Trainer.create_scheduler` from `TrainingArguments`.

use tchtrain_training_args::{OptimizerNames, OptimizerSupport, StrOrList, TrainingArguments};

use crate::optim_args::{bool_arg, float_arg, parse_optim_args};
use crate::{
    AdaLomo, AdaLomoConfig, Adafactor, AdafactorConfig, Adagrad, AdagradConfig, AdamW, AdamWConfig,
    Error, GrokAdamW, GrokAdamWConfig, GroupSpec, Lomo, LomoConfig, LrScheduler, Optimizer, Result,
    RmsProp, RmsPropConfig, Sgd, SgdConfig, StableAdamW, StableAdamWConfig,
};

/// The optimizer names (upstream `OptimizerNames` values) that [`create_optimizer`] builds,
/// in upstream's order: the working rows of `OptimizerNames::support`.
pub fn supported_optimizers() -> Vec<&'static str> {
    OptimizerNames::supported()
        .into_iter()
        .map(OptimizerNames::as_str)
        .collect()
}

/// The `TrainingArguments` fields the optimizer factory reads (defaults as upstream), and
/// the facts about the model some optimizers need (upstream's handlers take the model).
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
    /// `weight_decay` (default 0): the schedule-free and StableAdamW handlers pass it to the
    /// optimizer as its default (the groups still carry their own).
    pub weight_decay: f64,
    /// `warmup_steps` as given (default 0; a ratio below 1 stays a ratio): the schedule-free
    /// handler passes it to the optimizer unconverted, as upstream does.
    pub warmup_steps: f64,
    /// `optim_target_modules`: the modules GaLore and APOLLO project.
    pub optim_target_modules: Option<StrOrList>,
    /// `gradient_accumulation_steps` (layer-wise optimizers refuse more than 1).
    pub gradient_accumulation_steps: usize,
    /// Whether the run is distributed (`parallel_mode == DISTRIBUTED`; layer-wise optimizers
    /// refuse it).
    pub distributed: bool,
    /// The parameter names of the model's `nn.Embedding` weights: the Trainer keeps them in
    /// 32-bit state under bitsandbytes' 8-bit optimizers (`register_module_override`).
    pub embedding_weights: Vec<String>,
    /// The model's `nn.Linear` modules (names without `.weight`), in registration order: the
    /// modules `optim_target_modules` may select.
    pub linear_modules: Vec<String>,
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
            weight_decay: 0.0,
            warmup_steps: 0.0,
            optim_target_modules: None,
            gradient_accumulation_steps: 1,
            distributed: false,
            embedding_weights: Vec::new(),
            linear_modules: Vec::new(),
        }
    }
}

impl From<&TrainingArguments> for OptimizerArgs {
    /// The fields of `args`; the model's facts (`embedding_weights`, `linear_modules`) are
    /// left empty for the caller to fill.
    fn from(args: &TrainingArguments) -> Self {
        Self {
            optim: args.optim.as_str().to_string(),
            learning_rate: args.learning_rate,
            adam_beta1: args.adam_beta1,
            adam_beta2: args.adam_beta2,
            adam_epsilon: args.adam_epsilon,
            optim_args: args.optim_args.clone(),
            weight_decay: args.weight_decay,
            warmup_steps: args.warmup_steps,
            optim_target_modules: args.optim_target_modules.clone(),
            gradient_accumulation_steps: args.gradient_accumulation_steps,
            distributed: args.world_size() > 1,
            embedding_weights: Vec::new(),
            linear_modules: Vec::new(),
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
/// (`momentum`, `alpha`, `eps`, `weight_decay`, `centered`), bitsandbytes' AdamW / AdEMAMix /
/// Lion / RMSprop names (`_get_bitsandbytes_optimizer`, see [`BnbOptimizer`](crate::BnbOptimizer)).
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
        // `_get_bitsandbytes_optimizer` (AdamW, AdEMAMix, Lion, RMSprop; 32- or 8-bit state)
        name if crate::bitsandbytes::BITSANDBYTES_OPTIMIZERS.contains(&name) => {
            Box::new(crate::BnbOptimizer::new(
                groups,
                crate::bitsandbytes::trainer_config(name, args, &optim_args)?,
            )?)
        }
        "galore_adamw" | "galore_adafactor" | "galore_adamw_8bit" => {
            crate::galore::create_galore(args, &optim_args, groups)?
        }
        "apollo_adamw" => crate::apollo::create_apollo(args, &optim_args, groups)?,
        // `_setup_low_rank_optimizer`'s layer-wise branch: one optimizer per parameter,
        // stepped inside the backward (see `LayerWise`).
        "galore_adamw_layerwise" | "galore_adamw_8bit_layerwise" | "apollo_adamw_layerwise" => {
            crate::layerwise::create_layerwise(args, groups)?
        }
        "stable_adamw" => {
            // `_get_stable_adamw`: `bool(optim_args.pop(...))` of a string is Python's truth
            // of a non-empty string, so `decouple_lr=False` turns it on, as upstream.
            let truthy = |k: &str| optim_args.get(k).map(|v| !v.is_empty());
            Box::new(StableAdamW::new(
                groups,
                StableAdamWConfig {
                    lr,
                    betas,
                    eps: args.adam_epsilon,
                    weight_decay: args.weight_decay,
                    decouple_lr: truthy("decouple_lr").unwrap_or(false),
                    max_lr: float_arg(&optim_args, "max_lr")?,
                    kahan_sum: truthy("kahan_sum"),
                    ..Default::default()
                },
            )?)
        }
        "grokadamw" => {
            // `_get_grokadamw`: lr and the grokking arguments; betas, eps and the default weight
            // decay stay the package's.
            let d = GrokAdamWConfig::default();
            Box::new(GrokAdamW::new(
                groups,
                GrokAdamWConfig {
                    lr,
                    alpha_init: float_arg(&optim_args, "alpha_init")?.unwrap_or(d.alpha_init),
                    lamb: float_arg(&optim_args, "lamb")?.unwrap_or(d.lamb),
                    gamma: float_arg(&optim_args, "gamma")?.unwrap_or(d.gamma),
                    grokking_signal_decay_rate: float_arg(
                        &optim_args,
                        "grokking_signal_decay_rate",
                    )?
                    .unwrap_or(d.grokking_signal_decay_rate),
                    gradient_clipping: float_arg(&optim_args, "gradient_clipping")?
                        .unwrap_or(d.gradient_clipping),
                    ..d
                },
            )?)
        }
        // LOMO under DDP: the package updates each process's parameters from its own
        // gradient inside the backward, racing DDP's all-reduce (its own all-reduce exists
        // only for ZeRO-3); refused rather than let the ranks drift apart.
        name @ ("lomo" | "adalomo") if args.distributed => {
            return Err(Error::InvalidOptimizerSetup {
                name: name.into(),
                detail: "LOMO updates each process's parameters from its own gradient inside \
                         the backward pass, before any all-reduce, so data-parallel ranks would \
                         drift apart; run it on one process, or use `adamw_torch_fused`"
                    .into(),
            });
        }
        // `_get_lomo_optimizer`: the model (every parameter, one group) and `lr`; the rest
        // stays the package's defaults.
        "lomo" => Box::new(Lomo::new(
            groups,
            LomoConfig {
                lr,
                ..Default::default()
            },
        )?),
        "adalomo" => Box::new(AdaLomo::new(
            groups,
            AdaLomoConfig {
                lr,
                ..Default::default()
            },
        )?),
        // `_get_torchao_optimizer`: torchao's AdamW8bit / AdamW4bit, `block_size` (default
        // 256) and `bf16_stochastic_round` from optim_args, the Adam betas / eps.
        name @ ("adamw_torch_8bit" | "adamw_torch_4bit") => Box::new(crate::torchao::from_trainer(
            name,
            lr,
            betas,
            args.adam_epsilon,
            &optim_args,
            groups,
        )?),
        "schedule_free_adamw" | "schedule_free_sgd" | "schedule_free_radam" => {
            schedule_free(args, &optim_args, groups)?
        }
        other => return Err(refusal(other)),
    })
}

/// `_get_schedule_free_optimizer`: `lr`, `weight_decay=args.weight_decay`, the Adam betas /
/// eps for AdamW and RAdam, `warmup_steps=args.warmup_steps` as given (a ratio stays a ratio)
/// for AdamW and SGD, and `optim_args`' `weight_lr_power` (default 2) and `r` (default 0).
fn schedule_free(
    args: &OptimizerArgs,
    optim_args: &std::collections::BTreeMap<String, String>,
    groups: Vec<GroupSpec>,
) -> Result<Box<dyn Optimizer>> {
    use crate::{
        AdamWScheduleFree, AdamWScheduleFreeConfig, RAdamScheduleFree, RAdamScheduleFreeConfig,
        SgdScheduleFree, SgdScheduleFreeConfig,
    };
    let (lr, weight_decay, warmup_steps) =
        (args.learning_rate, args.weight_decay, args.warmup_steps);
    let betas = (args.adam_beta1, args.adam_beta2);
    let eps = args.adam_epsilon;
    let weight_lr_power = float_arg(optim_args, "weight_lr_power")?.unwrap_or(2.0);
    let r = float_arg(optim_args, "r")?.unwrap_or(0.0);
    Ok(match args.optim.as_str() {
        "schedule_free_adamw" => Box::new(AdamWScheduleFree::new(
            groups,
            AdamWScheduleFreeConfig {
                lr,
                betas,
                eps,
                weight_decay,
                warmup_steps,
                r,
                weight_lr_power,
                ..Default::default()
            },
        )?),
        "schedule_free_sgd" => Box::new(SgdScheduleFree::new(
            groups,
            SgdScheduleFreeConfig {
                lr,
                weight_decay,
                warmup_steps,
                r,
                weight_lr_power,
                ..Default::default()
            },
        )?),
        "schedule_free_radam" => Box::new(RAdamScheduleFree::new(
            groups,
            RAdamScheduleFreeConfig {
                lr,
                betas,
                eps,
                weight_decay,
                r,
                weight_lr_power,
                ..Default::default()
            },
        )?),
        other => return Err(refusal(other)),
    })
}

/// The error for a name the factory does not build: the reason `OptimizerNames::support`
/// gives, or "not an upstream name" with the list of working ones.
fn refusal(name: &str) -> Error {
    let (why, instead) = match name.parse::<OptimizerNames>().map(OptimizerNames::support) {
        Ok(OptimizerSupport::Refused { why, instead }) => (why.to_string(), instead.to_string()),
        Ok(OptimizerSupport::Working { .. }) => (
            "it is marked working but the factory has no arm for it (a tchtrain bug)".into(),
            "adamw_torch_fused".into(),
        ),
        Err(_) => (
            format!(
                "it is not one of upstream's OptimizerNames (working here: {})",
                supported_optimizers().join(", ")
            ),
            "adamw_torch_fused".into(),
        ),
    };
    Error::UnsupportedOptimizer {
        name: name.to_string(),
        why,
        instead,
    }
}
