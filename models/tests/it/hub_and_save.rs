//! Resolution (local folder, HF cache layout, offline mode, download from a hub served on
//! 127.0.0.1), sharded checkpoints, `save_pretrained` read back by Rust and by Python's
//! transformers 5.23, and typed errors for broken folders.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use tchtrain_testing::{HubServer, assets, lock};

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};
use tchtrain_models::{
    AutoTask, GPT2LMHeadModel, HubOptions, LlamaForCausalLM, LoadOptions, ModelInputs,
    PreTrainedModel, TrainableModel, from_pretrained, from_pretrained_dir, read_checkpoint,
    resolve, write_safetensors,
};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tchtrain-models-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ids() -> Tensor {
    Tensor::from_slice(&[464i64, 2068, 7586, 21831, 18045, 625, 262, 16931]).reshape([1, 8])
}

fn logits(model: &dyn PreTrainedModel) -> Result<Tensor> {
    let ids = ids();
    tch::no_grad(|| model.forward(&ModelInputs::new(&ids)))?
        .logits
        .context("logits")
}

fn offline_options(cache: &Path) -> HubOptions {
    HubOptions {
        revision: "main".into(),
        cache_dir: cache.to_path_buf(),
        endpoint: "http://127.0.0.1:9".into(),
        offline: true,
        token: None,
        progress: false,
    }
}

/// Splits a checkpoint into two shards with upstream's index format.
fn write_sharded(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst)?;
    std::fs::copy(src.join("config.json"), dst.join("config.json"))?;
    let mut tensors = read_checkpoint(src)?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let half = tensors.len() / 2;
    let mut weight_map = BTreeMap::new();
    for (i, part) in [&tensors[..half], &tensors[half..]].iter().enumerate() {
        let name = format!("model-{:05}-of-00002.safetensors", i + 1);
        write_safetensors(part, &dst.join(&name))?;
        for (k, _) in part.iter() {
            weight_map.insert(k.clone(), name.clone());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        dst.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index)?,
    )?;
    Ok(())
}

#[test]
fn sharded_checkpoint_loads_like_the_single_file() -> Result<()> {
    let _g = lock();
    let single = GPT2LMHeadModel::from_pretrained_dir(
        &assets().join("tiny-gpt2"),
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    let dir = temp_dir("sharded");
    write_sharded(&assets().join("tiny-gpt2"), &dir)?;
    let sharded = GPT2LMHeadModel::from_pretrained_dir(&dir, Device::Cpu, &LoadOptions::default())?;
    assert!(sharded.info.is_clean(), "{}", sharded.info);
    assert_eq!(logits(&single.model)?, logits(&sharded.model)?);
    // A shard named by the index but absent: a typed error naming the file.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors"))?;
    let err = GPT2LMHeadModel::from_pretrained_dir(&dir, Device::Cpu, &LoadOptions::default())
        .unwrap_err();
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
    Ok(())
}

#[test]
fn hf_cache_layout_and_offline_mode() -> Result<()> {
    let _g = lock();
    let cache = temp_dir("cache");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.join("models--tchtrain--tiny-gpt2");
    std::fs::create_dir_all(repo.join("refs"))?;
    std::fs::write(repo.join("refs/main"), commit)?;
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap)?;
    for f in ["config.json", "model.safetensors"] {
        std::os::unix::fs::symlink(assets().join("tiny-gpt2").join(f), snap.join(f))?;
    }
    let opts = offline_options(&cache);
    assert_eq!(resolve("tchtrain/tiny-gpt2", &opts)?, snap);
    let err = resolve("tchtrain/not-there", &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("HF_HUB_OFFLINE"), "{err}");
    // A local folder wins over everything.
    assert_eq!(
        resolve(assets().join("tiny-gpt2").to_str().unwrap(), &opts)?,
        assets().join("tiny-gpt2")
    );
    Ok(())
}

#[test]
fn download_from_a_local_hub_into_the_cache() -> Result<()> {
    let _g = lock();
    let served = temp_dir("served");
    write_sharded(&assets().join("tiny-llama"), &served)?;
    let server = HubServer::builder()
        .model("tchtrain/tiny-llama", "main", served)
        .start();
    let cache = temp_dir("dlcache");
    let opts = HubOptions {
        offline: false,
        endpoint: server.endpoint().into(),
        ..offline_options(&cache)
    };
    let auto = from_pretrained(
        "tchtrain/tiny-llama",
        AutoTask::CausalLm,
        Device::Cpu,
        &opts,
        &LoadOptions::default(),
    )?;
    assert!(auto.info.is_clean(), "{}", auto.info);
    let direct = LlamaForCausalLM::from_pretrained_dir(
        &assets().join("tiny-llama"),
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert_eq!(logits(auto.model.as_ref())?, logits(&direct.model)?);
    let requests: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert!(
        requests
            .iter()
            .any(|r| r.ends_with("model.safetensors.index.json")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.ends_with("model-00002-of-00002.safetensors")),
        "{requests:?}"
    );
    // The download landed in the standard cache layout: offline resolution now finds it.
    let snapshot = resolve("tchtrain/tiny-llama", &offline_options(&cache))?;
    assert!(snapshot.starts_with(cache.join("models--tchtrain--tiny-llama/snapshots")));
    Ok(())
}

/// `save_pretrained` of every decoder family (Llama tied, Qwen2, Qwen3 tied, Mistral, Gemma
/// 1–3 tied, Phi-3, RoBERTa, XLM-RoBERTa and ModernBERT masked LMs, and Qwen2, Gemma 3, XLM-RoBERTa
/// and ModernBERT sequence classifiers; the mixtures of experts, Granite, SmolLM3, OLMo 2 / 3,
/// Gemma 3's and Qwen3.5's multimodal checkpoints, Qwen3.5 / Qwen3.5-MoE, a dequantised
/// MXFP4 gpt-oss): the folder reloads here with the same logits, and
/// transformers' Auto class loads it as the same class with the same logits (the same
/// kernels: 0 difference). Python's parameters are copied out of the memory-mapped file
/// first: libtorch's CPU matmul takes another path for weights at an unaligned address
/// (measured: 4.7e-9 on ModernBERT's head for a one-row input), and ours are allocated.
#[test]
fn save_pretrained_reloads_in_rust_and_python() -> Result<()> {
    let _g = lock();
    let reference = assets().join("reference/models");
    let seqcls = AutoTask::SequenceClassification { num_labels: None };
    let cases = [
        (
            assets().join("tiny-llama"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_qwen2_lm"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_qwen3_lm"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_mistral_lm"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_qwen2_seqcls"),
            seqcls,
            "AutoModelForSequenceClassification",
        ),
        (
            reference.join("tiny_gemma_lm"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_gemma2_lm"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_gemma3_lm"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_roberta_mlm"),
            AutoTask::MaskedLm,
            "AutoModelForMaskedLM",
        ),
        (
            reference.join("tiny_xlmr_mlm"),
            AutoTask::MaskedLm,
            "AutoModelForMaskedLM",
        ),
        (
            reference.join("tiny_xlmr_seqcls"),
            seqcls,
            "AutoModelForSequenceClassification",
        ),
        (
            reference.join("tiny_modernbert_mlm"),
            AutoTask::MaskedLm,
            "AutoModelForMaskedLM",
        ),
        (
            reference.join("tiny_modernbert_biased_seqcls"),
            seqcls,
            "AutoModelForSequenceClassification",
        ),
        (
            reference.join("tiny_phi3_lm"),
            AutoTask::CausalLm,
            "AutoModelForCausalLM",
        ),
        (
            reference.join("tiny_gemma3_seqcls"),
            seqcls,
            "AutoModelForSequenceClassification",
        ),
        // Qwen2's question answering keeps its body under `transformer`.
        (
            reference.join("tiny_qwen2_qa"),
            AutoTask::QuestionAnswering,
            "AutoModelForQuestionAnswering",
        ),
        (
            reference.join("tiny_distilbert_qa"),
            AutoTask::QuestionAnswering,
            "AutoModelForQuestionAnswering",
        ),
        (
            reference.join("tiny_modernbert_qa"),
            AutoTask::QuestionAnswering,
            "AutoModelForQuestionAnswering",
        ),
    ];
    // The families since transformers 5 (the mixtures of experts, Qwen3.5's hybrid layers,
    // Gemma 3's and Qwen3.5's multimodal checkpoints, gpt-oss's MXFP4 one dequantised).
    let families = assets().join("reference/decoder_families");
    let hybrid = assets().join("reference/qwen3_5");
    let later = [
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
    ]
    .map(|case| families.join(case))
    .into_iter()
    .chain(["qwen3_5_text", "qwen3_5_moe_text", "qwen3_5"].map(|case| hybrid.join(case)))
    .chain(
        ["gemma4_text", "gemma4_text_moe", "gemma4"]
            .map(|case| assets().join("reference/gemma4").join(case)),
    )
    .chain([assets().join("reference/gpt_oss_mxfp4/float32")])
    .map(|dir| (dir, AutoTask::CausalLm, "AutoModelForCausalLM"));
    let cases: Vec<(PathBuf, AutoTask, &str)> = cases.into_iter().chain(later).collect();
    let python = std::env::var("TCHTRAIN_VENV_PYTHON").context(
        "TCHTRAIN_VENV_PYTHON is not set: run `cargo xtask setup` (it writes .cargo/libtorch.toml)",
    )?;
    // Token ids every tiny vocabulary (1000 and up) holds.
    let ids = Tensor::from_slice(&[4i64, 268, 75, 218, 18, 625, 26, 931]).view([1, 8]);
    // Every saved folder is loaded by one Python process (its imports take ~15 s).
    let mut script = String::from(
        "import torch, transformers as tf; from safetensors.torch import save_file\n\
         ids = torch.tensor([[4, 268, 75, 218, 18, 625, 26, 931]])\n",
    );
    let mut saved = Vec::new();
    for (src, task, auto) in cases {
        let loaded = from_pretrained_dir(&src, task, Device::Cpu, &LoadOptions::default())?;
        let name = loaded.model.architecture();
        let dir = temp_dir(&format!("saved-{}", saved.len()));
        loaded.model.save_pretrained(&dir)?;
        let tensors = read_checkpoint(&dir)?;
        let tied = loaded.model.tied_weights();
        assert!(
            tied.iter()
                .all(|(k, _)| !tensors.iter().any(|(t, _)| t == k)),
            "{name}: a tied weight was saved twice"
        );
        let again = from_pretrained_dir(&dir, task, Device::Cpu, &LoadOptions::default())?;
        assert!(again.info.is_clean(), "{name}: {}", again.info);
        let run = |m: &dyn PreTrainedModel| -> Result<Tensor> {
            tch::no_grad(|| m.forward(&ModelInputs::new(&ids)))?
                .logits
                .context("logits")
        };
        let ours = run(&*loaded.model)?;
        assert_eq!(ours, run(&*again.model)?, "{name}: reloaded here");

        let out = dir.join("python_logits.safetensors");
        script.push_str(&format!(
            "m = tf.{auto}.from_pretrained({dir:?}, dtype=torch.float32).eval()\n\
             for p in m.parameters(): p.data = p.data.clone()\n\
             assert type(m).__name__ == {name:?}, type(m).__name__\n\
             o = m(input_ids=ids)\n\
             l = torch.stack([o.start_logits, o.end_logits], -1) if 'start_logits' in o else o.logits\n\
             save_file({{'logits': l.detach().contiguous()}}, {out:?})\n",
            dir = dir.to_str().unwrap(),
            out = out.to_str().unwrap()
        ));
        saved.push((name, dir, out, ours));
    }
    let status = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .status()?;
    assert!(status.success(), "Python could not load a saved model");
    for (name, dir, out, ours) in saved {
        let theirs: BTreeMap<String, Tensor> =
            Tensor::read_safetensors(&out)?.into_iter().collect();
        let diff = (&ours - &theirs["logits"]).abs().max().double_value(&[]);
        assert!(diff == 0.0, "{name}: logits differ from Python's by {diff}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// A masked LM whose config unties the decoder is refused before any weight is built,
/// naming the field and the fix, for every encoder family.
#[test]
fn an_untied_masked_lm_decoder_is_refused_naming_the_field() {
    use tchtrain_models::{
        BertConfig, BertForMaskedLM, DebertaV2Config, DebertaV2ForMaskedLM, DistilBertConfig,
        DistilBertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM,
    };
    fn check<M>(built: tchtrain_models::Result<M>, family: &str) {
        let Err(e) = built else {
            panic!("{family}: an untied masked-LM decoder was accepted");
        };
        let e = e.to_string();
        assert!(
            e.contains("tie_word_embeddings") && e.contains("set tie_word_embeddings to true"),
            "{family}: {e}"
        );
    }
    let bert = BertConfig {
        tie_word_embeddings: false,
        ..Default::default()
    };
    check(BertForMaskedLM::new(&bert, Device::Cpu), "BERT");
    let distilbert = DistilBertConfig {
        tie_word_embeddings: false,
        ..Default::default()
    };
    check(
        DistilBertForMaskedLM::new(&distilbert, Device::Cpu),
        "DistilBERT",
    );
    let deberta = DebertaV2Config {
        tie_word_embeddings: false,
        ..Default::default()
    };
    check(
        DebertaV2ForMaskedLM::new(&deberta, Device::Cpu),
        "DeBERTa-v2",
    );
    let modernbert = ModernBertConfig {
        tie_word_embeddings: false,
        ..Default::default()
    };
    check(
        ModernBertForMaskedLM::new(&modernbert, Device::Cpu),
        "ModernBERT",
    );
}

#[test]
fn broken_folders_are_typed_errors() -> Result<()> {
    let _g = lock();
    let dir = temp_dir("broken");
    std::fs::copy(
        assets().join("tiny-gpt2/config.json"),
        dir.join("config.json"),
    )?;
    let err = GPT2LMHeadModel::from_pretrained_dir(&dir, Device::Cpu, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    // A truncated safetensors file names the file.
    let mut bytes = Vec::new();
    std::fs::File::open(assets().join("tiny-gpt2/model.safetensors"))?.read_to_end(&mut bytes)?;
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2])?;
    let err = GPT2LMHeadModel::from_pretrained_dir(&dir, Device::Cpu, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );
    // Malformed config.json names the file.
    std::fs::write(dir.join("config.json"), "{\"n_embd\": \"wide\"}")?;
    let err = GPT2LMHeadModel::from_pretrained_dir(&dir, Device::Cpu, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    // A checkpoint of another architecture: every key unexpected and every parameter missing
    // would be silent garbage, so shapes that do not fit are an error naming the keys.
    let cfg = std::fs::read_to_string(assets().join("tiny-gpt2/config.json"))?
        .replace("\"n_embd\": 64", "\"n_embd\": 32");
    std::fs::write(dir.join("config.json"), cfg)?;
    std::fs::copy(
        assets().join("tiny-gpt2/model.safetensors"),
        dir.join("model.safetensors"),
    )?;
    let err = GPT2LMHeadModel::from_pretrained_dir(&dir, Device::Cpu, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("transformer.wte.weight") && err.contains("ignore_mismatched_sizes"),
        "{err}"
    );
    Ok(())
}

#[test]
fn dropout_applies_in_training_mode_only() -> Result<()> {
    let _g = lock();
    let mut m = GPT2LMHeadModel::from_pretrained_dir(
        &assets().join("tiny-gpt2"),
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    m.eval();
    let a = logits(&m)?;
    assert_eq!(a, logits(&m)?, "eval mode is deterministic");
    m.train();
    tch::manual_seed(0);
    let b = logits(&m)?;
    tch::manual_seed(1);
    let c = logits(&m)?;
    assert!(
        (&b - &c).abs().max().double_value(&[]) > 1e-3,
        "dropout (p=0.1) must change training-mode outputs"
    );
    assert!((&a - &b).abs().max().double_value(&[]) > 1e-3);
    let _ = Kind::Float;
    Ok(())
}

#[test]
fn bf16_checkpoint_loads_into_fp32_model_and_back() -> Result<()> {
    let _g = lock();
    let src = GPT2LMHeadModel::from_pretrained_dir(
        &assets().join("tiny-gpt2"),
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let dir = temp_dir("bf16");
    std::fs::copy(
        assets().join("tiny-gpt2/config.json"),
        dir.join("config.json"),
    )?;
    let tensors: Vec<(String, Tensor)> = src
        .var_store()
        .variables()
        .into_iter()
        .map(|(k, v)| (k, v.to_kind(Kind::BFloat16)))
        .collect();
    write_safetensors(&tensors, &dir.join("model.safetensors"))?;
    let loaded = GPT2LMHeadModel::from_pretrained_dir(&dir, Device::Cpu, &LoadOptions::default())?;
    assert!(loaded.info.is_clean(), "{}", loaded.info);
    let vars = loaded.model.var_store().variables();
    for (name, t) in &tensors {
        let v = &vars[name];
        assert_eq!(v.kind(), Kind::Float, "{name} keeps the model dtype");
        assert_eq!(
            v,
            &t.to_kind(Kind::Float),
            "{name} equals the bf16 value cast to fp32"
        );
    }
    Ok(())
}

/// The token `huggingface-cli login` wrote (`$HF_HOME/token`) reaches the hub with every
/// download, as huggingface_hub sends it; `HF_TOKEN` wins over the file; no token, no
/// header. `HF_HUB_DISABLE_PROGRESS_BARS` turns the download bars off.
#[test]
fn the_login_token_reaches_the_hub() -> Result<()> {
    let _g = lock();
    let served = temp_dir("served-token");
    std::fs::create_dir_all(&served)?;
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(assets().join("tiny-llama").join(f), served.join(f))?;
    }
    let hf_home = temp_dir("hf-home");
    std::fs::create_dir_all(&hf_home)?;
    std::fs::write(hf_home.join("token"), "hf_from_login_file\n")?;
    for (env_token, want) in [
        (None, Some("Bearer hf_from_login_file")),
        (Some("hf_from_env"), Some("Bearer hf_from_env")),
    ] {
        let server = HubServer::builder()
            .model("tchtrain/tiny-llama", "main", served.clone())
            .start();
        let endpoint = server.endpoint().to_string();
        let cache = temp_dir("token-cache");
        let _ = std::fs::remove_dir_all(&cache);
        let (home, cache_s) = (hf_home.clone(), cache.clone());
        let opts = HubOptions::from_vars(|name| match name {
            "HF_HOME" => Some(home.clone().into_os_string()),
            "HF_HUB_CACHE" => Some(cache_s.clone().into_os_string()),
            "HF_ENDPOINT" => Some(endpoint.clone().into()),
            "HF_TOKEN" => env_token.map(Into::into),
            "HF_HUB_DISABLE_PROGRESS_BARS" => Some("1".into()),
            _ => None,
        });
        assert_eq!(opts.token.as_deref(), want.map(|w| &w[7..]));
        assert!(!opts.progress);
        from_pretrained(
            "tchtrain/tiny-llama",
            AutoTask::CausalLm,
            Device::Cpu,
            &opts,
            &LoadOptions::default(),
        )?;
        let auth: Vec<String> = server
            .requests()
            .into_iter()
            .filter_map(|r| r.authorization)
            .collect();
        assert!(!auth.is_empty(), "no Authorization header sent");
        for line in &auth {
            assert!(line.ends_with(want.unwrap_or_default()), "{line}");
        }
        let _ = std::fs::remove_dir_all(&cache);
    }
    // Neither the variable nor a login file: no token.
    let none = HubOptions::from_vars(|name| {
        (name == "HF_HOME").then(|| temp_dir("empty-hf-home").into_os_string())
    });
    assert_eq!((none.token, none.progress), (None, true));
    Ok(())
}

/// gpt-oss checkpoints whose experts are MXFP4 (`scripts/reference/gpt_oss_mxfp4.py`): read as
/// transformers 5.23 reads them without its kernels — every expert weight dequantised to the
/// bit of upstream's (float32 and bfloat16 checkpoints), the logits equal; the config saved
/// without the quantization config and the experts under their own names (upstream writes
/// them under the `_blocks` names, which it cannot read back), and read back to the same
/// logits. Another `quant_method` is refused naming the field.
#[test]
fn gpt_oss_mxfp4_experts_dequantised_as_upstream() -> Result<()> {
    let _g = lock();
    let root = assets().join("reference/gpt_oss_mxfp4");
    for dtype in ["float32", "bfloat16"] {
        let dir = root.join(dtype);
        let r: BTreeMap<String, Tensor> =
            Tensor::read_safetensors(root.join(format!("{dtype}.safetensors")))
                .with_context(|| format!("{} (run `cargo xtask setup`)", root.display()))?
                .into_iter()
                .collect();
        let loaded = from_pretrained_dir(
            &dir,
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        assert!(loaded.info.is_clean(), "{dtype}: {}", loaded.info);
        let mut model = loaded.model;
        model.eval();
        let vars = model.var_store().variables();
        let mut experts = 0;
        for (name, expected) in r.iter().filter(|(k, _)| k.contains("experts")) {
            let ours = vars.get(name).with_context(|| format!("no {name}"))?;
            assert_eq!(ours.kind(), expected.kind(), "{dtype}: {name} dtype");
            assert!(
                ours.equal(expected),
                "{dtype}: {name} dequantised differently"
            );
            experts += 1;
        }
        assert_eq!(experts, 6, "{dtype}: 3 layers' gate_up_proj and down_proj");
        let run = |model: &dyn PreTrainedModel| -> Result<Tensor> {
            let out = tch::no_grad(|| {
                model.forward(&ModelInputs {
                    input_ids: r.get("input_ids"),
                    attention_mask: r.get("attention_mask"),
                    ..Default::default()
                })
            })?;
            Ok(out.logits.context("logits")?.to_kind(Kind::Float))
        };
        assert!(run(&*model)?.equal(&r["logits"]), "{dtype}: logits");
        let saved = temp_dir(&format!("mxfp4-{dtype}"));
        model.save_pretrained(&saved)?;
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(saved.join("config.json"))?)?;
        assert!(
            config.get("quantization_config").is_none(),
            "{dtype}: {config}"
        );
        let names: Vec<String> = read_checkpoint(&saved)?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert!(names.contains(&"model.layers.0.mlp.experts.gate_up_proj".to_string()));
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with("_blocks") || n.ends_with("_scales"))
        );
        let back = from_pretrained_dir(
            &saved,
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        assert!(back.info.is_clean(), "{dtype} saved: {}", back.info);
        let mut back = back.model;
        back.eval();
        assert!(
            run(&*back)?.equal(&r["logits"]),
            "{dtype}: logits after save and load"
        );
        let _ = std::fs::remove_dir_all(&saved);
    }
    // Another quantization method is refused, naming the key.
    let other = temp_dir("mxfp4-other");
    for entry in std::fs::read_dir(root.join("float32"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), other.join(entry.file_name()))?;
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(other.join("config.json"))?)?;
    config["quantization_config"] = serde_json::json!({"quant_method": "bitsandbytes"});
    std::fs::write(other.join("config.json"), config.to_string())?;
    let err = from_pretrained_dir(
        &other,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )
    .err()
    .context("a bitsandbytes gpt-oss config loads")?
    .to_string();
    assert!(err.contains("quantization_config"), "{err}");
    let _ = std::fs::remove_dir_all(&other);
    Ok(())
}
