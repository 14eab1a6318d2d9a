//! 4-bit and 8-bit quantization (QLoRA's base) against bitsandbytes 0.50.2's CPU backend,
//! transformers 5.23 and peft 0.21.2 (`scripts/reference/bitsandbytes_4bit.py`,
//! `bitsandbytes_8bit.py`): the codes, absmax, double-quant state and LLM.int8's row codes and
//! scales bit-identical; `Linear4bit`'s and `Linear8bitLt`'s forward and backward equal; a model
//! quantized as it loads equals transformers' pre-quantized checkpoint tensor for tensor, that
//! checkpoint loads here, ours saves as transformers saved it; peft's LoRA over the quantized
//! model runs to the bit, and merges into it as peft merges.

use std::collections::HashMap;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};
use tchtrain_accelerate::AutocastGuard;
use tchtrain_models::{
    AutoTask, BitsAndBytesConfig, LoadOptions, ModelInputs, PeftModel, QuantType, TrainableModel,
    create_dynamic_map, from_pretrained_dir, is_quantized, quantize_4bit, quantize_blockwise,
};
use tchtrain_testing::{assets, lock};

fn reference(name: &str) -> Result<HashMap<String, Tensor>> {
    reference_in("bitsandbytes_4bit", name)
}

fn reference_in(script: &str, name: &str) -> Result<HashMap<String, Tensor>> {
    let path = assets().join("reference").join(script).join(name);
    Ok(Tensor::read_safetensors(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?
        .into_iter()
        .collect())
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.size() == b.size() && a.kind() == b.kind() && a.equal(b)
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

#[test]
fn quantize_4bit_equals_bitsandbytes() -> Result<()> {
    let _g = lock();
    let r = reference("functional.safetensors")?;
    let map = Tensor::from_slice(&create_dynamic_map());
    assert!(same(&map, &r["dynamic_map"]), "create_dynamic_map");
    // The C kernel's 8-bit blockwise codes.
    let (q, absmax) = quantize_blockwise(&r["v"], &create_dynamic_map(), 256)?;
    assert!(same(&q, &r["blockwise.q"]), "quantize_blockwise codes");
    assert!(
        same(&absmax, &r["blockwise.absmax"]),
        "quantize_blockwise absmax"
    );
    for w in ["a", "b", "c"] {
        for qt in ["nf4", "fp4"] {
            for dq in [0, 1] {
                let key = format!("{w}.{qt}.{dq}");
                let (packed, state) =
                    quantize_4bit(&r[w], 64, QuantType::parse(qt, "quant_type")?, dq == 1)?;
                assert!(same(&packed, &r[&format!("{key}.packed")]), "{key}: packed");
                assert!(
                    same(&state.absmax, &r[&format!("{key}.absmax")]),
                    "{key}: absmax"
                );
                assert!(
                    same(&state.code, &r[&format!("{key}.quant_map")]),
                    "{key}: quant_map"
                );
                if let Some(n) = &state.nested {
                    assert!(
                        same(&n.absmax, &r[&format!("{key}.nested_absmax")]),
                        "{key}: nested_absmax"
                    );
                    assert!(
                        same(&n.code, &r[&format!("{key}.nested_quant_map")]),
                        "{key}: nested_quant_map"
                    );
                    assert!(
                        same(&n.offset.reshape([1]), &r[&format!("{key}.offset")]),
                        "{key}: offset"
                    );
                }
                state.validate(&packed)?;
                // `F.dequantize_4bit` returns the weight's own dtype.
                let own = state.dequantize(&packed, state.dtype)?.to_kind(Kind::Float);
                assert!(
                    same(&own, &r[&format!("{key}.deq_f32")]),
                    "{key}: dequantized"
                );
                let bf16 = state.dequantize(&packed, Kind::BFloat16)?;
                assert!(
                    same(&bf16, &r[&format!("{key}.deq_bf16")]),
                    "{key}: dequantized bfloat16"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn linear_4bit_forward_and_backward_equal_bitsandbytes() -> Result<()> {
    let _g = lock();
    let r = reference("linear.safetensors")?;
    let (packed, state) = quantize_4bit(&r["weight"], 64, QuantType::Nf4, true)?;
    assert!(same(&packed, &r["packed"]), "Params4bit's packed weight");
    // The state as bitsandbytes serialises it, byte for byte (the JSON included).
    for (k, t) in state.as_dict("weight")? {
        let k = k.strip_prefix("weight.").unwrap_or(&k).to_string();
        let theirs = &r[&format!("state.{k}")];
        assert!(same(&t, theirs), "state {k}: {t:?} vs {theirs:?}");
    }
    for (prefix, compute, autocast) in [
        ("f32.", Kind::Float, false),
        ("bf16.", Kind::BFloat16, false),
        ("autocast.", Kind::Float, true),
    ] {
        let (packed, state) = quantize_4bit(&r["weight"], 64, QuantType::Nf4, true)?;
        let layer = tchtrain_models::Linear4bit {
            packed,
            state,
            compute_dtype: Some(compute),
        };
        let bias = r["bias"].copy().set_requires_grad(true);
        let x = r["x"].copy().set_requires_grad(true);
        let _guard = autocast
            .then(|| AutocastGuard::enter(Device::Cpu, Kind::BFloat16))
            .transpose()?;
        let y = layer.forward(&x, Some(&bias))?;
        drop(_guard);
        (&y * r["g"].to_kind(y.kind())).sum(y.kind()).backward();
        assert!(
            same(&y.detach(), &r[&format!("{prefix}y")]),
            "{prefix}: output"
        );
        assert!(
            same(&x.grad(), &r[&format!("{prefix}x_grad")]),
            "{prefix}: input gradient"
        );
        // `MatMul4Bit.backward`'s `grad.sum(0)` in the bias's dtype, then autograd's sum down
        // to its shape. bitsandbytes casts the bias itself to the compute dtype (its gradient
        // is then bfloat16 with that compute dtype); ours stays float32, the same values.
        assert_eq!(
            max_abs(&bias.grad(), &r[&format!("{prefix}bias_grad")]),
            0.0,
            "{prefix}: bias gradient"
        );
    }
    Ok(())
}

fn nf4() -> BitsAndBytesConfig {
    BitsAndBytesConfig::nf4(Kind::Float)
}

fn load(
    dir: &str,
    quantization_config: Option<BitsAndBytesConfig>,
) -> Result<Box<dyn tchtrain_models::PreTrainedModel>> {
    load_in("bitsandbytes_4bit", dir, quantization_config)
}

fn load_in(
    script: &str,
    dir: &str,
    quantization_config: Option<BitsAndBytesConfig>,
) -> Result<Box<dyn tchtrain_models::PreTrainedModel>> {
    let loaded = from_pretrained_dir(
        &assets().join("reference").join(script).join(dir),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions {
            quantization_config,
            ..LoadOptions::default()
        },
    )?;
    assert!(loaded.info.is_clean(), "{dir}: {}", loaded.info);
    Ok(loaded.model)
}

/// The model's tensors sorted by name.
fn sorted(tensors: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    let mut v = tensors;
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn a_model_quantized_on_load_equals_transformers_checkpoint_both_ways() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_4bit");
    let ours = load("base", Some(nf4()))?;
    assert!(is_quantized(&*ours));
    // Every linear but the head quantized as transformers quantized it.
    let theirs = sorted(tchtrain_models::read_checkpoint(&dir.join("prequantized"))?);
    let mine = sorted(ours.var_store().variables().into_iter().collect());
    assert_eq!(
        mine.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        theirs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        "the 4-bit state's keys"
    );
    for ((name, a), (_, b)) in mine.iter().zip(&theirs) {
        assert!(same(a, b), "{name} differs from transformers' quantization");
    }
    // The pre-quantized checkpoint loads as it is, and runs as transformers' model (in training
    // mode there: the dequantizing path).
    let r: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join("lora/run.safetensors"))?
        .into_iter()
        .collect();
    for model in [ours, load("prequantized", None)?] {
        let logits = tch::no_grad(|| {
            model.forward(&ModelInputs {
                input_ids: r.get("input_ids"),
                attention_mask: r.get("attention_mask"),
                ..Default::default()
            })
        })?
        .logits
        .context("logits")?;
        assert_eq!(max_abs(&logits, &r["base.logits"]), 0.0, "logits");
    }
    // Saved as transformers saves a 4-bit model: the same tensors and quantization_config.
    let model = load("prequantized", None)?;
    let saved = tchtrain_testing::temp_dir("bnb-4bit-save");
    model.save_pretrained(&saved)?;
    let mine = sorted(tchtrain_models::read_checkpoint(&saved)?);
    assert_eq!(mine.len(), theirs.len());
    for ((name, a), (_, b)) in mine.iter().zip(&theirs) {
        assert!(same(a, b), "saved {name} differs");
    }
    let config = |p: &std::path::Path| -> Result<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p.join("config.json"))?)?;
        Ok(v["quantization_config"].clone())
    };
    assert_eq!(config(&saved)?, config(&dir.join("prequantized"))?);
    Ok(())
}

#[test]
fn lora_over_4bit_equals_peft() -> Result<()> {
    use tchtrain_models::{LoraConfig, get_peft_model};
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_4bit/lora");
    let config = LoraConfig::from_file(&dir.join("adapter/adapter_config.json"))?;
    tch::manual_seed(1);
    let drawn = get_peft_model(
        load("prequantized", None)?,
        LoraConfig {
            inference_mode: false,
            ..config
        },
    )?;
    let initial: HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("initial.safetensors"))?
            .into_iter()
            .collect();
    let ours: HashMap<String, Tensor> = drawn.adapter_state_dict("default")?.into_iter().collect();
    assert_eq!(ours.len(), initial.len());
    for (name, t) in &initial {
        assert!(ours[name].equal(t), "drawn {name} differs from peft's");
    }
    let mut model =
        PeftModel::from_pretrained(load("prequantized", None)?, &dir.join("adapter"), true)?;
    let r: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join("run.safetensors"))?
        .into_iter()
        .collect();
    // The adapter's 12 gradients (3 modules x 2 layers x A, B), every trained one compared.
    for (prefix, autocast) in [("", false), ("autocast.", true)] {
        let diffs =
            crate::decoder_families::run(&mut model, &r, prefix, autocast, "base_model.model.")?;
        assert_eq!(
            diffs, [0.0; 4],
            "{prefix}: logits, loss, aux_loss, gradients"
        );
    }
    Ok(())
}

/// QLoRA through the Trainer (`bitsandbytes_4bit.py`'s `trainer`): the tiny Llama loaded in 4
/// bits (nf4, double quantization), peft's LoRA drawn after the same seed, trained 20 steps
/// (batch 4, cosine schedule after 2 warm-up steps, weight decay 0.1, clipping, evaluation
/// every 10 steps) on the Hamlet blocks: every logged value equals peft + bitsandbytes +
/// upstream's Trainer's to the bit, `total_flos` (its 4-bit weights counted twice) included.
/// The run saves the adapter alone at step 10; a new 4-bit model resumed from it logs every
/// later step as the uninterrupted run; peft loads the saved adapter onto transformers' 4-bit
/// base and evaluates it to our last `eval_loss`.
#[test]
fn qlora_trains_as_peft_bitsandbytes_and_upstream() -> Result<()> {
    use tchtrain_models::{LoraConfig, get_peft_model};
    use tchtrain_trainer::{ResumeFrom, Trainer};
    use tchtrain_training_args::{
        IntervalStrategy, SaveStrategy, SchedulerType, TrainingArguments,
    };
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_4bit/trainer_qlora");
    let out = tchtrain_testing::temp_dir("qlora-trainer");
    let args = || -> Result<TrainingArguments> {
        let mut args = TrainingArguments {
            per_device_train_batch_size: 4,
            per_device_eval_batch_size: 4,
            max_steps: 20,
            learning_rate: 2e-3,
            lr_scheduler_type: SchedulerType::Cosine,
            warmup_steps: 2.0,
            weight_decay: 0.1,
            max_grad_norm: 1.0,
            eval_strategy: IntervalStrategy::Steps,
            eval_steps: Some(10.0),
            save_strategy: SaveStrategy::Steps,
            save_steps: 10.0,
            ..crate::parity::base_args(&out)
        };
        args.post_init()?;
        Ok(args)
    };
    let base = || -> Result<Box<dyn tchtrain_models::PreTrainedModel>> {
        Ok(from_pretrained_dir(
            &dir.join("initial"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions {
                quantization_config: Some(nf4()),
                ..LoadOptions::default()
            },
        )?
        .model)
    };
    // A purely quantized model does not train.
    let refused = Trainer::builder(base()?, args()?)
        .build()
        .err()
        .context("a purely quantized model was accepted for training")?;
    assert!(
        refused.to_string().contains("purely quantized"),
        "{refused}"
    );
    let config = LoraConfig::from_file(&dir.join("adapter_config/adapter_config.json"))?;
    let blocks = dir.join("blocks.json");
    let trainer_for = |args: TrainingArguments| -> Result<Trainer> {
        tch::manual_seed(1);
        let model = get_peft_model(
            base()?,
            LoraConfig {
                inference_mode: false,
                ..config.clone()
            },
        )?;
        Ok(Trainer::builder(Box::new(model), args)
            .train_dataset(crate::parity::lm_blocks(&blocks, "train")?)
            .eval_dataset(crate::parity::lm_blocks(&blocks, "eval")?)
            .build()?)
    };
    let mut trainer = trainer_for(args()?)?;
    let result = trainer.train(None)?;
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("log_history.json"))?)?;
    tchtrain_testing::assert_exact(
        "qlora",
        &tchtrain_testing::compare("qlora", &trainer.state.log_history, &expected)?,
    );
    assert_eq!(result.global_step, 20);
    let checkpoint = out.join("checkpoint-10");
    assert!(checkpoint.join("adapter_model.safetensors").is_file());
    assert!(!checkpoint.join("model.safetensors").exists());
    let adapter = trainer.save_model(Some(&out.join("adapter")))?;
    // Resumed from step 10: the later steps as the uninterrupted run's.
    let mut resumed = trainer_for(args()?)?;
    resumed.train(Some(ResumeFrom::Path(checkpoint)))?;
    let history = &resumed.state.log_history;
    let mut steps = expected.as_array().context("log_history")?.clone();
    steps.pop();
    tchtrain_testing::assert_exact(
        "qlora resumed",
        &tchtrain_testing::compare(
            "qlora resumed",
            &history[..history.len() - 1],
            &serde_json::Value::Array(steps),
        )?,
    );
    // peft loads our adapter onto transformers' 4-bit base.
    let last_eval = trainer
        .state
        .log_history
        .iter()
        .rev()
        .find_map(|e| e.get("eval_loss").and_then(|v| v.as_f64()))
        .context("eval_loss")?;
    let script = r#"
import json, sys, torch, transformers as tf, bitsandbytes as bnb
from peft import PeftModel
d, adapter = sys.argv[1], sys.argv[2]
q = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
base = tf.AutoModelForCausalLM.from_pretrained(d + "/initial", quantization_config=q)
for m in base.modules():
    if isinstance(m, bnb.nn.Linear4bit):
        m.support_avx512bf16_for_cpu = False
model = PeftModel.from_pretrained(base, adapter).eval()
rows = json.load(open(d + "/blocks.json"))["eval"]
losses = []
with torch.no_grad():
    for i in range(0, len(rows), 4):
        ids = torch.tensor(rows[i:i + 4])
        losses.append(model(input_ids=ids, labels=ids).loss)
print(repr(torch.stack(losses).mean().item()))
"#;
    let python = std::env::var("TCHTRAIN_VENV_PYTHON").context("TCHTRAIN_VENV_PYTHON")?;
    let output = std::process::Command::new(python)
        .args(["-c", script])
        .arg(&dir)
        .arg(&adapter)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let theirs: f64 = stdout
        .trim()
        .lines()
        .last()
        .context("no loss printed")?
        .parse()?;
    assert_eq!(theirs, last_eval, "peft's eval loss with our adapter");
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// peft's `prepare_model_for_kbit_training` on the 4-bit model: every base parameter frozen,
/// activation checkpointing on; the adapter over it then gives the loss and the adapter's
/// gradients of the plain 4-bit model bit for bit (in training mode: the recompute runs the
/// same dequantizing forward).
#[test]
fn prepare_model_for_kbit_training_checkpoints_the_4bit_model() -> Result<()> {
    use tchtrain_models::prepare_model_for_kbit_training;
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_4bit/lora");
    let r: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join("run.safetensors"))?
        .into_iter()
        .collect();
    let step = |prepare: bool| -> Result<(f64, Vec<(String, Tensor)>)> {
        let mut base = load("prequantized", None)?;
        if prepare {
            prepare_model_for_kbit_training(&mut *base, true)?;
            assert!(base.parameters().is_empty(), "every base parameter frozen");
            assert!(base.is_activation_checkpointing());
        }
        let mut model = PeftModel::from_pretrained(base, &dir.join("adapter"), true)?;
        model.train();
        let out = model.forward(&ModelInputs {
            input_ids: r.get("input_ids"),
            attention_mask: r.get("attention_mask"),
            labels: r.get("labels"),
            ..Default::default()
        })?;
        let loss = out.loss.context("loss")?;
        loss.backward();
        let mut grads: Vec<(String, Tensor)> = model
            .var_store()
            .variables()
            .into_iter()
            .filter(|(_, v)| v.requires_grad())
            .map(|(n, v)| (n, v.grad().copy()))
            .collect();
        grads.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((loss.double_value(&[]), grads))
    };
    let (plain_loss, plain) = step(false)?;
    let (loss, grads) = step(true)?;
    assert_eq!(loss.to_bits(), plain_loss.to_bits(), "loss");
    assert_eq!(grads.len(), 12, "the adapter alone trains");
    for ((name, a), (_, b)) in grads.iter().zip(&plain) {
        assert!(same(a, b), "{name}: checkpointed gradient differs");
    }
    Ok(())
}

/// The newer families loaded in 4 bits (`bitsandbytes_4bit.py`'s `families`): the layers
/// quantized (routers and shared-expert gates, Gated DeltaNet's projections, Gemma 4's
/// per-layer projection...) and their codes equal transformers' — our `save_pretrained` writes
/// the checkpoint transformers wrote, key for key and byte for byte — and that checkpoint
/// loads here.
#[test]
fn families_quantize_as_transformers() -> Result<()> {
    let _g = lock();
    let root = assets().join("reference/bitsandbytes_4bit/families");
    for case in [
        "qwen3_moe",
        "qwen2_moe",
        "gpt_oss",
        "qwen3_5_text",
        "gemma4_text",
        "gemma4_text_moe",
    ] {
        let dir = root.join(case);
        let model = from_pretrained_dir(
            &dir.join("base"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions {
                quantization_config: Some(nf4()),
                ..LoadOptions::default()
            },
        )?
        .model;
        let saved = tchtrain_testing::temp_dir(&format!("bnb-family-{case}"));
        model.save_pretrained(&saved)?;
        let mine = sorted(tchtrain_models::read_checkpoint(&saved)?);
        let theirs = sorted(tchtrain_models::read_checkpoint(&dir.join("prequantized"))?);
        assert_eq!(
            mine.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            theirs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            "{case}: the saved keys"
        );
        for ((name, a), (_, b)) in mine.iter().zip(&theirs) {
            assert!(same(a, b), "{case}: {name} differs");
        }
        let loaded = from_pretrained_dir(
            &dir.join("prequantized"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
        assert!(is_quantized(&*loaded.model), "{case}");
    }
    Ok(())
}

// --- 8 bits (LLM.int8) and merges ---

fn reference8(name: &str) -> Result<HashMap<String, Tensor>> {
    reference_in("bitsandbytes_8bit", name)
}

fn load8(
    dir: &str,
    quantization_config: Option<BitsAndBytesConfig>,
) -> Result<Box<dyn tchtrain_models::PreTrainedModel>> {
    load_in("bitsandbytes_8bit", dir, quantization_config)
}

/// `int8_vectorwise_quant` as `Int8Params` quantizes a weight and as LLM.int8 quantizes
/// activations (outlier columns held out and zeroed over several rows, kept for one row),
/// `int8_vectorwise_dequant`: bit-identical.
#[test]
fn int8_quantization_equals_bitsandbytes() -> Result<()> {
    use tchtrain_models::{int8_vectorwise_dequant, int8_vectorwise_quant};
    let _g = lock();
    let r = reference8("functional.safetensors")?;
    let (cb, scb, cols) = int8_vectorwise_quant(&r["w"].to_kind(Kind::Half), 0.0)?;
    assert!(cols.is_none());
    assert!(same(&cb, &r["w.cb"]), "weight codes");
    assert!(same(&scb, &r["w.scb"]), "weight scales");
    assert!(
        same(&int8_vectorwise_dequant(&cb, &scb)?, &r["w.deq"]),
        "dequantized"
    );
    for (key, a, threshold) in [
        ("a.6", r["a"].shallow_clone(), 6.0),
        ("a.0", r["a"].shallow_clone(), 0.0),
        ("a1.6", r["a"].narrow(0, 3, 1), 6.0),
    ] {
        let (cb, scb, cols) = int8_vectorwise_quant(&a.to_kind(Kind::Half), threshold)?;
        assert!(same(&cb, &r[&format!("{key}.cb")]), "{key}: codes");
        assert!(same(&scb, &r[&format!("{key}.scb")]), "{key}: scales");
        match r.get(&format!("{key}.cols")) {
            Some(expected) => assert!(same(&cols.context("outlier columns")?, expected), "{key}"),
            None => assert!(cols.is_none(), "{key}: no outliers without a threshold"),
        }
    }
    Ok(())
}

/// `Linear8bitLt` (threshold 6, two outliers in the input): in training mode
/// (`MatMul8bitFp`) and in evaluation (`MatMul8bitLt`: the int8 product, the outlier columns in
/// float32), plain and under bfloat16 autocast — output, input and bias gradients to the bit.
/// Under autocast the int8 product itself depends on the machine as in bitsandbytes (exact
/// with AVX-512, a bfloat16 product elsewhere): the reference is made on the same machine.
#[test]
fn linear_8bit_forward_and_backward_equal_bitsandbytes() -> Result<()> {
    let _g = lock();
    let r = reference8("linear.safetensors")?;
    let (cb, scb, _) =
        tchtrain_models::int8_vectorwise_quant(&r["weight"].to_kind(Kind::Half), 0.0)?;
    assert!(same(&cb, &r["cb"]) && same(&scb, &r["scb"]), "Int8Params");
    for (prefix, training, autocast) in [
        ("train.", true, false),
        ("train_autocast.", true, true),
        ("eval.", false, false),
        ("eval_autocast.", false, true),
    ] {
        let layer = tchtrain_models::Linear8bitLt {
            weight: cb.shallow_clone(),
            scb: scb.shallow_clone(),
            threshold: 6.0,
        };
        let bias = r["bias"].copy().set_requires_grad(true);
        let x = r["x"].copy().set_requires_grad(true);
        let _guard = autocast
            .then(|| AutocastGuard::enter(Device::Cpu, Kind::BFloat16))
            .transpose()?;
        let y = layer.forward(&x, Some(&bias), training)?;
        drop(_guard);
        (&y * r["g"].to_kind(y.kind())).sum(y.kind()).backward();
        assert!(
            same(&y.detach(), &r[&format!("{prefix}y")]),
            "{prefix}: output differs by {}",
            max_abs(&y, &r[&format!("{prefix}y")])
        );
        assert!(
            same(&x.grad(), &r[&format!("{prefix}x_grad")]),
            "{prefix}: input gradient"
        );
        assert_eq!(
            max_abs(&bias.grad(), &r[&format!("{prefix}bias_grad")]),
            0.0,
            "{prefix}: bias gradient"
        );
    }
    Ok(())
}

/// The tiny Llama loaded with `BitsAndBytesConfig(load_in_8bit=True)` equals transformers'
/// 8-bit checkpoint (int8 `weight`, `SCB`, `weight_format`) tensor for tensor; that checkpoint
/// loads here and runs as transformers' model in training mode and in evaluation (LLM.int8);
/// saved, it is the same checkpoint with the same `quantization_config`.
#[test]
fn a_model_loaded_in_8bit_equals_transformers_checkpoint_both_ways() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_8bit");
    let ours = load8("base", Some(BitsAndBytesConfig::int8()))?;
    assert!(is_quantized(&*ours));
    let theirs = sorted(tchtrain_models::read_checkpoint(&dir.join("prequantized"))?);
    let mine = sorted(ours.var_store().variables().into_iter().collect());
    assert_eq!(
        mine.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        theirs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        "the 8-bit state's keys"
    );
    for ((name, a), (_, b)) in mine.iter().zip(&theirs) {
        assert!(same(a, b), "{name} differs from transformers' quantization");
    }
    let r = reference8("lora/run.safetensors")?;
    for mut model in [ours, load8("prequantized", None)?] {
        for (training, key) in [(true, "base.logits"), (false, "base.eval.logits")] {
            if training {
                model.train();
            } else {
                model.eval();
            }
            let logits = tch::no_grad(|| {
                model.forward(&ModelInputs {
                    input_ids: r.get("input_ids"),
                    attention_mask: r.get("attention_mask"),
                    ..Default::default()
                })
            })?
            .logits
            .context("logits")?;
            assert_eq!(max_abs(&logits, &r[key]), 0.0, "{key}");
        }
    }
    let model = load8("prequantized", None)?;
    let saved = tchtrain_testing::temp_dir("bnb-8bit-save");
    model.save_pretrained(&saved)?;
    let mine = sorted(tchtrain_models::read_checkpoint(&saved)?);
    assert_eq!(mine.len(), theirs.len());
    for ((name, a), (_, b)) in mine.iter().zip(&theirs) {
        assert!(same(a, b), "saved {name} differs");
    }
    let config = |p: &std::path::Path| -> Result<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p.join("config.json"))?)?;
        Ok(v["quantization_config"].clone())
    };
    assert_eq!(config(&saved)?, config(&dir.join("prequantized"))?);
    let _ = std::fs::remove_dir_all(&saved);
    Ok(())
}

/// peft's LoRA over the 8-bit model: drawn as peft draws it; loss, logits and the adapter's
/// gradients in training mode, float32 and bfloat16 autocast, and the logits in evaluation
/// (LLM.int8), to the bit; `merge_and_unload` dequantizes, adds the delta and quantizes again
/// as peft: the merged int8 rows and scales and the merged model's logits equal peft's.
#[test]
fn lora_over_8bit_equals_peft_and_merges_as_peft() -> Result<()> {
    use tchtrain_models::{LoraConfig, get_peft_model};
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_8bit/lora");
    let config = LoraConfig::from_file(&dir.join("adapter/adapter_config.json"))?;
    tch::manual_seed(1);
    let drawn = get_peft_model(
        load8("prequantized", None)?,
        LoraConfig {
            inference_mode: false,
            ..config
        },
    )?;
    let initial = reference8("lora/initial.safetensors")?;
    let ours: HashMap<String, Tensor> = drawn.adapter_state_dict("default")?.into_iter().collect();
    assert_eq!(ours.len(), initial.len());
    for (name, t) in &initial {
        assert!(ours[name].equal(t), "drawn {name} differs from peft's");
    }
    let mut model =
        PeftModel::from_pretrained(load8("prequantized", None)?, &dir.join("adapter"), true)?;
    let r = reference8("lora/run.safetensors")?;
    for (prefix, autocast) in [("", false), ("autocast.", true)] {
        let diffs = crate::decoder_families::run_in_mode(
            &mut model,
            &r,
            prefix,
            autocast,
            "base_model.model.",
            true,
        )?;
        assert_eq!(
            diffs, [0.0; 4],
            "{prefix}: logits, loss, aux_loss, gradients"
        );
    }
    let eval_logits = |m: &mut dyn TrainableModel| -> Result<Tensor> {
        m.eval();
        tch::no_grad(|| {
            m.forward(&ModelInputs {
                input_ids: r.get("input_ids"),
                attention_mask: r.get("attention_mask"),
                ..Default::default()
            })
        })?
        .logits
        .context("logits")
    };
    assert_eq!(max_abs(&eval_logits(&mut model)?, &r["eval.logits"]), 0.0);
    let mut merged = model.merge_and_unload()?;
    let vars = merged.var_store().variables();
    let mut n = 0;
    for (key, expected) in r.iter().filter(|(k, _)| k.starts_with("merged.model.")) {
        let name = &key["merged.".len()..];
        assert!(same(&vars[name], expected), "merged {name}");
        n += 1;
    }
    assert_eq!(n, 12, "6 merged layers' int8 rows and scales");
    assert_eq!(
        max_abs(&eval_logits(&mut *merged)?, &r["merged.eval.logits"]),
        0.0,
        "the merged model's logits"
    );
    Ok(())
}

/// peft's `merge_and_unload` over 4-bit layers: the dequantized weight plus the delta,
/// quantized again with the layer's own type and double quantization: the packed codes and
/// every state tensor equal peft's.
#[test]
fn lora_merges_into_4bit_as_peft() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_8bit/merge4");
    let base = load8("base", Some(nf4()))?;
    let model = PeftModel::from_pretrained(base, &dir.join("adapter"), true)?;
    let merged = model.merge_and_unload()?;
    let vars = merged.var_store().variables();
    let expected = reference8("merge4/merged.safetensors")?;
    assert!(!expected.is_empty());
    for (name, t) in &expected {
        let ours = vars
            .get(name)
            .with_context(|| format!("no variable {name} after the merge"))?;
        assert!(same(ours, t), "merged {name}");
    }
    Ok(())
}

/// DoRA over the 4-bit model (QDoRA): the magnitude drawn from the dequantized weight as
/// peft's; loss, logits and every gradient (magnitude included) in training mode, float32 and
/// bfloat16 autocast, to the bit; `merge_and_unload` rescales the dequantized weight plus the
/// delta to the magnitude and quantizes it again: the packed codes and states equal peft's.
#[test]
fn dora_over_4bit_equals_peft_and_merges_as_peft() -> Result<()> {
    use tchtrain_models::{LoraConfig, get_peft_model};
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_8bit/dora4");
    let config = LoraConfig::from_file(&dir.join("adapter/adapter_config.json"))?;
    assert!(config.use_dora);
    tch::manual_seed(1);
    let drawn = get_peft_model(
        load8("base", Some(nf4()))?,
        LoraConfig {
            inference_mode: false,
            ..config
        },
    )?;
    let initial = reference8("dora4/initial.safetensors")?;
    let ours: HashMap<String, Tensor> = drawn.adapter_state_dict("default")?.into_iter().collect();
    assert_eq!(ours.len(), initial.len());
    for (name, t) in &initial {
        assert!(ours[name].equal(t), "drawn {name} differs from peft's");
    }
    let mut model =
        PeftModel::from_pretrained(load8("base", Some(nf4()))?, &dir.join("adapter"), true)?;
    let r = reference8("dora4/run.safetensors")?;
    for (prefix, autocast) in [("", false), ("autocast.", true)] {
        let diffs = crate::decoder_families::run_in_mode(
            &mut model,
            &r,
            prefix,
            autocast,
            "base_model.model.",
            true,
        )?;
        assert_eq!(
            diffs, [0.0; 4],
            "{prefix}: logits, loss, aux_loss, gradients"
        );
    }
    let merged = model.merge_and_unload()?;
    let vars = merged.var_store().variables();
    let mut n = 0;
    for (key, expected) in r.iter().filter(|(k, _)| k.starts_with("merged.model.")) {
        let name = &key["merged.".len()..];
        let ours = vars
            .get(name)
            .with_context(|| format!("no variable {name} after the merge"))?;
        assert!(same(ours, expected), "merged {name}");
        n += 1;
    }
    assert!(
        n >= 6 * 5,
        "every merged layer's packed weight and state ({n})"
    );
    Ok(())
}

/// LoRA over the 8-bit base through the Trainer (`bitsandbytes_8bit.py`'s `trainer`): 20
/// steps (training through `MatMul8bitFp`, evaluation through LLM.int8's int8 product) log
/// every value as peft + bitsandbytes + upstream's Trainer, `total_flos` included.
#[test]
fn qlora_8bit_trains_as_peft_bitsandbytes_and_upstream() -> Result<()> {
    use tchtrain_models::{LoraConfig, get_peft_model};
    use tchtrain_trainer::Trainer;
    use tchtrain_training_args::{IntervalStrategy, SchedulerType, TrainingArguments};
    let _g = lock();
    let dir = assets().join("reference/bitsandbytes_8bit/trainer_qlora8");
    let out = tchtrain_testing::temp_dir("qlora8-trainer");
    let mut args = TrainingArguments {
        per_device_train_batch_size: 4,
        per_device_eval_batch_size: 4,
        max_steps: 20,
        learning_rate: 2e-3,
        lr_scheduler_type: SchedulerType::Cosine,
        warmup_steps: 2.0,
        weight_decay: 0.1,
        max_grad_norm: 1.0,
        eval_strategy: IntervalStrategy::Steps,
        eval_steps: Some(10.0),
        ..crate::parity::base_args(&out)
    };
    args.post_init()?;
    let config = LoraConfig::from_file(&dir.join("adapter_config/adapter_config.json"))?;
    let base = || -> Result<Box<dyn tchtrain_models::PreTrainedModel>> {
        Ok(from_pretrained_dir(
            &dir.join("initial"),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions {
                quantization_config: Some(BitsAndBytesConfig::int8()),
                ..LoadOptions::default()
            },
        )?
        .model)
    };
    // DoRA over 8-bit layers has no reference (peft fails on it on the CPU): refused.
    let dora = get_peft_model(
        base()?,
        LoraConfig {
            use_dora: true,
            inference_mode: false,
            ..config.clone()
        },
    )
    .err()
    .context("DoRA over 8-bit layers was accepted")?;
    assert!(dora.to_string().contains("use_dora"), "{dora}");
    tch::manual_seed(1);
    let model = get_peft_model(
        base()?,
        LoraConfig {
            inference_mode: false,
            ..config
        },
    )?;
    let blocks = dir.join("blocks.json");
    let mut trainer = Trainer::builder(Box::new(model), args)
        .train_dataset(crate::parity::lm_blocks(&blocks, "train")?)
        .eval_dataset(crate::parity::lm_blocks(&blocks, "eval")?)
        .build()?;
    trainer.train(None)?;
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("log_history.json"))?)?;
    tchtrain_testing::assert_exact(
        "qlora 8-bit",
        &tchtrain_testing::compare("qlora 8-bit", &trainer.state.log_history, &expected)?,
    );
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}
