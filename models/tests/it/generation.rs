//! `generate()` against transformers 5.23 (`scripts/reference/generation.py`): greedy
//! decoding and sampling on the tiny Llama and GPT-2 (left padding, temperature, top-k,
//! top-p, min-p, repetition penalty, no-repeat n-grams, end-of-sequence lists with the pad
//! fill, min_new_tokens, num_return_sequences) and beam search (returned sequences, early
//! stopping true / false / "never", length penalties, beam sampling, end-of-sequence ids
//! with upstream's fill), each with the key / value cache (upstream's
//! default) and without: the sequences equal upstream's, and every step's processed scores
//! equal its scores to the bit for batches of several rows (one row: see the tolerance
//! below).

use std::collections::HashMap;

use anyhow::{Context, Result};
use serde_json::Value;
use tch::{Device, Kind, Tensor};
use tchtrain_models::{AutoTask, GenerationConfig, LoadOptions, from_pretrained_dir, generate};
use tchtrain_testing::{assets, lock};

#[test]
fn generate_equals_transformers() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/generation");
    let cases: serde_json::Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json"))?)?;
    assert_eq!(cases.len(), 8);
    for (name, case) in &cases {
        let r: HashMap<String, Tensor> =
            Tensor::read_safetensors(dir.join(format!("{name}.safetensors")))?
                .into_iter()
                .collect();
        let model_dir = assets().join(case["model"].as_str().context("model")?);
        let mut model = from_pretrained_dir(
            &model_dir,
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        model.eval();
        let config_json: Value =
            serde_json::from_str(&std::fs::read_to_string(model_dir.join("config.json"))?)?;
        let max_positions = config_json["max_position_embeddings"]
            .as_i64()
            .or(config_json["n_positions"].as_i64());
        // Upstream with its key / value cache (the default), and without.
        for (use_cache, prefix) in [(true, "cached_"), (false, "")] {
            let mut config = GenerationConfig::from_pretrained(&model_dir)?;
            let mut kwargs = case["kwargs"].clone();
            kwargs["output_scores"] = true.into();
            kwargs["return_dict_in_generate"] = true.into();
            kwargs["use_cache"] = use_cache.into();
            config.update(&GenerationConfig::from_json(&kwargs)?);
            tch::manual_seed(case["seed"].as_i64().context("seed")?);
            let out = generate(
                &*model,
                &r["input_ids"],
                Some(&r["attention_mask"]),
                &config,
                max_positions,
            )?;
            let want = &r[&format!("{prefix}sequences")];
            assert!(
                out.sequences.equal(want),
                "{name} {prefix}: sequences {:?}, upstream {:?}",
                Vec::<Vec<i64>>::try_from(&out.sequences)?,
                Vec::<Vec<i64>>::try_from(want)?
            );
            let scores = Tensor::stack(&out.scores, 0);
            // One row: the head is a matrix-vector product, whose rounding depends on where
            // the weight sits in memory; transformers keeps the safetensors file mapped (the
            // tiny Llama's embedding 40 bytes past a 64-byte boundary), ours is aligned: the
            // scores may differ by a few float32 ulps there (8 ulps of the largest score
            // allowed; measured 1.2e-7, one ulp), the tokens the same. Several rows: to the
            // bit.
            let tol = if out.sequences.size()[0] == 1 {
                let finite = r[&format!("{prefix}scores")].isfinite();
                let largest = r[&format!("{prefix}scores")]
                    .masked_select(&finite)
                    .abs()
                    .max()
                    .double_value(&[]);
                8.0 * f64::from(f32::EPSILON) * largest.max(1.0)
            } else {
                0.0
            };
            let want = &r[&format!("{prefix}scores")];
            let finite = scores.isfinite();
            assert!(
                finite.equal(&want.isfinite()),
                "{name} {prefix}: removed tokens differ"
            );
            let d = (scores.masked_select(&finite) - want.masked_select(&finite))
                .abs()
                .max()
                .double_value(&[]);
            assert!(d <= tol, "{name} {prefix}: scores differ by {d}");
            // Beam search: each returned hypothesis's score.
            if let Some(want) = r.get(&format!("{prefix}sequences_scores")) {
                let got = out.sequences_scores.as_ref().context("sequences_scores")?;
                let d = (got - want).abs().max().double_value(&[]);
                assert!(d <= tol, "{name} {prefix}: sequences_scores differ by {d}");
            }
        }
        eprintln!("{name}: sequences and scores equal upstream's, with and without the cache");
    }
    Ok(())
}

/// The configuration: upstream's refusals, what is not implemented, the file round trip,
/// and the length rules.
#[test]
fn generation_config_checks_and_lengths() -> Result<()> {
    let _g = lock();
    let refused = |v: Value, want: &str| {
        let err = GenerationConfig::from_json(&v).expect_err("refused");
        assert!(err.to_string().contains(want), "{err}");
    };
    refused(
        serde_json::json!({"num_beams": 2, "num_return_sequences": 3}),
        "smaller or equal to `num_beams`",
    );
    refused(
        serde_json::json!({"early_stopping": "sometimes"}),
        "boolean or 'never'",
    );
    refused(serde_json::json!({"num_beam_groups": 2}), "num_beam_groups");
    refused(serde_json::json!({"max_time": 5.0}), "max_time");
    refused(serde_json::json!({"output_logits": true}), "output_logits");
    refused(
        serde_json::json!({"cache_implementation": "quantized"}),
        "cache_implementation",
    );
    refused(
        serde_json::json!({"frobnicate": 1}),
        "not a generation option",
    );
    refused(
        serde_json::json!({"do_sample": true, "top_p": -0.5}),
        "top_p",
    );
    // Defaults of options not implemented are fine; so are the generation options an older
    // config.json carries at its top level, which from_model_config honours.
    GenerationConfig::from_json(&serde_json::json!({
        "remove_invalid_values": false, "renormalize_logits": false, "num_beam_groups": 1,
    }))?;
    let c = GenerationConfig::from_model_config(&serde_json::json!({
        "model_type": "gpt2", "n_positions": 64, "do_sample": true, "top_k": 3,
        "eos_token_id": 7, "task_specific_params": {"x": 1},
    }))?;
    assert_eq!(
        (c.do_sample, c.top_k, c.eos_token_id.clone()),
        (Some(true), Some(3), Some(vec![7]))
    );
    refused(serde_json::json!({"typical_p": 0.9}), "typical_p");
    refused(serde_json::json!({"max_new_tokens": 0}), "greater than 0");
    refused(
        serde_json::json!({"num_return_sequences": 2}),
        "Greedy methods",
    );
    refused(
        serde_json::json!({"repetition_penalty": 0.0}),
        "strictly positive",
    );
    refused(
        serde_json::json!({"do_sample": true, "temperature": 0.0}),
        "strictly positive float",
    );
    refused(serde_json::json!({"bad_words_ids": [[5]]}), "bad_words_ids");
    refused(serde_json::json!({"top_k": "x"}), "expected an integer");
    // Neutral values of unimplemented options, and inert ones, are kept and written back.
    let c = GenerationConfig::from_json(&serde_json::json!({
        "length_penalty": 1.0, "output_attentions": false, "eos_token_id": [2, 7],
        "do_sample": true, "top_k": 5, "max_new_tokens": 7,
    }))?;
    assert_eq!(c.eos_token_id, Some(vec![2, 7]));
    let dir = tchtrain_testing::temp_dir("generation-config");
    c.save_pretrained(dir.path())?;
    let back = GenerationConfig::from_pretrained(dir.path())?;
    assert_eq!(back.to_json(), c.to_json());
    let text = std::fs::read_to_string(dir.path().join("generation_config.json"))?;
    assert!(
        text.contains("\"transformers_version\": \"5.23.0\""),
        "{text}"
    );
    assert!(!text.contains("null"), "only the fields set: {text}");

    // Lengths: the default is 20 new tokens capped at the model's positions; a prompt as
    // long as max_length is refused.
    let mut model = from_pretrained_dir(
        &assets().join("tiny-llama"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    model.eval();
    let ids = Tensor::from_slice(&[1i64, 45, 300]).unsqueeze(0);
    let greedy = GenerationConfig::default();
    let out = generate(&*model, &ids, None, &greedy, Some(256))?;
    assert_eq!(out.sequences.size(), [1, 23]);
    let out = generate(&*model, &ids, None, &greedy, Some(10))?;
    assert_eq!(out.sequences.size(), [1, 10]);
    assert!(
        out.scores.is_empty(),
        "scores only with output_scores and return_dict_in_generate"
    );
    let err = generate(
        &*model,
        &ids,
        None,
        &GenerationConfig {
            max_length: Some(3),
            ..Default::default()
        },
        None,
    )
    .expect_err("prompt too long");
    assert!(
        err.to_string().contains("Input length of input_ids is 3"),
        "{err}"
    );
    let err =
        generate(&*model, &ids.to_kind(Kind::Float), None, &greedy, None).expect_err("float ids");
    assert!(err.to_string().contains("int64"), "{err}");
    // GPT-2's positions: the cached tokens count (n_positions 256 here).
    let mut gpt2 = from_pretrained_dir(
        &assets().join("tiny-gpt2"),
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    gpt2.eval();
    for use_cache in [true, false] {
        let err = generate(
            &*gpt2,
            &ids,
            None,
            &GenerationConfig {
                max_length: Some(300),
                use_cache: Some(use_cache),
                ..Default::default()
            },
            None,
        )
        .expect_err("past n_positions");
        assert!(err.to_string().contains("256"), "{err}");
    }
    // A mask that does not cover the cached tokens is an error, not a panic.
    let cache = tchtrain_models::DynamicCache::new();
    tch::no_grad(|| {
        gpt2.forward(&tchtrain_models::ModelInputs {
            input_ids: Some(&ids),
            past_key_values: Some(&cache),
            ..Default::default()
        })
    })?;
    assert_eq!(cache.get_seq_length(), 3);
    let one = Tensor::from_slice(&[5i64]).unsqueeze(0);
    let short_mask = Tensor::ones([1, 1], (Kind::Int64, Device::Cpu));
    let err = tch::no_grad(|| {
        gpt2.forward(&tchtrain_models::ModelInputs {
            input_ids: Some(&one),
            attention_mask: Some(&short_mask),
            past_key_values: Some(&cache),
            ..Default::default()
        })
    })
    .expect_err("mask width");
    assert!(err.to_string().contains("cached + new tokens"), "{err}");
    // An encoder is refused.
    let bert = from_pretrained_dir(
        &assets().join("tiny-bert"),
        AutoTask::MaskedLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    let err = generate(&*bert, &ids, None, &greedy, None).expect_err("encoder");
    assert!(
        err.to_string()
            .contains("neither a causal language model nor an encoder-decoder model"),
        "{err}"
    );
    assert!(!bert.is_causal_lm());
    Ok(())
}

/// A causal LM keeps its generation configuration and `save_pretrained` writes it: the same
/// `generation_config.json` upstream wrote for the tiny models, and for a model made from its
/// config (no file), upstream's `from_model_config` one.
#[test]
fn save_pretrained_writes_the_generation_config() -> Result<()> {
    let _g = lock();
    for name in ["tiny-llama", "tiny-gpt2"] {
        let dir = assets().join(name);
        let model = from_pretrained_dir(
            &dir,
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        let out = tchtrain_testing::temp_dir("generation-config-save");
        model.save_pretrained(out.path())?;
        let want = std::fs::read_to_string(dir.join("generation_config.json"))?;
        let got = std::fs::read_to_string(out.path().join("generation_config.json"))?;
        assert_eq!(got.trim_end(), want.trim_end(), "{name}");
        // Without the file, the same from the config (these files were derived so too).
        let bare = tchtrain_testing::temp_dir("generation-config-derived");
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(dir.join(f), bare.path().join(f))?;
        }
        let model = from_pretrained_dir(
            bare.path(),
            AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?
        .model;
        let value = model.generation_config().context("a generation config")?;
        let want: Value = serde_json::from_str(&want)?;
        let mut value = value.clone();
        value["transformers_version"] = want["transformers_version"].clone();
        assert_eq!(value, want, "{name}: derived from config.json");
        GenerationConfig::from_json(&value)?;
    }
    Ok(())
}

/// Every Llama-shaped family's tiny model of `models.py` (Qwen2 and Mistral with sliding
/// windows, Qwen3, Gemma 1–3 with Gemma 2's soft-capping, Phi-3's LongRoPE, Llama under each
/// rope type) and of `decoder_families.py` (the mixtures of experts, Granite, SmolLM3, OLMo 2
/// and 3, Qwen3.5 and Qwen3.5-MoE: their linear layers' convolution and recurrent states in the
/// cache, one-token steps through the recurrent rule) generates upstream's sequences, greedy and with beam search (3 beams, 2 returned,
/// length penalty 0.9), from a batch whose second row is left-padded. Upstream decodes with
/// its cache, as here (the sliding layers keeping the last `window - 1` tokens, as upstream's
/// `DynamicSlidingWindowLayer`; the tiny windows of 3 are passed within the first steps). The mixtures of experts
/// decode with `output_router_logits` off, as upstream can only.
#[test]
fn generate_on_every_family_equals_transformers() -> Result<()> {
    let _g = lock();
    let models = assets().join("reference/models");
    for case in [
        "tiny_qwen2_lm",
        "tiny_qwen3_lm",
        "tiny_mistral_lm",
        "tiny_gemma_lm",
        "tiny_gemma2_lm",
        "tiny_gemma3_lm",
        "tiny_phi3_lm",
        "tiny_llama_yarn_lm",
        "tiny_llama_dynamic_lm",
        "tiny_llama_llama3_lm",
        "tiny_llama_linear_lm",
    ] {
        check_generate(
            &models.join(case),
            &models.join(format!("{case}.generate.safetensors")),
        )?;
    }
    for (reference, case) in [
        ("decoder_families", "qwen3_moe"),
        ("decoder_families", "qwen2_moe"),
        ("decoder_families", "mixtral"),
        ("decoder_families", "olmoe"),
        ("decoder_families", "gpt_oss"),
        ("decoder_families", "granite"),
        ("decoder_families", "smollm3"),
        ("decoder_families", "olmo2"),
        ("decoder_families", "olmo3"),
        ("decoder_families", "gemma3"),
        ("qwen3_5", "qwen3_5_text"),
        ("qwen3_5", "qwen3_5_moe_text"),
        ("qwen3_5", "qwen3_5"),
        ("gemma4", "gemma4_text"),
        ("gemma4", "gemma4_text_moe"),
        ("gemma4", "gemma4"),
    ] {
        let families = assets().join("reference").join(reference);
        // The checkpoint with `output_router_logits` off.
        let dir = tchtrain_testing::temp_dir(&format!("generate-{case}"));
        for entry in std::fs::read_dir(families.join(case))? {
            let entry = entry?;
            std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
        }
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        if config.get("output_router_logits").is_some() {
            config["output_router_logits"] = false.into();
        }
        std::fs::write(dir.join("config.json"), config.to_string())?;
        check_generate(&dir, &families.join(format!("{case}.generate.safetensors")))?;
    }
    Ok(())
}

/// Greedy and beam search on the model in `dir` against the sequences in `reference`.
fn check_generate(dir: &std::path::Path, reference: &std::path::Path) -> Result<()> {
    let case = dir.display();
    let mut model = from_pretrained_dir(
        dir,
        AutoTask::CausalLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?
    .model;
    model.eval();
    let r: HashMap<String, Tensor> = Tensor::read_safetensors(reference)
        .with_context(|| format!("{} (run `cargo xtask setup`)", reference.display()))?
        .into_iter()
        .collect();
    let config_json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let max_positions = config_json["max_position_embeddings"].as_i64();
    for (kind, kwargs) in [
        ("greedy", serde_json::json!({"max_new_tokens": 6})),
        (
            "beam",
            serde_json::json!({"num_beams": 3, "num_return_sequences": 2,
                "length_penalty": 0.9, "max_new_tokens": 6}),
        ),
    ] {
        let mut config = GenerationConfig::from_pretrained(dir)?;
        let mut kwargs = kwargs;
        kwargs["pad_token_id"] = 0.into();
        kwargs["do_sample"] = false.into();
        config.update(&GenerationConfig::from_json(&kwargs)?);
        tch::manual_seed(0);
        let out = generate(
            &*model,
            &r["input_ids"],
            Some(&r["attention_mask"]),
            &config,
            max_positions,
        )?;
        assert!(
            out.sequences.equal(&r[kind]),
            "{case} {kind}: {:?}, upstream {:?}",
            Vec::<Vec<i64>>::try_from(&out.sequences)?,
            Vec::<Vec<i64>>::try_from(&r[kind])?
        );
    }
    Ok(())
}
