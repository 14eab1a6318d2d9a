//! Which parameters get weight decay: upstream `Trainer.get_decay_parameter_names` and the
//! two param groups `Trainer.create_optimizer` builds from it.
//!
//! Upstream (transformers 5.x) excludes a parameter when it lives in an `nn.LayerNorm`
//! module (`ALL_LAYERNORM_LAYERS`) or when its lower-cased full name matches one of
//! [`FORBIDDEN_NAME_PATTERNS`]. A `VarStore` carries no module types, so the LayerNorm rule
//! takes the LayerNorm module paths from the caller (GPT-2's `ln_1`, `ln_2`, `ln_f` match no
//! name pattern and need it).

use tch::Tensor;

use crate::GroupSpec;

/// Upstream's `forbidden_name_patterns` (regular expressions searched in the lower-cased
/// parameter name).
pub const FORBIDDEN_NAME_PATTERNS: [&str; 5] = [
    r"bias",
    r"layernorm",
    r"rmsnorm",
    r"(?:^|\.)norm(?:$|\.)",
    r"_norm(?:$|\.)",
];

/// Whether `name` matches any of [`FORBIDDEN_NAME_PATTERNS`] (evaluated without a regex
/// engine: `(?:^|\.)norm(?:$|\.)` is "a dot-separated segment equals `norm`",
/// `_norm(?:$|\.)` is "a segment ends with `_norm`").
pub fn matches_forbidden_name(name: &str) -> bool {
    let name = name.to_lowercase();
    name.contains("bias")
        || name.contains("layernorm")
        || name.contains("rmsnorm")
        || name
            .split('.')
            .any(|seg| seg == "norm" || seg.ends_with("_norm"))
}

/// Whether parameter `name` receives weight decay: not in one of `layernorm_modules`
/// (module paths such as `transformer.ln_f`) and not matching a forbidden name pattern.
pub fn is_decay_parameter<S: AsRef<str>>(name: &str, layernorm_modules: &[S]) -> bool {
    let in_layernorm = layernorm_modules.iter().any(|m| {
        let m = m.as_ref();
        m.is_empty()
            || name
                .strip_prefix(m)
                .is_some_and(|rest| rest.starts_with('.'))
    });
    !in_layernorm && !matches_forbidden_name(name)
}

/// The names among `names` that receive weight decay, in order
/// (`Trainer.get_decay_parameter_names`).
///
/// ```
/// use tchtrain_optim::get_decay_parameter_names;
/// let names = ["h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight",
///              "model.norm.weight", "layers.0.input_layernorm.weight", "q_norm.weight"];
/// let decay = get_decay_parameter_names(&names, &["h.0.ln_1"]);
/// assert_eq!(decay, vec!["h.0.attn.c_attn.weight".to_string()]);
/// ```
pub fn get_decay_parameter_names<S: AsRef<str>, M: AsRef<str>>(
    names: &[S],
    layernorm_modules: &[M],
) -> Vec<String> {
    names
        .iter()
        .map(AsRef::as_ref)
        .filter(|n| is_decay_parameter(n, layernorm_modules))
        .map(str::to_string)
        .collect()
}

/// `Trainer.create_optimizer`'s two groups: the decay parameters with `weight_decay`, then
/// the others with 0. Parameters that do not require grad are left out, as upstream does.
pub fn decay_param_groups<M: AsRef<str>>(
    named_params: Vec<(String, Tensor)>,
    weight_decay: f64,
    layernorm_modules: &[M],
) -> Vec<GroupSpec> {
    let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
    for (name, t) in named_params {
        if !t.requires_grad() {
            continue;
        }
        if is_decay_parameter(&name, layernorm_modules) {
            decay.push((name, t));
        } else {
            no_decay.push((name, t));
        }
    }
    vec![
        GroupSpec::new(decay).with_weight_decay(weight_decay),
        GroupSpec::new(no_decay).with_weight_decay(0.0),
    ]
}
