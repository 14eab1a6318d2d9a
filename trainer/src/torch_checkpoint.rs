//! Upstream's own checkpoint files beside ours, so that transformers' Trainer resumes a
//! checkpoint written here and this Trainer resumes one written by Python:
//!
//! | file | content | written | read when |
//! |---|---|---|---|
//! | `optimizer.pt` | `optimizer.state_dict()` | AdamW / Adam / SGD / Adafactor | `optimizer.json` is absent |
//! | `scheduler.pt` | `lr_scheduler.state_dict()` | `LambdaLR` schedulers | `scheduler.json` is absent |
//! | `scaler.pt` | `GradScaler.state_dict()` | fp16 with a scaler | `scaler.json` is absent |
//! | `rng_state.pth` (`rng_state_{rank}.pth` for each rank of a multi-process run) | `python`, `numpy`, `cpu` (and `cuda`) generator states | always | `rng_state.safetensors` is absent |
//! | `training_args.bin` | the pickled `TrainingArguments` | never | always, to compare |
//!
//! The conversions of the optimizer, scheduler and scaler states live in `tchtrain-optim`
//! (`torch_state.rs`); this file decides which files are written and read.
//!
//! `rng_state.pth`'s `python` and `numpy` states are not used here (no Python `random` or
//! numpy draws happen in this Trainer): a checkpoint written here holds the states
//! `random.seed(seed)` and `np.random.seed(seed)` leave (what `set_seed` sets and nothing
//! here draws from), valid for upstream's `random.setstate` / `np.random.set_state`.
//!
//! As upstream's `_save_rng_state`, where CUDA is available `cuda` is the current device's
//! state, in a multi-process run a list of every visible device's
//! (`torch.cuda.random.get_rng_state_all()`); and as `_load_rng_state`, a multi-process run
//! reads its own rank's file, a list restoring the state of the device this rank trains on.
//! Rank 0 writes every rank's file: the ranks start from the same seed and draw the same
//! amounts, so their states are equal.
//!
//! `training_args.bin` is not written: a pickled `TrainingArguments` carries every field of
//! the Python dataclass (including ones this Trainer does not keep) and upstream never reads
//! it on resume. When a Python checkpoint has one, the arguments that change the run are
//! compared with this run's and the differences logged, in the form of upstream's
//! `compare_trainer_and_checkpoint_args`.

use std::path::Path;

use tch::{Device, Tensor};
use tchtrain_optim::{
    LrScheduler, OPTIMIZER_STATE_NAME, Optimizer, SCALER_NAME, SCHEDULER_NAME,
    TORCH_OPTIMIZER_NAME, TORCH_SCALER_NAME, TORCH_SCHEDULER_NAME,
};
use tchtrain_serialization::{Object, ObjectKind, Value};
use tchtrain_training_args::TrainingArguments;

use crate::error::{Error, Result};

/// upstream's generator states file of a checkpoint.
pub const TORCH_RNG_STATE_NAME: &str = "rng_state.pth";
/// upstream's pickled `TrainingArguments` of a checkpoint.
pub const TORCH_TRAINING_ARGS_NAME: &str = "training_args.bin";

fn s(text: &str) -> Value {
    Value::Str(text.to_string())
}

/// Writes `optimizer.pt` + `scheduler.pt` (when both have a torch form), `scaler.pt` (with
/// a scaler) and `rng_state.pth` into `dir`.
pub(crate) fn write_torch_files(
    dir: &Path,
    order: &[String],
    optimizer: Option<&dyn Optimizer>,
    scheduler: Option<&dyn LrScheduler>,
    scaler: Option<tchtrain_optim::GradScalerState>,
    args: &TrainingArguments,
    device: Device,
) -> Result<()> {
    let (seed, world_size) = (args.seed, args.world_size());
    // Upstream loads the two together (`_load_optimizer_and_scheduler` needs both files).
    if let (Some(opt), Some(sched)) = (optimizer, scheduler) {
        match (
            tchtrain_optim::optimizer_to_torch(opt, order),
            tchtrain_optim::scheduler_to_torch(sched),
        ) {
            (Ok(o), Some(sc)) => {
                tchtrain_serialization::save(dir.join(TORCH_OPTIMIZER_NAME), &o)?;
                tchtrain_serialization::save(dir.join(TORCH_SCHEDULER_NAME), &sc)?;
            }
            (Err(tchtrain_optim::Error::TorchState { detail, .. }), _) => {
                log::info!("{TORCH_OPTIMIZER_NAME} not written: {detail}");
            }
            (Err(e), _) => return Err(e.into()),
            (Ok(_), None) => log::info!(
                "{TORCH_SCHEDULER_NAME} not written: `{}` is not a torch LambdaLR",
                sched.name()
            ),
        }
    }
    if let Some(state) = scaler {
        tchtrain_serialization::save(
            dir.join(TORCH_SCALER_NAME),
            &tchtrain_optim::grad_scaler_to_torch(&state),
        )?;
    }
    let mut rng = vec![
        (s("python"), python_random_state(seed)),
        (s("numpy"), numpy_random_state(seed)),
        (
            s("cpu"),
            Value::Tensor(tchtrain_optim::tensor_to_torch(
                &tchtrain_accelerate::get_rng_state(Device::Cpu)?,
            )?),
        ),
    ];
    if tch::Cuda::is_available() {
        let state = |d: Device| -> Result<Value> {
            Ok(Value::Tensor(tchtrain_optim::tensor_to_torch(
                &tchtrain_accelerate::get_rng_state(d)?,
            )?))
        };
        let cuda = if world_size > 1 {
            Value::List(
                (0..tch::Cuda::device_count())
                    .map(|i| state(Device::Cuda(i as usize)))
                    .collect::<Result<_>>()?,
            )
        } else {
            state(if device.is_cuda() {
                device
            } else {
                Device::Cuda(0)
            })?
        };
        rng.push((s("cuda"), cuda));
    }
    let rng = Value::Dict(rng);
    for name in torch_rng_state_names(world_size) {
        tchtrain_serialization::save(dir.join(name), &rng)?;
    }
    Ok(())
}

/// Restores the optimizer from `optimizer.pt` when the checkpoint has it but not our
/// `optimizer.json` (a Python checkpoint); logs the hyper-parameters that differ.
pub(crate) fn load_optimizer(
    opt: &mut dyn Optimizer,
    dir: &Path,
    order: &[String],
) -> Result<bool> {
    let path = dir.join(TORCH_OPTIMIZER_NAME);
    if dir.join(OPTIMIZER_STATE_NAME).is_file() || !path.is_file() {
        return Ok(false);
    }
    let value = tchtrain_optim::load_torch_file(&path)?;
    let differences = tchtrain_optim::optimizer_from_torch(opt, &value, order).map_err(|e| {
        Error::InvalidCheckpoint {
            dir: dir.to_path_buf(),
            detail: e.to_string(),
        }
    })?;
    if !differences.is_empty() {
        log::warn!(
            "The optimizer's hyper-parameters differ from the checkpoint's {TORCH_OPTIMIZER_NAME} (this run's are kept):\n\t{}",
            differences.join("\n\t")
        );
    }
    Ok(true)
}

/// The model's parameter names in upstream's `named_parameters()` order: the order the
/// variables were created in (every model creates them in upstream's registration order).
pub(crate) fn upstream_parameter_order(model: &dyn tchtrain_models::TrainableModel) -> Vec<String> {
    tchtrain_models::ordered_variable_names(model.var_store())
}

/// Restores the scheduler from `scheduler.pt` when the checkpoint has it but not our
/// `scheduler.json`.
pub(crate) fn load_scheduler(sched: &mut dyn LrScheduler, dir: &Path) -> Result<bool> {
    let path = dir.join(TORCH_SCHEDULER_NAME);
    if dir.join(SCHEDULER_NAME).is_file() || !path.is_file() {
        return Ok(false);
    }
    let value = tchtrain_optim::load_torch_file(&path)?;
    tchtrain_optim::scheduler_from_torch(sched, &value).map_err(|e| Error::InvalidCheckpoint {
        dir: dir.to_path_buf(),
        detail: e.to_string(),
    })?;
    Ok(true)
}

/// Restores the loss scaler from `scaler.pt` when the checkpoint has it but not our
/// `scaler.json`.
pub(crate) fn load_scaler(scaler: &mut tchtrain_optim::GradScaler, dir: &Path) -> Result<()> {
    let path = dir.join(TORCH_SCALER_NAME);
    if dir.join(SCALER_NAME).is_file() || !path.is_file() {
        return Ok(());
    }
    let value = tchtrain_optim::load_torch_file(&path)?;
    let state =
        tchtrain_optim::grad_scaler_from_torch(&value).map_err(|e| Error::InvalidCheckpoint {
            dir: dir.to_path_buf(),
            detail: e.to_string(),
        })?;
    scaler.load_state_dict(&state)?;
    Ok(())
}

/// Named generator states (`cpu`, `cuda`), as `rng_state.safetensors` holds them.
pub(crate) type GeneratorStates = Vec<(String, Tensor)>;

/// The generator files of a checkpoint for `world_size` processes: `rng_state.pth`, or
/// `rng_state_{rank}.pth` for each rank (upstream's `_save_rng_state`).
fn torch_rng_state_names(world_size: usize) -> Vec<String> {
    if world_size > 1 {
        (0..world_size)
            .map(|r| format!("rng_state_{r}.pth"))
            .collect()
    } else {
        vec![TORCH_RNG_STATE_NAME.to_string()]
    }
}

/// The `cpu` (and, on a GPU, `cuda`) generator states of this process's upstream file
/// (`rng_state.pth`, or in a run of `world_size` processes `rng_state_{process_index}.pth`)
/// as `rng_state.safetensors` would give them: a list-valued `cuda` gives the state of
/// `device`'s index. `None` without the file, as upstream's `_load_rng_state`.
pub(crate) fn read_generator_states(
    dir: &Path,
    device: Device,
    world_size: usize,
    process_index: usize,
) -> Result<Option<(String, GeneratorStates)>> {
    let file = if world_size > 1 {
        format!("rng_state_{process_index}.pth")
    } else {
        TORCH_RNG_STATE_NAME.to_string()
    };
    let path = dir.join(&file);
    if !path.is_file() {
        return Ok(None);
    }
    let value = tchtrain_optim::load_torch_file(&path)?;
    let invalid = |detail: String| Error::InvalidCheckpoint {
        dir: dir.to_path_buf(),
        detail: format!("{file}: {detail}"),
    };
    let mut out = Vec::new();
    match value.get("cpu").and_then(Value::as_tensor) {
        Some(t) => out.push(("cpu".to_string(), tchtrain_optim::tensor_from_torch(t)?)),
        None => return Err(invalid("no `cpu` generator state".into())),
    }
    if let Device::Cuda(index) = device {
        let cuda =
            match value.get("cuda") {
                None => None,
                Some(Value::List(states)) => Some(
                    states
                        .get(index)
                        .and_then(Value::as_tensor)
                        .ok_or_else(|| {
                            invalid(format!(
                                "its `cuda` list holds {} device state(s), none for cuda:{index}",
                                states.len()
                            ))
                        })?,
                ),
                Some(v) => Some(v.as_tensor().ok_or_else(|| {
                    invalid("`cuda` is neither a state nor a list of them".into())
                })?),
            };
        if let Some(t) = cuda {
            out.push(("cuda".to_string(), tchtrain_optim::tensor_from_torch(t)?));
        }
    }
    Ok(Some((file, out)))
}

/// The arguments whose difference changes a resumed run, by upstream name.
const COMPARED_ARGS: [&str; 17] = [
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "num_train_epochs",
    "seed",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "optim",
    "fp16",
    "bf16",
    "train_sampling_strategy",
];

/// A pickled argument as text (an enum member by its value), `None` when absent.
fn pickled_arg(v: &Value) -> Option<String> {
    Some(match v {
        Value::Object(Object {
            kind: ObjectKind::Reduce,
            args,
            ..
        }) => args.first()?.as_str()?.to_string(),
        Value::Str(x) => x.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        _ => return None,
    })
}

fn json_arg(v: &serde_json::Value) -> Option<String> {
    Some(match v {
        serde_json::Value::String(x) => x.clone(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Number(n) => n.as_f64()?.to_string(),
        _ => return None,
    })
}

/// The differences that change the run between `args` and a checkpoint's
/// `training_args.bin` (empty without the file), as upstream's
/// `compare_trainer_and_checkpoint_args` words them; logged as one warning.
pub(crate) fn compare_training_args(dir: &Path, args: &TrainingArguments) -> Result<Vec<String>> {
    let path = dir.join(TORCH_TRAINING_ARGS_NAME);
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let theirs = tchtrain_optim::load_torch_file(&path)?;
    let ours = serde_json::to_value(args).map_err(|source| Error::Json {
        path: path.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for key in COMPARED_ARGS {
        let (Some(a), Some(b)) = (
            ours.get(key).and_then(json_arg),
            theirs.get(key).and_then(pickled_arg),
        ) else {
            continue;
        };
        let equal = match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(x), Ok(y)) => x == y,
            _ => a == b,
        };
        if !equal {
            out.push(format!(
                "{key}: {a} (from args) != {b} (from {TORCH_TRAINING_ARGS_NAME})"
            ));
        }
    }
    if !out.is_empty() {
        log::warn!(
            "Warning: The following arguments do not match the ones in the `{TORCH_TRAINING_ARGS_NAME}` within the checkpoint directory: \n\t{}",
            out.join("\n\t")
        );
    }
    Ok(out)
}

const N: usize = 624;

/// MT19937's `init_genrand` (numpy's legacy `mt19937_seed`).
fn init_genrand(seed: u32) -> [u32; N] {
    let mut mt = [0u32; N];
    mt[0] = seed;
    for i in 1..N {
        mt[i] = 1_812_433_253u32
            .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
            .wrapping_add(i as u32);
    }
    mt
}

/// MT19937's `init_by_array` (CPython's `random.seed(int)`).
fn init_by_array(key: &[u32]) -> [u32; N] {
    let mut mt = init_genrand(19_650_218);
    let (mut i, mut j) = (1usize, 0usize);
    for _ in 0..N.max(key.len()) {
        mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
            .wrapping_add(key[j])
            .wrapping_add(j as u32);
        i += 1;
        j += 1;
        if i >= N {
            mt[0] = mt[N - 1];
            i = 1;
        }
        if j >= key.len() {
            j = 0;
        }
    }
    for _ in 0..N - 1 {
        mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
            .wrapping_sub(i as u32);
        i += 1;
        if i >= N {
            mt[0] = mt[N - 1];
            i = 1;
        }
    }
    mt[0] = 0x8000_0000;
    mt
}

/// `random.seed(seed); random.getstate()`: `(3, (624 words..., 624), None)`.
pub(crate) fn python_random_state(seed: u64) -> Value {
    // CPython keys the generator with the seed's 32-bit words, least significant first.
    let key: Vec<u32> = if seed >> 32 == 0 {
        vec![seed as u32]
    } else {
        vec![seed as u32, (seed >> 32) as u32]
    };
    let mut words: Vec<Value> = init_by_array(&key)
        .iter()
        .map(|&w| Value::Int(w as i64))
        .collect();
    words.push(Value::Int(N as i64));
    Value::Tuple(vec![Value::Int(3), Value::Tuple(words), Value::None])
}

/// `np.random.seed(seed); np.random.get_state()`: `("MT19937", uint32 array, 624, 0, 0.0)`,
/// the array pickled as numpy pickles it. numpy takes the seed modulo 2**32 only below it;
/// upstream's seeds are 32-bit.
pub(crate) fn numpy_random_state(seed: u64) -> Value {
    let bytes: Vec<u8> = init_genrand(seed as u32)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let object = |module: &str, name: &str, args, state| {
        Value::Object(Object {
            module: module.into(),
            name: name.into(),
            kind: ObjectKind::Reduce,
            args,
            state: Some(Box::new(state)),
        })
    };
    let dtype = object(
        "numpy",
        "dtype",
        vec![s("u4"), Value::Bool(false), Value::Bool(true)],
        Value::Tuple(vec![
            Value::Int(3),
            s("<"),
            Value::None,
            Value::None,
            Value::None,
            Value::Int(-1),
            Value::Int(-1),
            Value::Int(0),
        ]),
    );
    let array = object(
        "numpy._core.multiarray",
        "_reconstruct",
        vec![
            Value::Global {
                module: "numpy".into(),
                name: "ndarray".into(),
            },
            Value::Tuple(vec![Value::Int(0)]),
            Value::Bytes(b"b".to_vec()),
        ],
        Value::Tuple(vec![
            Value::Int(1),
            Value::Tuple(vec![Value::Int(N as i64)]),
            dtype,
            Value::Bool(false),
            Value::Bytes(bytes),
        ]),
    );
    Value::Tuple(vec![
        s("MT19937"),
        array,
        Value::Int(N as i64),
        Value::Int(0),
        Value::Float(0.0),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_seeding_matches_cpython_and_numpy() {
        // random.seed(42); random.getstate()[1][:3] and np.random.seed(42); get_state()[1][:3]
        let Value::Tuple(py) = python_random_state(42) else {
            panic!()
        };
        let Value::Tuple(words) = &py[1] else {
            panic!()
        };
        assert_eq!(words[0], Value::Int(2_147_483_648));
        assert_eq!(words[1], Value::Int(3_564_348_608));
        assert_eq!(words[2], Value::Int(1_266_698_288));
        assert_eq!(words[624], Value::Int(624));
        let mt = init_genrand(42);
        assert_eq!(&mt[..3], &[42, 3_107_752_595, 1_895_908_407]);
    }
}
