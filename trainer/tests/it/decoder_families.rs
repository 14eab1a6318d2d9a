//! The decoder families built on the Llama house since transformers 5 — the mixtures of
//! experts (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral, OLMoE; `output_router_logits`
//! on), Granite (its multipliers), SmolLM3 (NoPE layers), OLMo 2 (post-norms), OLMo 3 (its
//! sliding layers' own RoPE) and Gemma 3's multimodal checkpoints (`gemma3`:
//! `Gemma3ForConditionalGeneration` on text) — against transformers 5.23
//! (`scripts/reference/decoder_families.py`): tiny seeded checkpoints, one row padded.
//!
//! - The logits, the total loss (for a mixture of experts the language-model loss plus
//!   `router_aux_loss_coef` × the load-balancing `aux_loss`, compared too) and every gradient
//!   (the experts' 3-D weights and the routers' included), in float32 and under CPU bfloat16
//!   autocast.
//! - `save_pretrained` writes the tensors upstream's `save_pretrained` wrote, under its names.
//! - Each family trained 20 steps by the Trainer as upstream's.
//!
//! Tolerance: 0. The experts run as upstream's default `experts_implementation`
//! (`grouped_mm`: the same libtorch `_grouped_mm` over the same sorted rows), the router, the
//! auxiliary loss and the families' changes op for op, so every float is upstream's.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use tch::{Device, Kind, Tensor};
use tchtrain_accelerate::AutocastGuard;
use tchtrain_models::{
    AutoTask, LoadOptions, ModelInputs, PreTrainedModel, TrainableModel, from_pretrained_dir,
};
use tchtrain_testing::{assert_exact, assets, compare, lock};

pub(crate) fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// The names of the model's trainable parameters in the var store's creation order.
pub(crate) fn parameter_order(model: &dyn PreTrainedModel) -> Vec<String> {
    let vars = model.var_store().variables();
    model
        .var_store()
        .trainable_variables()
        .iter()
        .map(|t| {
            vars.iter()
                .find(|(_, v)| v.data_ptr() == t.data_ptr())
                .map_or_else(|| "?".to_string(), |(n, _)| n.clone())
        })
        .collect()
}

/// Logits, loss, aux loss and gradient differences of one run (`prefix` "" or "autocast.").
/// The gradients are read under `grad.<grad_names><name>` (peft's keys carry
/// `base_model.model.`); every trained parameter must have one.
pub(crate) fn run(
    model: &mut dyn TrainableModel,
    r: &HashMap<String, Tensor>,
    prefix: &str,
    autocast: bool,
    grad_names: &str,
) -> Result<[f64; 4]> {
    run_in_mode(model, r, prefix, autocast, grad_names, false)
}

/// [`run`] in training mode when `training` (the reference's `model.train()`: the same
/// numbers without dropout, but not for parts whose computation depends on the mode, such as
/// bitsandbytes' 8-bit layers).
pub(crate) fn run_in_mode(
    model: &mut dyn TrainableModel,
    r: &HashMap<String, Tensor>,
    prefix: &str,
    autocast: bool,
    grad_names: &str,
    training: bool,
) -> Result<[f64; 4]> {
    let guard = || -> Result<Option<AutocastGuard>> {
        Ok(match autocast {
            true => Some(AutocastGuard::enter(Device::Cpu, Kind::BFloat16)?),
            false => None,
        })
    };
    if training {
        model.train();
    } else {
        model.eval();
    }
    let inputs = ModelInputs {
        input_ids: r.get("input_ids"),
        attention_mask: r.get("attention_mask"),
        ..Default::default()
    };
    let logits = {
        let _g = guard()?;
        tch::no_grad(|| model.forward(&inputs))?
            .logits
            .context("logits")?
    };
    let logits = max_abs(&logits, &r[&format!("{prefix}logits")]);
    for (_, v) in model.var_store().variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let out = {
        let _g = guard()?;
        model.forward(&ModelInputs {
            labels: r.get("labels"),
            ..inputs
        })?
    };
    let loss = out.loss.context("loss")?.to_kind(Kind::Float);
    loss.backward();
    let loss = max_abs(&loss.reshape([1]), &r[&format!("{prefix}loss")]);
    let aux = match r.get(&format!("{prefix}aux_loss")) {
        Some(expected) => {
            let aux = out.aux_loss.context("aux_loss")?.to_kind(Kind::Float);
            max_abs(&aux.reshape([1]), expected)
        }
        None => {
            assert!(out.aux_loss.is_none(), "an aux loss without experts");
            0.0
        }
    };
    let vars = model.var_store().variables();
    let grad_prefix = format!("{prefix}grad.{grad_names}");
    let (mut grads, mut n) = (0.0f64, 0);
    for (key, expected) in r.iter().filter(|(k, _)| k.starts_with(&grad_prefix)) {
        let name = &key[grad_prefix.len()..];
        let var = vars
            .get(name)
            .with_context(|| format!("no parameter {name}"))?;
        let d = max_abs(&var.grad(), expected);
        if d > 0.0 {
            eprintln!("{prefix}grad of {name} differs by {d:.3e}");
        }
        grads = grads.max(d);
        n += 1;
    }
    // A multimodal model's vision tower gets no gradient from text (upstream's neither).
    let trained = vars
        .values()
        .filter(|t| t.requires_grad() && t.grad().defined())
        .count();
    assert_eq!(n, trained, "every gradient compared");
    Ok([logits, loss, aux, grads])
}

/// Every family, float32 and bf16 autocast: logits, loss, aux loss and gradients equal to
/// upstream's, parameters in upstream's order, `save_pretrained` as upstream's.
#[test]
fn decoder_families_equal_upstream() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/decoder_families");
    for case in [
        "qwen3_moe",
        "qwen2_moe",
        "mixtral",
        "olmoe",
        "gpt_oss",
        "granite",
        "smollm3",
        "olmo2",
        "olmo3",
        "gemma3",
    ] {
        family_equals_upstream(&dir, case, &dir.join(case))?;
    }
    Ok(())
}

/// Qwen3.5 and Qwen3.5-MoE (`scripts/reference/qwen3_5.py`): the hybrid layers (Gated
/// DeltaNet linear attention through upstream's torch fallbacks, the gated full attention)
/// as [`decoder_families_equal_upstream`] checks its families, on the 2 × 8 batch and on a
/// 2 × 150 one (three of the delta rule's 64-token chunks, padding inside the last); and a
/// `qwen3_5` multimodal checkpoint read by `AutoModelForCausalLM` as upstream reads it (its
/// language model; the vision tower and `mtp.*` left out), saved as upstream's
/// `Qwen3_5ForCausalLM` saves it; and `Qwen3_5TextForSequenceClassification`.
#[test]
fn qwen3_5_equal_upstream() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/qwen3_5");
    for (case, layer) in [
        ("qwen3_5_text", "Qwen3_5DecoderLayer"),
        ("qwen3_5_moe_text", "Qwen3_5MoeDecoderLayer"),
    ] {
        family_equals_upstream(&dir, case, &dir.join(case))?;
        // FSDP's wrap class, as upstream's `_no_split_modules` names it.
        let model = from_pretrained_dir(
            &dir.join(case),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        assert_eq!(model.no_split_modules(), [layer], "{case}");
    }
    family_equals_upstream(&dir, "qwen3_5", &dir.join("qwen3_5.saved"))?;
    // The sequence classifier (the last real token pooled).
    family_head_equals_upstream(
        &dir,
        "qwen3_5_text_seqcls",
        &dir.join("qwen3_5_text_seqcls"),
        AutoTask::SequenceClassification { num_labels: None },
    )
}

/// Gemma 4 (`scripts/reference/gemma4.py`): the dense text model with every part (wider
/// full-attention heads with values from the keys' projection, key / value sharing with
/// double-wide MLPs, per-layer input embeddings, soft-capped logits, drawn `layer_scalar`s),
/// the one with experts beside each MLP, and a `gemma4` checkpoint's text path (its image
/// placeholder embedded as the pad token) saved as upstream saves it: logits, loss and every
/// gradient equal upstream's on the 8- and 150-token batches, in float32 and bf16 autocast.
#[test]
fn gemma4_equals_upstream() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/gemma4");
    for case in ["gemma4_text", "gemma4_text_moe"] {
        family_equals_upstream(&dir, case, &dir.join(case))?;
        let model = from_pretrained_dir(
            &dir.join(case),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        assert_eq!(
            model.no_split_modules(),
            ["Gemma4TextDecoderLayer"],
            "{case}"
        );
        assert!(model.accepts_loss_kwargs(), "{case}");
    }
    family_equals_upstream(&dir, "gemma4", &dir.join("gemma4.saved"))?;
    Ok(())
}

/// One family's case of `dir`: loaded from `dir/<case>`, its parameter order, its
/// `save_pretrained` against the checkpoint in `saved_as`, then `<case>.safetensors` (and
/// `<case>.long.safetensors` where the reference has it) run in float32 and under autocast.
fn family_equals_upstream(
    dir: &std::path::Path,
    case: &str,
    saved_as: &std::path::Path,
) -> Result<()> {
    family_head_equals_upstream(dir, case, saved_as, AutoTask::CausalLm)
}

/// [`family_equals_upstream`] for the head of `task`.
fn family_head_equals_upstream(
    dir: &std::path::Path,
    case: &str,
    saved_as: &std::path::Path,
    task: AutoTask,
) -> Result<()> {
    let path = dir.join(format!("{case}.safetensors"));
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    let loaded = from_pretrained_dir(&dir.join(case), task, Device::Cpu, &LoadOptions::default())?;
    assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
    let mut model = loaded.model;
    let upstream: Vec<String> = serde_json::from_str(&std::fs::read_to_string(
        dir.join(format!("{case}.parameters.json")),
    )?)?;
    // Gemma 4's vision tower and projector are carried frozen: upstream trains them too,
    // but the text path gives them no gradient (Gemma 3's are built and trained).
    let trained = parameter_order(&*model);
    let upstream: Vec<String> = upstream
        .into_iter()
        .filter(|n| {
            trained.contains(n)
                || !(n.starts_with("model.vision_tower.")
                    || n.starts_with("model.multi_modal_projector.")
                    || n.starts_with("model.embed_vision."))
        })
        .collect();
    assert_eq!(
        parameter_order(&*model),
        upstream,
        "{case}: parameter order"
    );
    // `save_pretrained` writes upstream's checkpoint: the experts one by one under the
    // family's names (Mixtral's `block_sparse_moe.experts.{j}.w1`), the same bytes.
    let saved =
        std::env::temp_dir().join(format!("tchtrain-moe-save-{case}-{}", std::process::id()));
    model.save_pretrained(&saved)?;
    let ours = tchtrain_models::read_checkpoint(&saved)?;
    let theirs = tchtrain_models::read_checkpoint(saved_as)?;
    let sorted = |mut v: Vec<(String, Tensor)>| {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let (ours, theirs) = (sorted(ours), sorted(theirs));
    assert_eq!(
        ours.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        theirs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        "{case}: saved names"
    );
    for ((name, a), (_, b)) in ours.iter().zip(&theirs) {
        assert!(a.equal(b), "{case}: saved {name} differs");
    }
    let _ = std::fs::remove_dir_all(&saved);
    for file in [
        format!("{case}.safetensors"),
        format!("{case}.long.safetensors"),
    ] {
        let path = dir.join(&file);
        if !path.exists() {
            continue;
        }
        let r: HashMap<String, Tensor> = Tensor::read_safetensors(&path)?.into_iter().collect();
        for (prefix, autocast) in [("", false), ("autocast.", true)] {
            let [logits, loss, aux, grads] = run(&mut *model, &r, prefix, autocast, "")?;
            eprintln!(
                "{file} {prefix}: logits {logits:.3e}, loss {loss:.3e}, aux_loss {aux:.3e}, gradients {grads:.3e}"
            );
            assert_eq!(
                [logits, loss, aux, grads],
                [0.0; 4],
                "{file} {prefix}: logits, loss, aux_loss, gradients"
            );
        }
    }
    Ok(())
}

/// `decoder_families.py`'s, `qwen3_5.py`'s and `gemma4.py`'s Trainer runs: each family's tiny model (the mixtures of experts
/// with their router loss on at 0.05) trained 20 steps (batch 4, cosine schedule after 2
/// warm-up steps, weight decay 0.1, clipping, evaluation every 10 steps) on the Hamlet
/// blocks: every logged value equals upstream's Trainer's to the bit — gpt-oss's and Gemma 4
/// MoE's within two float32 ulps (see [`within_two_ulps`]), gpt-oss's eval losses within
/// [`GPT_OSS_EVAL_BOUND`].
#[test]
fn decoder_families_train_as_upstream() -> Result<()> {
    let _g = lock();
    for case in [
        "qwen3_moe",
        "qwen2_moe",
        "mixtral",
        "olmoe",
        "granite",
        "smollm3",
        "olmo2",
        "olmo3",
        "gemma3",
        "gpt_oss",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "gemma4_text",
        "gemma4_text_moe",
    ] {
        let reference = match case {
            "qwen3_5_text" | "qwen3_5_moe_text" => "qwen3_5",
            "gemma4_text" | "gemma4_text_moe" => "gemma4",
            _ => "decoder_families",
        };
        let dir = assets().join(format!("reference/{reference}/trainer_{case}"));
        let out =
            std::env::temp_dir().join(format!("tchtrain-family-{case}-{}", std::process::id()));
        let (log_history, global_step) = crate::parity::train_family_on_blocks(&dir, &out)?;
        let read = |name: &str| -> Result<serde_json::Value> {
            Ok(serde_json::from_str(&std::fs::read_to_string(
                dir.join(name),
            )?)?)
        };
        let expected = read("log_history.json")?;
        if case == "gpt_oss" {
            within(case, &log_history, &expected, GPT_OSS_EVAL_BOUND)?;
        } else if case == "gemma4_text_moe" {
            within_two_ulps(case, &log_history, &expected)?;
        } else {
            assert_exact(case, &compare(case, &log_history, &expected)?);
        }
        assert_eq!(
            global_step,
            read("train_output.json")?["global_step"].as_i64().unwrap()
        );
        let _ = std::fs::remove_dir_all(&out);
    }
    Ok(())
}

/// LoRA on the experts' 3-D weights as peft's `target_parameters` (`scripts/reference/
/// peft_experts.py`): the tiny Qwen3-MoE with `q_proj` and both expert weights adapted.
/// After the same seed the drawn adapter equals peft's, under peft's names (the outer
/// `ParamWrapper` `experts` on `down_proj`, `experts.base_layer` on `gate_up_proj`); peft's
/// saved adapter (its lora_B redrawn) loads, and the logits, the loss and every adapter
/// gradient equal peft's in float32 and under bf16 autocast; `save_adapter` writes the same
/// tensors peft wrote.
#[test]
fn qwen3_moe_expert_lora_equals_peft() -> Result<()> {
    lora_equals_peft("peft_experts")
}

/// LoRA on Qwen3.5's layers (`scripts/reference/peft_qwen3_5.py`): the gated attention's
/// `q_proj` / `o_proj`, the linear attention's `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
/// `in_proj_a` and `out_proj`, the MLPs' `gate_proj` — drawn, run and saved as peft's, as
/// [`qwen3_moe_expert_lora_equals_peft`] checks.
#[test]
fn qwen3_5_lora_equals_peft() -> Result<()> {
    lora_equals_peft("peft_qwen3_5")
}

/// LoRA on Gemma 4's layers (`scripts/reference/peft_gemma4.py`): the attention's
/// projections where a layer has them (the layers reusing keys and values have no `k_proj` /
/// `v_proj`, the full layers no `v_proj`), `gate_proj` and the per-layer input gate — drawn,
/// run and saved as peft's, as [`qwen3_moe_expert_lora_equals_peft`] checks.
#[test]
fn gemma4_lora_equals_peft() -> Result<()> {
    lora_equals_peft("peft_gemma4")
}

/// A peft reference's draws, run and save (see [`qwen3_moe_expert_lora_equals_peft`]).
fn lora_equals_peft(reference: &str) -> Result<()> {
    use tchtrain_models::{LoraConfig, PeftModel, get_peft_model};
    let _g = lock();
    let dir = assets().join("reference").join(reference);
    let load_base = || -> Result<Box<dyn PreTrainedModel>> {
        Ok(from_pretrained_dir(
            &dir.join("base"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model)
    };
    let read = |name: &str| -> Result<HashMap<String, Tensor>> {
        Ok(Tensor::read_safetensors(dir.join(name))
            .with_context(|| format!("{} (run `cargo xtask setup`)", dir.display()))?
            .into_iter()
            .collect())
    };
    // The draws.
    let config = LoraConfig::from_file(&dir.join("adapter/adapter_config.json"))?;
    tch::manual_seed(1);
    let drawn = get_peft_model(
        load_base()?,
        LoraConfig {
            inference_mode: false,
            ..config
        },
    )?;
    let initial = read("initial.safetensors")?;
    let ours: HashMap<String, Tensor> = drawn.adapter_state_dict("default")?.into_iter().collect();
    let mut names: Vec<&String> = ours.keys().collect();
    names.sort();
    let mut expected: Vec<&String> = initial.keys().collect();
    expected.sort();
    assert_eq!(names, expected, "adapter names");
    for (name, t) in &initial {
        assert!(ours[name].equal(t), "drawn {name} differs from peft's");
    }
    // peft's adapter, run.
    let mut model = PeftModel::from_pretrained(load_base()?, &dir.join("adapter"), true)?;
    let r = read("run.safetensors")?;
    for (prefix, autocast) in [("", false), ("autocast.", true)] {
        let diffs = run(&mut model, &r, prefix, autocast, "base_model.model.")?;
        eprintln!("{reference} {prefix}: logits, loss, aux_loss, gradients {diffs:?}");
        assert_eq!(
            diffs, [0.0; 4],
            "{prefix}: logits, loss, aux_loss, gradients"
        );
    }
    // Saved as peft saved it.
    let saved = std::env::temp_dir().join(format!("tchtrain-expert-lora-{}", std::process::id()));
    model.save_adapter(&saved)?;
    let ours = Tensor::read_safetensors(saved.join("adapter_model.safetensors"))?;
    let theirs = Tensor::read_safetensors(dir.join("adapter/adapter_model.safetensors"))?;
    assert_eq!(ours.len(), theirs.len(), "saved adapter tensors");
    for (name, t) in &theirs {
        let (_, mine) = ours
            .iter()
            .find(|(n, _)| n == name)
            .with_context(|| format!("saved adapter lacks {name}"))?;
        assert!(mine.equal(t), "saved {name} differs");
    }
    let _ = std::fs::remove_dir_all(&saved);
    Ok(())
}

/// gpt-oss's run against upstream's: every logged loss, grad_norm, learning rate, eval loss
/// and the train loss within two float32 ulps (relative `2 * f32::EPSILON`). Measured: 39 of
/// 42 values equal, the step-10 and step-11 losses and the step-20 grad_norm one ulp off
/// (9.6e-8), the trajectory itself equal (the next steps' losses and every eval loss are the
/// same floats), so the difference is in the reported scalars, not in the weights. It
/// depends on where the heap puts the buffers: on an AMD EPYC machine the same binary gave
/// one grad_norm 1.92e-7 off (two ulps) and, with glibc's heap laid out differently
/// (`MALLOC_TOP_PAD_=1048576`), within one ulp, so a reduction here rounds by its operands'
/// alignment; which one is not found yet (the model's logits, loss, aux loss and gradients
/// are equal to the bit in `decoder_families_equal_upstream`). Gemma 4's mixture of experts
/// likewise, measured on an AMD EPYC (AVX2) at the 1024-token vocabulary: the 10 first
/// steps equal to the bit, the step-10 eval loss one ulp off (7.3e-8), then losses and
/// grad norms within 2.1e-7 (it was equal to the bit at a 49152-token vocabulary; its
/// logits, loss and gradients are in `gemma4_equals_upstream`).
fn within_two_ulps(
    case: &str,
    ours: &[tchtrain_callbacks::JsonMap],
    expected: &serde_json::Value,
) -> Result<()> {
    within(case, ours, expected, TWO_ULPS)
}

/// Two float32 ulps, relative.
const TWO_ULPS: f64 = 2.0 * f32::EPSILON as f64;

/// gpt-oss's eval losses (its training values stay within [`TWO_ULPS`]): on a second AMD
/// EPYC machine every training loss and grad_norm of the 20 steps was within one ulp
/// (1.4e-7, 1.0e-7) and the train loss within 1.8e-8, so the weights follow upstream's, but
/// one eval loss was 6.81e-6 off: an isolated jump of the size one token's changed expert
/// choice makes, a top-k router near-tie in the evaluation forward resolved the other way
/// by a one-ulp score difference (the alignment-dependent rounding described above). Which
/// token ties, and so the jump's size, depends on the machine: the bound is set an order of
/// magnitude above the one case measured, not at it; an error in the model's computation
/// shows in the training values, which stay held at two ulps.
const GPT_OSS_EVAL_BOUND: f64 = 1e-4;

/// Every logged loss, grad_norm, learning rate and train loss of `ours` within two float32
/// ulps of upstream's, and every eval loss within `eval_bound` (relative); the largest
/// difference per key is printed.
fn within(
    case: &str,
    ours: &[tchtrain_callbacks::JsonMap],
    expected: &serde_json::Value,
    eval_bound: f64,
) -> Result<()> {
    let expected = expected.as_array().context("log_history")?;
    assert_eq!(ours.len(), expected.len(), "{case}: number of log entries");
    let keys = [
        "loss",
        "grad_norm",
        "learning_rate",
        "eval_loss",
        "train_loss",
    ];
    let mut worst = [0.0f64; 5];
    for (o, e) in ours.iter().zip(expected) {
        for (key, worst) in keys.iter().zip(worst.iter_mut()) {
            let (Some(want), got) = (e.get(*key).and_then(serde_json::Value::as_f64), o.get(*key))
            else {
                continue;
            };
            let got = got
                .and_then(tchtrain_callbacks::JsonValue::as_f64)
                .with_context(|| format!("{case}: no {key}"))?;
            *worst = worst.max((got - want).abs() / want.abs().max(1e-12));
        }
    }
    let shown: Vec<String> = keys
        .iter()
        .zip(worst)
        .map(|(k, w)| format!("{k} {w:.2e}"))
        .collect();
    println!("{case}: max relative difference {}", shown.join(", "));
    let bounds = keys.map(|k| {
        if k == "eval_loss" {
            eval_bound
        } else {
            TWO_ULPS
        }
    });
    assert!(
        worst.iter().zip(bounds).all(|(w, b)| *w <= b),
        "{case}: beyond the relative bounds (eval_loss {eval_bound:.2e}, the others {TWO_ULPS:.2e}): {}",
        shown.join(", ")
    );
    Ok(())
}
