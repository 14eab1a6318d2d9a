//! Logits, loss and gradient parity with transformers 5.23 (fp32, CPU) on the tiny random
//! checkpoints and the real MiniLM / SmolLM2, against `scripts/reference/models.py`.
//!
//! Tolerances: logits ≤ 1e-4 max abs (fp32, same kernels, differences are summation order
//! in matmuls / attention); loss and gradients ≤ 1e-4 relative to the largest magnitude of
//! each reference tensor.

use std::collections::HashMap;
use tchtrain_testing::{assets, lock};

use anyhow::{Context, Result, bail};
use tch::{Device, Kind, Tensor};
use tchtrain_models::{
    BertBaseModel, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
    GPT2ForSequenceClassification, GPT2LMHeadModel, LlamaForCausalLM, LoadOptions, ModelInputs,
    PreTrainedModel,
};

fn reference(case: &str) -> Result<HashMap<String, Tensor>> {
    let path = assets()
        .join("reference/models")
        .join(format!("{case}.safetensors"));
    if !path.exists() {
        bail!("{} is missing: run `cargo xtask setup`", path.display());
    }
    Ok(Tensor::read_safetensors(&path)?.into_iter().collect())
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-12);
    max_abs(a, b) / scale
}

/// The names of the model's trainable parameters in the order the trainer's
/// `parameters()` yields them (the var store's creation order).
fn parameter_order(model: &dyn PreTrainedModel) -> Vec<String> {
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

/// Checks the parameter order against upstream's `named_parameters()` (clipping sums the
/// per-parameter norms in that order), logits, then loss and every recorded gradient;
/// returns (logits diff, worst grad rel).
fn check(case: &str, model: &mut dyn PreTrainedModel, logits_key: &str) -> Result<(f64, f64)> {
    let order_path = assets().join(format!("reference/models/{case}.parameters.json"));
    let mut upstream: Vec<String> = serde_json::from_str(&std::fs::read_to_string(&order_path)?)?;
    // A tied weight is one tensor under two names: upstream lists it under the name it
    // meets first (XLM-RoBERTa's head comes first: `lm_head.decoder.weight`).
    for (tied, source) in model.tied_weights() {
        for name in upstream.iter_mut().filter(|n| **n == tied) {
            *name = source.clone();
        }
    }
    assert_eq!(parameter_order(model), upstream, "{case}: parameter order");
    let r = reference(case)?;
    let ids = &r["input_ids"];
    let mask = &r["attention_mask"];
    let tt = r.get("token_type_ids");
    model.eval();
    let inputs = ModelInputs {
        input_ids: Some(ids),
        attention_mask: Some(mask),
        token_type_ids: tt,
        ..Default::default()
    };
    let out = tch::no_grad(|| model.forward(&inputs))?;
    let got = match logits_key {
        "last_hidden_state" => out.last_hidden_state.context("no hidden state")?,
        _ => out.logits.context("no logits")?,
    };
    let logits_diff = max_abs(&got, &r[logits_key]);
    assert!(
        logits_diff <= 1e-4,
        "{case}: logits max abs diff {logits_diff}"
    );
    let mut worst = 0.0f64;
    let has_labels = r.contains_key("labels") || r.contains_key("start_positions");
    if has_labels {
        let inputs = ModelInputs {
            labels: r.get("labels"),
            start_positions: r.get("start_positions"),
            end_positions: r.get("end_positions"),
            ..inputs
        };
        for (_, v) in model.var_store().variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let out = model.forward(&inputs)?;
        let loss = out.loss.context("no loss")?;
        let loss_rel = rel(&loss.reshape([1]), &r["loss"]);
        assert!(loss_rel <= 1e-4, "{case}: loss rel diff {loss_rel}");
        loss.backward();
        let vars = model.var_store().variables();
        let mut n = 0;
        for (key, expected) in r.iter().filter(|(k, _)| k.starts_with("grad.")) {
            let name = &key["grad.".len()..];
            let tied = model.tied_weights();
            let name = tied
                .iter()
                .find(|(t, _)| t == name)
                .map_or(name, |(_, source)| source.as_str());
            let var = vars
                .get(name)
                .with_context(|| format!("{case}: model has no parameter {name}"))?;
            let d = rel(&var.grad(), expected);
            assert!(d <= 1e-4, "{case}: grad of {name} rel diff {d}");
            worst = worst.max(d);
            n += 1;
        }
        assert!(n > 0, "{case}: no gradients compared");
    }
    eprintln!("{case}: logits max abs diff {logits_diff:.3e}, worst grad rel diff {worst:.3e}");
    Ok((logits_diff, worst))
}

#[test]
fn tiny_gpt2_lm_head() -> Result<()> {
    let _g = lock();
    let loaded = GPT2LMHeadModel::from_pretrained_dir(
        &assets().join("tiny-gpt2"),
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert!(loaded.info.is_clean(), "{}", loaded.info);
    let mut model = loaded.model;
    check("tiny_gpt2_lm", &mut model, "logits")?;
    Ok(())
}

#[test]
fn tiny_gpt2_sequence_classification() -> Result<()> {
    let _g = lock();
    // The reference saved its freshly initialised head: load that exact model.
    let dir = assets().join("reference/models/tiny_gpt2_seqcls");
    let loaded = GPT2ForSequenceClassification::from_pretrained_dir(
        &dir,
        None,
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert!(loaded.info.is_clean(), "{}", loaded.info);
    let mut model = loaded.model;
    check("tiny_gpt2_seqcls", &mut model, "logits")?;
    // From the LM checkpoint with num_labels: the score head is reported missing.
    let fresh = GPT2ForSequenceClassification::from_pretrained_dir(
        &assets().join("tiny-gpt2"),
        Some(3),
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert_eq!(fresh.info.missing_keys, vec!["score.weight".to_string()]);
    assert!(fresh.info.unexpected_keys.is_empty());
    Ok(())
}

#[test]
fn tiny_bert_heads() -> Result<()> {
    let _g = lock();
    let o = LoadOptions::default();
    let mlm =
        BertForMaskedLM::from_pretrained_dir(&assets().join("tiny-bert"), None, Device::Cpu, &o)?;
    assert!(mlm.info.is_clean(), "{}", mlm.info);
    check("tiny_bert_mlm", &mut { mlm.model }, "logits")?;
    let dir = assets().join("reference/models");
    let seq = BertForSequenceClassification::from_pretrained_dir(
        &dir.join("tiny_bert_seqcls"),
        None,
        Device::Cpu,
        &o,
    )?;
    assert!(seq.info.is_clean(), "{}", seq.info);
    check("tiny_bert_seqcls", &mut { seq.model }, "logits")?;
    let tok = BertForTokenClassification::from_pretrained_dir(
        &dir.join("tiny_bert_tokcls"),
        None,
        Device::Cpu,
        &o,
    )?;
    assert!(tok.info.is_clean(), "{}", tok.info);
    check("tiny_bert_tokcls", &mut { tok.model }, "logits")?;
    Ok(())
}

#[test]
fn real_minilm_base_and_fresh_head() -> Result<()> {
    let _g = lock();
    let o = LoadOptions::default();
    // MiniLM's weights have no `bert.` prefix; its `embeddings.position_ids` buffer is ignored.
    let base = BertBaseModel::from_pretrained_dir(&assets().join("minilm"), None, Device::Cpu, &o)?;
    assert!(base.info.is_clean(), "{}", base.info);
    check("minilm", &mut { base.model }, "last_hidden_state")?;
    // Loading the base checkpoint under a classification head: only the head is missing,
    // and the pooler (present in the checkpoint) is used.
    let fresh = BertForSequenceClassification::from_pretrained_dir(
        &assets().join("minilm"),
        Some(2),
        Device::Cpu,
        &o,
    )?;
    assert_eq!(
        fresh.info.missing_keys,
        vec![
            "classifier.bias".to_string(),
            "classifier.weight".to_string()
        ]
    );
    assert!(fresh.info.unexpected_keys.is_empty(), "{}", fresh.info);
    let saved = assets().join("reference/models/minilm_seqcls");
    let seq = BertForSequenceClassification::from_pretrained_dir(&saved, None, Device::Cpu, &o)?;
    assert!(seq.info.is_clean(), "{}", seq.info);
    check("minilm_seqcls", &mut { seq.model }, "logits")?;
    Ok(())
}

#[test]
fn tiny_llama_causal_lm() -> Result<()> {
    let _g = lock();
    let loaded = LlamaForCausalLM::from_pretrained_dir(
        &assets().join("tiny-llama"),
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert!(loaded.info.is_clean(), "{}", loaded.info);
    check("tiny_llama_lm", &mut { loaded.model }, "logits")?;
    Ok(())
}

/// The Llama-shaped families `models.py` makes (seeded) and saves: Qwen2 (q/k/v biases, the
/// last two of 3 layers sliding over 3 of 8 tokens), Qwen3 (q/k RMSNorm, head_dim 32 over a
/// hidden size of 64 and 4 heads, tied head), Mistral (head_dim 24, every layer sliding over
/// 3 tokens), Gemma (a pad token in row 0: its embedding row gets no gradient), Gemma 2
/// (eager attention, scores and logits soft-capped where tanh bends), Gemma 3 (q/k norm, the
/// sliding layers' own RoPE base, the full layer's linear RoPE), Phi-3 (fused projections,
/// half-head rotary, LongRoPE's long factors and attention scaling, sliding window), Llama
/// under the yarn, dynamic (the forward outgrowing the cached positions), llama3 and linear
/// rope types, one row padded; loaded through the Auto dispatch by `model_type`.
#[test]
fn tiny_llama_shaped_families() -> Result<()> {
    let _g = lock();
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
        let loaded = tchtrain_models::from_pretrained_dir(
            &assets().join("reference/models").join(case),
            tchtrain_models::AutoTask::CausalLm,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
        let mut model = loaded.model;
        check(case, &mut *model, "logits")?;
    }
    Ok(())
}

/// A new `score` head on the tiny causal LMs, after `torch.manual_seed(0)`: upstream's
/// `GenericForSequenceClassification` (3 labels, pad token 0 ending row 1, pooled at each
/// row's last non-padding token) on Qwen2, Llama, Gemma 2 and Gemma 3, and
/// `GenericForTokenClassification` (5 labels, a biased head) on Qwen2 and Phi-3: logits, loss
/// and gradients as upstream's; and the head drawn from the causal LM's checkpoint after the
/// same seed equals the one upstream drew.
#[test]
fn tiny_decoder_classification_heads() -> Result<()> {
    let _g = lock();
    use tchtrain_models::AutoTask;
    let seq = AutoTask::SequenceClassification { num_labels: None };
    let tok = AutoTask::TokenClassification { num_labels: None };
    let reference = assets().join("reference/models");
    for (case, lm, task, head) in [
        (
            "tiny_qwen2_seqcls",
            reference.join("tiny_qwen2_lm"),
            seq,
            &["score.weight"][..],
        ),
        (
            "tiny_llama_seqcls",
            assets().join("tiny-llama"),
            seq,
            &["score.weight"],
        ),
        (
            "tiny_gemma2_seqcls",
            reference.join("tiny_gemma2_lm"),
            seq,
            &["score.weight"],
        ),
        (
            "tiny_gemma3_seqcls",
            reference.join("tiny_gemma3_lm"),
            seq,
            &["score.weight"],
        ),
        (
            "tiny_qwen2_tokcls",
            reference.join("tiny_qwen2_lm"),
            tok,
            &["score.weight", "score.bias"],
        ),
        (
            "tiny_phi3_tokcls",
            reference.join("tiny_phi3_lm"),
            tok,
            &["score.weight", "score.bias"],
        ),
    ] {
        let dir = reference.join(case);
        let loaded =
            tchtrain_models::from_pretrained_dir(&dir, task, Device::Cpu, &LoadOptions::default())?;
        assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
        let mut model = loaded.model;
        check(case, &mut *model, "logits")?;
        let num_labels = model.config().labels().num_labels();
        let fresh_task = match task {
            AutoTask::TokenClassification { .. } => AutoTask::TokenClassification {
                num_labels: Some(num_labels),
            },
            _ => AutoTask::SequenceClassification {
                num_labels: Some(num_labels),
            },
        };
        tch::manual_seed(0);
        let fresh = tchtrain_models::from_pretrained_dir(
            &lm,
            fresh_task,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        let mut missing = fresh.info.missing_keys.clone();
        missing.sort();
        let mut want = head.to_vec();
        want.sort();
        assert_eq!(missing, want, "{case}");
        for name in head {
            let drawn = &fresh.model.var_store().variables()[*name];
            assert!(
                drawn.equal(&model.var_store().variables()[*name]),
                "{case}: the new {name} differs from upstream's"
            );
        }
    }
    Ok(())
}

/// Tiny RoBERTa, XLM-RoBERTa, DistilBERT and DeBERTa-v3 (`models.py`, seeded): the masked
/// LM (row 1 padded with the pad id; RoBERTa's positions stay at the padding index there;
/// DeBERTa over 20 tokens, its relative positions log-bucketed) and, on its checkpoint, new
/// sequence classifiers (RoBERTa's `RobertaClassificationHead`, DistilBERT's
/// `pre_classifier` + `classifier`, DeBERTa's pooler + classifier with a -1 label its loss
/// drops; 3 labels) and token classifiers (5
/// labels) drawn after `torch.manual_seed(0)`: logits, losses and gradients as upstream's,
/// and the drawn heads equal to upstream's.
#[test]
fn tiny_encoder_families() -> Result<()> {
    let _g = lock();
    use tchtrain_models::AutoTask;
    let reference = assets().join("reference/models");
    let roberta_head = &[
        "classifier.dense.bias",
        "classifier.dense.weight",
        "classifier.out_proj.bias",
        "classifier.out_proj.weight",
    ][..];
    let distilbert_head = &[
        "classifier.bias",
        "classifier.weight",
        "pre_classifier.bias",
        "pre_classifier.weight",
    ][..];
    let deberta_head = &[
        "classifier.bias",
        "classifier.weight",
        "pooler.dense.bias",
        "pooler.dense.weight",
    ][..];
    for (fam, seq_head) in [
        ("roberta", roberta_head),
        ("xlmr", roberta_head),
        ("distilbert", distilbert_head),
        ("deberta", deberta_head),
    ] {
        let mlm = reference.join(format!("tiny_{fam}_mlm"));
        for (head, task, fresh_task, new_keys) in [
            ("mlm", AutoTask::MaskedLm, None, &[][..]),
            (
                "seqcls",
                AutoTask::SequenceClassification { num_labels: None },
                Some(AutoTask::SequenceClassification {
                    num_labels: Some(3),
                }),
                seq_head,
            ),
            (
                "tokcls",
                AutoTask::TokenClassification { num_labels: None },
                Some(AutoTask::TokenClassification {
                    num_labels: Some(5),
                }),
                &["classifier.bias", "classifier.weight"][..],
            ),
        ] {
            let case = format!("tiny_{fam}_{head}");
            let loaded = tchtrain_models::from_pretrained_dir(
                &reference.join(&case),
                task,
                Device::Cpu,
                &LoadOptions::default(),
            )?;
            assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
            let mut model = loaded.model;
            check(&case, &mut *model, "logits")?;
            if let Some(fresh_task) = fresh_task {
                tch::manual_seed(0);
                let fresh = tchtrain_models::from_pretrained_dir(
                    &mlm,
                    fresh_task,
                    Device::Cpu,
                    &LoadOptions::default(),
                )?;
                let mut missing = fresh.info.missing_keys.clone();
                missing.sort();
                assert_eq!(missing, new_keys, "{case}");
                for name in new_keys {
                    assert!(
                        fresh.model.var_store().variables()[*name]
                            .equal(&model.var_store().variables()[*name]),
                        "{case}: the new {name} differs from upstream's"
                    );
                }
            }
        }
    }
    // DeBERTa's other switches: the `lm_predictions` head, own position projections,
    // absolute positions, token types, clamped relative positions without buckets.
    let case = "tiny_deberta_variant_mlm";
    let loaded = tchtrain_models::from_pretrained_dir(
        &reference.join(case),
        AutoTask::MaskedLm,
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
    check(case, &mut *{ loaded.model }, "logits")?;
    Ok(())
}

/// Tiny ModernBERT (`models.py`, seeded; a global, a local over 4 tokens and a global layer;
/// row 1 padded): the masked LM, the same with `sparse_prediction`, a model with every bias
/// and mean pooling, and new sequence / token classifiers drawn after `torch.manual_seed(0)`
/// on the masked LM's checkpoint (the normal, then ModernBERT's truncated normal): logits,
/// losses and gradients as upstream's, and the drawn classifiers equal to upstream's.
#[test]
fn tiny_modernbert() -> Result<()> {
    let _g = lock();
    use tchtrain_models::AutoTask;
    let reference = assets().join("reference/models");
    let mlm = reference.join("tiny_modernbert_mlm");
    let seq = AutoTask::SequenceClassification { num_labels: None };
    for (case, task, fresh) in [
        ("tiny_modernbert_mlm", AutoTask::MaskedLm, None),
        ("tiny_modernbert_sparse_mlm", AutoTask::MaskedLm, None),
        ("tiny_modernbert_biased_seqcls", seq, None),
        (
            "tiny_modernbert_seqcls",
            seq,
            Some(AutoTask::SequenceClassification {
                num_labels: Some(3),
            }),
        ),
        (
            "tiny_modernbert_tokcls",
            AutoTask::TokenClassification { num_labels: None },
            Some(AutoTask::TokenClassification {
                num_labels: Some(5),
            }),
        ),
    ] {
        let loaded = tchtrain_models::from_pretrained_dir(
            &reference.join(case),
            task,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
        let mut model = loaded.model;
        check(case, &mut *model, "logits")?;
        if let Some(fresh_task) = fresh {
            tch::manual_seed(0);
            let fresh = tchtrain_models::from_pretrained_dir(
                &mlm,
                fresh_task,
                Device::Cpu,
                &LoadOptions::default(),
            )?;
            let mut missing = fresh.info.missing_keys.clone();
            missing.sort();
            assert_eq!(missing, ["classifier.bias", "classifier.weight"], "{case}");
            for name in ["classifier.weight", "classifier.bias"] {
                assert!(
                    fresh.model.var_store().variables()[name]
                        .equal(&model.var_store().variables()[name]),
                    "{case}: the new {name} differs from upstream's"
                );
            }
        }
    }
    Ok(())
}

/// transformers 5's `dtype="auto"` default: the tiny Qwen2 saved in bfloat16 loads in
/// bfloat16 (every parameter), and its logits, loss and gradients in bfloat16 equal
/// upstream's; `dtype=float32` loads it in float32.
#[test]
fn auto_dtype_loads_bfloat16_checkpoints_in_bfloat16() -> Result<()> {
    let _g = lock();
    let dir = assets().join("reference/models/tiny_qwen2_bf16");
    let task = tchtrain_models::AutoTask::CausalLm;
    let loaded =
        tchtrain_models::from_pretrained_dir(&dir, task, Device::Cpu, &LoadOptions::default())?;
    for (name, v) in loaded.model.var_store().variables() {
        assert_eq!(v.kind(), Kind::BFloat16, "{name}");
    }
    let mut model = loaded.model;
    check("tiny_qwen2_bf16", &mut *model, "logits")?;
    let options = LoadOptions {
        dtype: tchtrain_models::LoadDtype::parse("float32")?,
        ..LoadOptions::default()
    };
    let loaded = tchtrain_models::from_pretrained_dir(&dir, task, Device::Cpu, &options)?;
    for (name, v) in loaded.model.var_store().variables() {
        assert_eq!(v.kind(), Kind::Float, "{name}");
    }
    // Half-precision forwards of the eager attentions (DeBERTa's masked scores, Gemma 2's
    // additive mask) fill with the dtype's own minimum.
    let bf16 = LoadOptions {
        dtype: tchtrain_models::LoadDtype::parse("bfloat16")?,
        ..LoadOptions::default()
    };
    for (case, task) in [
        ("tiny_deberta_mlm", tchtrain_models::AutoTask::MaskedLm),
        ("tiny_gemma2_lm", tchtrain_models::AutoTask::CausalLm),
    ] {
        let r = reference(case)?;
        let m = tchtrain_models::from_pretrained_dir(
            &assets().join("reference/models").join(case),
            task,
            Device::Cpu,
            &bf16,
        )?
        .model;
        let out = tch::no_grad(|| {
            m.forward(&ModelInputs {
                input_ids: Some(&r["input_ids"]),
                attention_mask: Some(&r["attention_mask"]),
                ..Default::default()
            })
        })?;
        let logits = out.logits.context("logits")?;
        assert_eq!(logits.kind(), Kind::BFloat16, "{case}");
        let diff = max_abs(&logits, &r["logits"]);
        // bfloat16 keeps 8 bits of mantissa: logits of magnitude ~1 within a few 1e-2.
        assert!(diff < 0.1, "{case}: bfloat16 logits differ by {diff}");
    }
    let err = tchtrain_models::LoadDtype::parse("fp8")
        .unwrap_err()
        .to_string();
    assert!(err.contains("dtype") && err.contains("bfloat16"), "{err}");
    Ok(())
}

#[test]
fn real_smollm2_causal_lm() -> Result<()> {
    let _g = lock();
    let loaded = LlamaForCausalLM::from_pretrained_dir(
        &assets().join("smollm2-135m"),
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    assert!(loaded.info.is_clean(), "{}", loaded.info);
    check("smollm2", &mut { loaded.model }, "logits")?;
    Ok(())
}

/// Question answering on every family upstream gives it (`qa_outputs`, DistilBERT's dropout
/// before it, ModernBERT's prediction head and `classifier`), drawn after
/// `torch.manual_seed(0)` on each family's checkpoint (`models.py`): the `[batch, seq, 2]`
/// logits, the loss with one start past the end (ignored) and one negative end (clamped to
/// 0), the gradients, and the drawn heads equal to upstream's. Llama, Qwen2 and Qwen3 keep
/// their body under `transformer` (upstream's prefix): their heads are drawn on the base
/// model saved alone, and a causal LM's checkpoint (body under `model.`, which upstream
/// would silently draw anew) is refused.
#[test]
fn question_answering_heads() -> Result<()> {
    let _g = lock();
    use tchtrain_models::{AutoTask, Error};
    let reference = assets().join("reference/models");
    let qa = AutoTask::QuestionAnswering;
    let qa_outputs = &["qa_outputs.bias", "qa_outputs.weight"][..];
    for (case, src, head) in [
        ("tiny_gpt2_qa", assets().join("tiny-gpt2"), qa_outputs),
        ("tiny_bert_qa", assets().join("tiny-bert"), qa_outputs),
        (
            "tiny_roberta_qa",
            reference.join("tiny_roberta_mlm"),
            qa_outputs,
        ),
        ("tiny_xlmr_qa", reference.join("tiny_xlmr_mlm"), qa_outputs),
        (
            "tiny_distilbert_qa",
            reference.join("tiny_distilbert_mlm"),
            qa_outputs,
        ),
        (
            "tiny_deberta_qa",
            reference.join("tiny_deberta_mlm"),
            qa_outputs,
        ),
        (
            "tiny_modernbert_qa",
            reference.join("tiny_modernbert_mlm"),
            // The masked LM's `head` loads; only the classifier is new.
            &["classifier.bias", "classifier.weight"][..],
        ),
        (
            "tiny_mistral_qa",
            reference.join("tiny_mistral_lm"),
            qa_outputs,
        ),
        (
            "tiny_llama_qa",
            reference.join("tiny_llama_base"),
            qa_outputs,
        ),
        (
            "tiny_qwen2_qa",
            reference.join("tiny_qwen2_base"),
            qa_outputs,
        ),
        (
            "tiny_qwen3_qa",
            reference.join("tiny_qwen3_base"),
            qa_outputs,
        ),
    ] {
        let loaded = tchtrain_models::from_pretrained_dir(
            &reference.join(case),
            qa,
            Device::Cpu,
            &LoadOptions::default(),
        )?;
        assert!(loaded.info.is_clean(), "{case}: {}", loaded.info);
        let mut model = loaded.model;
        assert_eq!(
            model.label_names(),
            ["start_positions", "end_positions"],
            "{case}"
        );
        check(case, &mut *model, "logits")?;
        tch::manual_seed(0);
        let fresh =
            tchtrain_models::from_pretrained_dir(&src, qa, Device::Cpu, &LoadOptions::default())?;
        let mut missing = fresh.info.missing_keys.clone();
        missing.sort();
        assert_eq!(missing, head, "{case}");
        for name in head {
            assert!(
                fresh.model.var_store().variables()[*name]
                    .equal(&model.var_store().variables()[*name]),
                "{case}: the new {name} differs from upstream's"
            );
        }
    }
    // A causal LM's checkpoint under Qwen2's `transformer` body: refused, naming both prefixes.
    let err = tchtrain_models::from_pretrained_dir(
        &reference.join("tiny_qwen2_lm"),
        qa,
        Device::Cpu,
        &LoadOptions::default(),
    )
    .expect_err("a `model.` body under `transformer` must be refused");
    assert!(
        matches!(
            err,
            Error::BaseModelPrefix {
                class: "Qwen2ForQuestionAnswering",
                expected: "transformer",
                found: "model",
                ..
            }
        ),
        "{err}"
    );
    // Families upstream gives no question-answering head, and a head with 3 outputs.
    for dir in ["tiny_gemma2_lm", "tiny_phi3_lm"] {
        let err = tchtrain_models::from_pretrained_dir(
            &reference.join(dir),
            qa,
            Device::Cpu,
            &LoadOptions::default(),
        )
        .expect_err("no question answering upstream");
        assert!(err.to_string().contains("question answering"), "{err}");
    }
    let err = tchtrain_models::from_pretrained_dir(
        &reference.join("tiny_bert_seqcls"),
        qa,
        Device::Cpu,
        &LoadOptions::default(),
    )
    .expect_err("3 labels cannot split into start and end");
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "num_labels",
                ..
            }
        ),
        "{err}"
    );
    Ok(())
}
