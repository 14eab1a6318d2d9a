//! LoRA against peft 0.21.2 (`scripts/reference/peft_lora.py`): on a tiny Llama
//! (`all-linear`, dropout), a tiny Qwen2 (peft's default targets, rsLoRA, gaussian init, an
//! adapter made in Python), a tiny GPT-2 (`Conv1D`, `fan_in_fan_out`, rank / alpha patterns)
//! and a tiny BERT classifier (SEQ_CLS with its `modules_to_save` classifier,
//! `layers_to_transform`, `bias="lora_only"`):
//!
//! - `get_peft_model` after `manual_seed(0)` draws every adapter tensor as peft does;
//! - peft's saved adapter loads here, and the logits (eval), the training logits and loss
//!   with LoRA dropout drawn after `manual_seed(1)`, and every gradient equal peft's; the
//!   trainable parameters come in peft's `parameters()` order;
//! - our `save_pretrained` writes peft's keys and values and an `adapter_config.json` peft
//!   reads (checked by loading it in Python with warnings as errors: peft only warns on
//!   missing adapter keys), giving the same logits there;
//! - `merge_and_unload` gives peft's merged logits;
//! - and DoRA on the tiny Llama (magnitudes, the forward with and without dropout, the
//!   merge) as peft's.
//!
//! Tolerance: 0 (the same libtorch ops in the same order).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tch::{Device, Tensor};
use tchtrain_models::{
    ActivationCheckpointing, AutoTask, LoadOptions, LoraConfig, ModelInputs, PeftModel,
    PreTrainedModel, TargetModules, TrainableModel, from_pretrained_dir, get_peft_model,
};
use tchtrain_testing::{assets, lock, temp_dir};

fn reference(case: &str) -> Result<HashMap<String, Tensor>> {
    let path = assets().join(format!("reference/peft_lora/{case}.safetensors"));
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    Ok(Tensor::read_safetensors(&path)?.into_iter().collect())
}

fn base(dir: &Path, task: AutoTask) -> Result<Box<dyn PreTrainedModel>> {
    Ok(from_pretrained_dir(dir, task, Device::Cpu, &LoadOptions::default())?.model)
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape");
    (a - b).abs().max().double_value(&[])
}

struct Case {
    name: &'static str,
    base: PathBuf,
    task: AutoTask,
    config: LoraConfig,
}

fn cases() -> Vec<Case> {
    let names = |v: &[&str]| {
        Some(TargetModules::Names(
            v.iter().map(|s| s.to_string()).collect(),
        ))
    };
    vec![
        Case {
            name: "llama_all_linear",
            base: assets().join("tiny-llama"),
            task: AutoTask::CausalLm,
            config: LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                lora_dropout: 0.1,
                target_modules: Some(TargetModules::Regex("all-linear".into())),
                task_type: Some("CAUSAL_LM".into()),
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                ..Default::default()
            },
        },
        Case {
            name: "qwen2_default",
            base: assets().join("reference/peft_lora/qwen2_base"),
            task: AutoTask::CausalLm,
            config: LoraConfig {
                r: 8,
                lora_alpha: 16.0,
                use_rslora: true,
                init_lora_weights: tchtrain_models::InitLoraWeights::Gaussian,
                task_type: Some("CAUSAL_LM".into()),
                ..Default::default()
            },
        },
        Case {
            name: "gpt2_conv1d",
            base: assets().join("tiny-gpt2"),
            task: AutoTask::CausalLm,
            config: LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                target_modules: names(&["c_attn", "mlp.c_proj"]),
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                rank_pattern: [("h.0.attn.c_attn".to_string(), 2)].into(),
                alpha_pattern: [("mlp.c_proj".to_string(), 4.0)].into(),
                ..Default::default()
            },
        },
        Case {
            name: "llama_dora",
            base: assets().join("tiny-llama"),
            task: AutoTask::CausalLm,
            config: LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                lora_dropout: 0.1,
                target_modules: names(&["q_proj", "v_proj", "down_proj"]),
                use_dora: true,
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                task_type: Some("CAUSAL_LM".into()),
                ..Default::default()
            },
        },
        Case {
            name: "deberta_default",
            base: assets().join("reference/peft_lora/deberta_base"),
            task: AutoTask::MaskedLm,
            config: LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                ..Default::default()
            },
        },
        Case {
            name: "bert_seqcls",
            base: assets().join("reference/peft_lora/bert_seqcls_base"),
            task: AutoTask::SequenceClassification { num_labels: None },
            config: LoraConfig {
                r: 4,
                lora_alpha: 4.0,
                target_modules: names(&["query", "value"]),
                layers_to_transform: Some(tchtrain_models::LayerIndices::Many(vec![1])),
                bias: tchtrain_models::LoraBias::LoraOnly,
                task_type: Some("SEQ_CLS".into()),
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                ..Default::default()
            },
        },
        Case {
            name: "llama_embed",
            base: assets().join("tiny-llama"),
            task: AutoTask::CausalLm,
            config: LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                lora_dropout: 0.1,
                target_modules: names(&["embed_tokens", "q_proj"]),
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                task_type: Some("CAUSAL_LM".into()),
                ..Default::default()
            },
        },
        Case {
            name: "bert_embed_dora",
            base: assets().join("reference/peft_lora/bert_mlm_base"),
            task: AutoTask::MaskedLm,
            config: LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                target_modules: names(&["word_embeddings", "query"]),
                use_dora: true,
                init_lora_weights: tchtrain_models::InitLoraWeights::Random,
                ..Default::default()
            },
        },
    ]
}

fn logits(model: &dyn TrainableModel, r: &HashMap<String, Tensor>) -> Result<Tensor> {
    let inputs = ModelInputs {
        input_ids: Some(&r["input_ids"]),
        attention_mask: Some(&r["attention_mask"]),
        ..Default::default()
    };
    tch::no_grad(|| model.forward(&inputs))?
        .logits
        .context("logits")
}

#[test]
fn lora_equals_peft() -> Result<()> {
    let _g = lock();
    let python = std::env::var("TCHTRAIN_VENV_PYTHON")
        .context("TCHTRAIN_VENV_PYTHON is not set: run `cargo xtask setup`")?;
    // Every saved adapter is loaded by one Python process (its imports take ~15 s).
    let mut script = String::from(
        "import warnings, torch, transformers as tf\n\
         from safetensors.torch import load_file, save_file\n\
         from peft import PeftModel\n\
         warnings.simplefilter('error', UserWarning)\n\
         warnings.filterwarnings('ignore', 'Model has `tie_word_embeddings=True`', UserWarning)\n",
    );
    let mut saved = Vec::new();
    for case in cases() {
        let name = case.name;
        let r = reference(name)?;
        let adapter_dir = assets().join(format!("reference/peft_lora/{name}"));
        // The draws of get_peft_model.
        tch::manual_seed(0);
        let fresh = get_peft_model(base(&case.base, case.task)?, case.config.clone())?;
        let state: HashMap<String, Tensor> =
            fresh.adapter_state_dict("default")?.into_iter().collect();
        let mut n = 0;
        for (key, want) in r.iter().filter(|(k, _)| k.starts_with("init.")) {
            let key = &key["init.".len()..];
            let got = state
                .get(key)
                .with_context(|| format!("{name}: no {key}"))?;
            assert!(got.equal(want), "{name}: {key} drawn differently from peft");
            n += 1;
        }
        // Besides the adapter, the base weight of an embedding named in target_modules
        // (peft's save_embedding_layers="auto").
        let trained = state
            .keys()
            .filter(|k| !k.ends_with(".base_layer.weight"))
            .count();
        assert_eq!(n, trained, "{name}: adapter tensors");
        drop(fresh);

        // peft's adapter loaded here.
        let mut model =
            PeftModel::from_pretrained(base(&case.base, case.task)?, &adapter_dir, true)?;
        model.eval();
        let d = max_abs(&logits(&model, &r)?, &r["logits"]);
        assert!(d == 0.0, "{name}: eval logits differ by {d}");
        model.train();
        tch::manual_seed(1);
        let out = model.forward(&ModelInputs {
            input_ids: Some(&r["input_ids"]),
            attention_mask: Some(&r["attention_mask"]),
            labels: Some(&r["labels"]),
            ..Default::default()
        })?;
        let loss = out.loss.context("loss")?;
        // GPT-2's attention dropout in training differs from upstream's in the last bits
        // without any adapter (positions past the first, up to 3.6e-7 on these logits): its
        // training values get that much room, relative to each tensor's largest value.
        let tol = if name == "gpt2_conv1d" { 1e-5 } else { 0.0 };
        let rel =
            |a: &Tensor, b: &Tensor| max_abs(a, b) / b.abs().max().double_value(&[]).max(1e-12);
        let d = rel(out.logits.as_ref().context("logits")?, &r["train_logits"]);
        assert!(d <= tol, "{name}: train logits differ by {d} (relative)");
        let d = rel(&loss.reshape([1]), &r["loss"]);
        assert!(d <= tol, "{name}: loss differs by {d} (relative)");
        loss.backward();
        // Trainable parameters in peft's order, with peft's gradients.
        let order: Vec<String> = serde_json::from_str(&std::fs::read_to_string(
            assets().join(format!("reference/peft_lora/{name}.parameters.json")),
        )?)?;
        let by_ptr: HashMap<usize, String> = model
            .adapter_state_dict("default")?
            .into_iter()
            .map(|(k, t)| (t.data_ptr() as usize, k))
            .collect();
        let ours: Vec<String> = model
            .parameters()
            .iter()
            .map(|t| {
                by_ptr
                    .get(&(t.data_ptr() as usize))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(ours, order, "{name}: parameter order");
        for (key, p) in ours.iter().zip(model.parameters()) {
            let d = rel(&p.grad(), &r[&format!("grad.{key}")]);
            assert!(
                d <= tol,
                "{name}: gradient of {key} differs by {d} (relative)"
            );
        }
        if name == "llama_all_linear" {
            // Activation checkpointing recomputes the layers with the adapters (and the
            // same LoRA dropout masks): the same loss and gradients.
            model.activation_checkpointing_enable(ActivationCheckpointing::default())?;
            for p in model.parameters() {
                let _ = p.grad().zero_();
            }
            tch::manual_seed(1);
            let out = model.forward(&ModelInputs {
                input_ids: Some(&r["input_ids"]),
                attention_mask: Some(&r["attention_mask"]),
                labels: Some(&r["labels"]),
                ..Default::default()
            })?;
            out.loss.context("loss")?.backward();
            for (key, p) in ours.iter().zip(model.parameters()) {
                let d = max_abs(&p.grad(), &r[&format!("grad.{key}")]);
                assert!(
                    d == 0.0,
                    "{name}: checkpointed gradient of {key} differs by {d}"
                );
            }
            model.activation_checkpointing_disable();
        }
        model.eval();

        // Our save: peft's keys and values; peft loads it without a warning, same logits.
        let out_dir = temp_dir(&format!("lora-{name}"));
        model.save_pretrained(out_dir.path())?;
        let ours: HashMap<String, Tensor> =
            Tensor::read_safetensors(out_dir.path().join("adapter_model.safetensors"))?
                .into_iter()
                .collect();
        let theirs: HashMap<String, Tensor> =
            Tensor::read_safetensors(adapter_dir.join("adapter_model.safetensors"))?
                .into_iter()
                .collect();
        let mut keys: Vec<&String> = ours.keys().collect();
        keys.sort();
        let mut want: Vec<&String> = theirs.keys().collect();
        want.sort();
        assert_eq!(keys, want, "{name}: saved keys");
        for k in keys {
            assert!(ours[k].equal(&theirs[k]), "{name}: saved {k}");
        }
        let py_out = out_dir.path().join("python_logits.safetensors");
        let task_class = match case.task {
            AutoTask::CausalLm => "AutoModelForCausalLM",
            AutoTask::MaskedLm => "AutoModelForMaskedLM",
            _ => "AutoModelForSequenceClassification",
        };
        script.push_str(&format!(
            "print({name:?})\n\
             base = tf.{task_class}.from_pretrained({base:?})\n\
             m = PeftModel.from_pretrained(base, {adapter:?}).eval()\n\
             r = load_file({reference:?})\n\
             with torch.no_grad():\n    l = m(input_ids=r['input_ids'], attention_mask=r['attention_mask']).logits\n\
             save_file({{'logits': l.contiguous()}}, {out:?})\n",
            base = case.base.to_str().unwrap(),
            adapter = out_dir.path().to_str().unwrap(),
            reference = assets()
                .join(format!("reference/peft_lora/{name}.safetensors"))
                .to_str()
                .unwrap(),
            out = py_out.to_str().unwrap(),
        ));
        saved.push((name, py_out, r["logits"].shallow_clone(), out_dir));

        // merge_and_unload.
        let merged = model.merge_and_unload()?;
        assert!(
            !merged
                .var_store()
                .variables()
                .keys()
                .any(|k| k.contains("lora_")),
            "{name}: adapters left after merge_and_unload"
        );
        let d = max_abs(&logits(&*merged, &r)?, &r["merged_logits"]);
        assert!(d == 0.0, "{name}: merged logits differ by {d}");
        eprintln!("{name}: draws, logits, loss, gradients, saved adapter and merge equal peft's");
    }
    let status = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .status()?;
    assert!(
        status.success(),
        "peft could not load one of our adapters cleanly (the last name printed)"
    );
    for (name, py_out, reference_logits, _dir) in saved {
        let py: HashMap<String, Tensor> = Tensor::read_safetensors(&py_out)?.into_iter().collect();
        // Python against its own reference run, in another process: GPT-2's Conv1D
        // (`addmm`) rounds by its operands' memory addresses in MKL, seen once at 1.9e-6
        // (the bound, 1e-5, for it; the others to the bit).
        let d = max_abs(&py["logits"], &reference_logits);
        let tol = if name == "gpt2_conv1d" { 1e-5 } else { 0.0 };
        assert!(
            d <= tol,
            "{name}: peft's logits with our adapter differ by {d}"
        );
    }
    Ok(())
}

#[test]
fn bad_adapters_are_typed_errors() -> Result<()> {
    let _g = lock();
    let llama = assets().join("tiny-llama");
    // A target that matches nothing, and an embedding target.
    for (targets, want) in [
        (vec!["nothing_here"], "matched no linear layer"),
        (vec!["norm"], "neither a linear layer"),
        // A container of layers next to a valid name: peft's "not supported".
        (vec!["q_proj", "mlp"], "container of layers"),
    ] {
        let err = get_peft_model(
            base(&llama, AutoTask::CausalLm)?,
            LoraConfig {
                target_modules: Some(TargetModules::Names(
                    targets.iter().map(|s| s.to_string()).collect(),
                )),
                ..Default::default()
            },
        )
        .expect_err("refused");
        assert!(err.to_string().contains(want), "{err}");
    }
    // A modules_to_save entry naming an adapted layer (peft's suffix match: "proj" ends
    // q_proj), refused as peft's TypeError.
    let err = get_peft_model(
        base(&llama, AutoTask::CausalLm)?,
        LoraConfig {
            target_modules: Some(TargetModules::Names(vec!["q_proj".into()])),
            modules_to_save: Some(vec!["proj".into()]),
            ..Default::default()
        },
    )
    .expect_err("refused");
    assert!(err.to_string().contains("also adapted"), "{err}");
    // LoRA on an embedding other than the input embeddings.
    let err = get_peft_model(
        base(&assets().join("tiny-gpt2"), AutoTask::CausalLm)?,
        LoraConfig {
            target_modules: Some(TargetModules::Names(vec!["wpe".into()])),
            ..Default::default()
        },
    )
    .expect_err("refused");
    assert!(
        err.to_string().contains("other than the input embeddings"),
        "{err}"
    );
    // fan_in_fan_out on nn.Linear layers is set back to false, as peft does.
    let model = get_peft_model(
        base(&llama, AutoTask::CausalLm)?,
        LoraConfig {
            fan_in_fan_out: true,
            ..Default::default()
        },
    )?;
    assert!(!model.peft_config().fan_in_fan_out);
    // peft has no default targets for ModernBERT.
    let err = get_peft_model(
        base(
            &assets().join("reference/models/tiny_modernbert_mlm"),
            AutoTask::MaskedLm,
        )?,
        LoraConfig::default(),
    )
    .expect_err("no default targets");
    assert!(
        err.to_string().contains("no default target modules"),
        "{err}"
    );
    // An adapter trained for another model: missing keys are an error (peft only warns).
    let err = PeftModel::from_pretrained(
        base(
            &assets().join("reference/models/tiny_mistral_lm"),
            AutoTask::CausalLm,
        )?,
        &assets().join("reference/peft_lora/llama_all_linear"),
        false,
    )
    .expect_err("another model's adapter");
    let msg = err.to_string();
    assert!(
        msg.contains("missing adapter keys") || msg.contains("shapes do not match"),
        "{msg}"
    );
    Ok(())
}

/// On a bfloat16 base (the tiny Qwen2 saved in bfloat16, loaded in its dtype) the adapters
/// are float32 holding bfloat16-rounded draws, as peft's `autocast_adapter_dtype`.
#[test]
fn adapters_on_a_bfloat16_base_are_float32() -> Result<()> {
    let _g = lock();
    let base = base(
        &assets().join("reference/models/tiny_qwen2_bf16"),
        AutoTask::CausalLm,
    )?;
    assert_eq!(base.var_store().kind(), tch::Kind::BFloat16);
    tch::manual_seed(0);
    let model = get_peft_model(
        base,
        LoraConfig {
            init_lora_weights: tchtrain_models::InitLoraWeights::Random,
            ..Default::default()
        },
    )?;
    let state = model.adapter_state_dict("default")?;
    assert!(!state.is_empty());
    for (key, t) in state {
        assert_eq!(t.kind(), tch::Kind::Float, "{key}");
        let rounded = t.to_kind(tch::Kind::BFloat16).to_kind(tch::Kind::Float);
        assert!(rounded.equal(&t), "{key}: not bfloat16-rounded");
    }
    Ok(())
}

/// Several adapters as peft holds them (`multi` of the reference): `add_adapter`'s draws,
/// `set_adapter`, training the active one (the others frozen, peft's parameter order and
/// gradients), `save_pretrained`'s layout (default at the root, `other/`), `merge_adapter`
/// of both and `unmerge_adapter` (peft's rounding), `delete_adapter`; the Trainer's resume
/// of the saved folder; and the refusals.
#[test]
fn several_adapters_equal_peft() -> Result<()> {
    let _g = lock();
    let r = reference("multi")?;
    let llama = assets().join("tiny-llama");
    let names = |v: &[&str]| {
        Some(TargetModules::Names(
            v.iter().map(|s| s.to_string()).collect(),
        ))
    };
    let default = LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        lora_dropout: 0.1,
        target_modules: names(&["q_proj", "v_proj"]),
        init_lora_weights: tchtrain_models::InitLoraWeights::Random,
        ..Default::default()
    };
    let other = LoraConfig {
        r: 2,
        lora_alpha: 2.0,
        target_modules: names(&["q_proj", "k_proj", "o_proj"]),
        init_lora_weights: tchtrain_models::InitLoraWeights::Random,
        ..Default::default()
    };
    tch::manual_seed(0);
    let mut model = get_peft_model(base(&llama, AutoTask::CausalLm)?, default.clone())?;
    // peft's saved default adapter (drawn the same way) in place of ours.
    model.load_adapter_weights(&assets().join("reference/peft_lora/multi"), "default")?;
    tch::manual_seed(2);
    model.add_adapter("other", other.clone())?;
    assert_eq!(model.adapter_names(), ["default", "other"]);
    assert_eq!(model.active_adapter(), "default");
    let vars = model.var_store().variables();
    let mut n = 0;
    for (key, want) in r.iter().filter(|(k, _)| k.starts_with("init.other.")) {
        let var = key["init.other.".len()..].replace("base_model.model.", "");
        let var = var.replace(".weight", ".other.weight");
        let got = vars.get(&var).with_context(|| format!("no {var}"))?;
        assert!(got.equal(want), "{var} drawn differently from peft");
        assert!(!got.requires_grad(), "{var}: a new adapter starts frozen");
        n += 1;
    }
    assert_eq!(n, 12);
    let eval_logits = |m: &mut PeftModel| -> Result<Tensor> {
        m.eval();
        logits(m, &r)
    };
    assert_eq!(
        max_abs(&eval_logits(&mut model)?, &r["default_logits"]),
        0.0
    );
    model.set_adapter("other")?;
    assert_eq!(max_abs(&eval_logits(&mut model)?, &r["other_logits"]), 0.0);
    model.train();
    tch::manual_seed(1);
    let out = model.forward(&ModelInputs {
        input_ids: Some(&r["input_ids"]),
        attention_mask: Some(&r["attention_mask"]),
        labels: Some(&r["labels"]),
        ..Default::default()
    })?;
    let loss = out.loss.context("loss")?;
    assert_eq!(max_abs(&loss.reshape([1]), &r["loss"]), 0.0);
    loss.backward();
    let order: Vec<String> = serde_json::from_str(&std::fs::read_to_string(
        assets().join("reference/peft_lora/multi.parameters.json"),
    )?)?;
    let by_ptr: HashMap<usize, String> = model
        .adapter_state_dict("other")?
        .into_iter()
        .map(|(k, t)| (t.data_ptr() as usize, k))
        .collect();
    let params = model.parameters();
    let ours: Vec<String> = params
        .iter()
        .map(|t| {
            by_ptr
                .get(&(t.data_ptr() as usize))
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(ours, order, "parameter order");
    for (key, p) in ours.iter().zip(&params) {
        assert_eq!(max_abs(&p.grad(), &r[&format!("grad.{key}")]), 0.0, "{key}");
    }
    for p in &params {
        let _ = p.grad().zero_();
    }

    // save_pretrained: peft's layout, keys and values.
    let out_dir = temp_dir("lora-multi");
    model.save_pretrained(out_dir.path())?;
    for sub in ["", "other"] {
        let read = |dir: &Path| -> Result<HashMap<String, Tensor>> {
            Ok(
                Tensor::read_safetensors(dir.join(sub).join("adapter_model.safetensors"))?
                    .into_iter()
                    .collect(),
            )
        };
        let ours = read(out_dir.path())?;
        let theirs = read(&assets().join("reference/peft_lora/multi"))?;
        let mut keys: Vec<&String> = ours.keys().collect();
        keys.sort();
        let mut want: Vec<&String> = theirs.keys().collect();
        want.sort();
        assert_eq!(keys, want, "saved keys of {sub:?}");
        for k in keys {
            assert!(ours[k].equal(&theirs[k]), "saved {sub:?} {k}");
        }
    }

    // merge both, unmerge (not bit-exact, as peft's), the layers run their base alone.
    model.merge_adapter(Some(&["default", "other"]))?;
    assert_eq!(max_abs(&eval_logits(&mut model)?, &r["merged_logits"]), 0.0);
    assert!(
        model.add_adapter("third", other.clone()).is_err(),
        "adding while merged"
    );
    model.unmerge_adapter()?;
    model.set_adapter("default")?;
    assert_eq!(
        max_abs(&eval_logits(&mut model)?, &r["unmerged_logits"]),
        0.0
    );
    let vars = model.var_store().variables();
    for (key, want) in r.iter().filter(|(k, _)| k.starts_with("unmerged.")) {
        let var = key["unmerged.".len()..]
            .replace("base_model.model.", "")
            .replace(".base_layer", "");
        assert!(vars[&var].equal(want), "{var} after unmerge_adapter");
    }

    // The Trainer's resume of the saved folder: both adapters' values back, "default"
    // active and trainable, "other" frozen.
    let saved_other = model.adapter_state_dict("other")?;
    tch::no_grad(|| {
        for (_, t) in model.var_store().variables() {
            if t.requires_grad() || t.size().len() == 2 && t.size()[1] <= 4 {
                let _ = t.shallow_clone().fill_(0.5);
            }
        }
    });
    TrainableModel::load_adapter(&mut model, out_dir.path())?;
    assert_eq!(model.active_adapter(), "default");
    for (key, want) in saved_other {
        let got: HashMap<String, Tensor> = model.adapter_state_dict("other")?.into_iter().collect();
        assert!(got[&key].equal(&want), "resumed {key}");
    }
    let trainable: Vec<String> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(trainable.len(), 8);
    assert!(
        trainable.iter().all(|n| n.contains(".default.")),
        "{trainable:?}"
    );

    // delete_adapter: "default" stays active.
    model.delete_adapter("other")?;
    assert_eq!(model.adapter_names(), ["default"]);
    assert!(
        !model
            .var_store()
            .variables()
            .keys()
            .any(|k| k.contains(".other"))
    );
    let err = model
        .delete_adapter("default")
        .expect_err("the last adapter");
    assert!(err.to_string().contains("only adapter"), "{err}");
    // A failed load of a new adapter keeps nothing of it (here: another model's adapter).
    let err = model
        .load_adapter(
            &assets().join("reference/peft_lora/gpt2_conv1d"),
            "gpt",
            false,
        )
        .expect_err("another model's adapter");
    assert!(!err.to_string().is_empty());
    assert_eq!(model.adapter_names(), ["default"]);
    assert!(
        !model
            .var_store()
            .variables()
            .keys()
            .any(|k| k.contains(".gpt"))
    );
    let err = model.add_adapter("v1.0", other.clone()).expect_err("a dot");
    assert!(err.to_string().contains("can't contain"), "{err}");
    // Refusals: a name held twice, modules_to_save beside another adapter.
    let err = model
        .add_adapter("default", other.clone())
        .expect_err("twice");
    assert!(err.to_string().contains("already exists"), "{err}");
    let err = model
        .add_adapter(
            "head",
            LoraConfig {
                modules_to_save: Some(vec!["model.norm".into()]),
                ..other.clone()
            },
        )
        .expect_err("modules_to_save");
    assert!(
        err.to_string().contains("copy of them per adapter"),
        "{err}"
    );
    assert_eq!(model.adapter_names(), ["default"]);
    let err = model.set_adapter("nope").expect_err("unknown");
    assert!(err.to_string().contains("no adapter named"), "{err}");
    Ok(())
}

/// An adapter folder given to `from_pretrained` loads its `base_model_name_or_path` with the
/// adapter on it (transformers' PEFT integration): peft's logits, frozen, in evaluation mode.
#[test]
fn an_adapter_folder_loads_through_the_auto_classes() -> Result<()> {
    let _g = lock();
    let r = reference("llama_all_linear")?;
    let model = from_pretrained_dir(
        &assets().join("reference/peft_lora/llama_all_linear"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    assert_eq!(model.model_name(), "PeftModel");
    assert!(!model.is_training());
    assert!(model.parameters().is_empty(), "frozen");
    assert_eq!(max_abs(&logits(&*model, &r)?, &r["logits"]), 0.0);
    Ok(())
}
