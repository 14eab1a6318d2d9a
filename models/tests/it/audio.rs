//! Whisper against transformers 5.23 (`scripts/reference/whisper.py`): the tiny
//! `WhisperForConditionalGeneration`'s logits, loss, encoder output and every gradient **to the
//! bit** (evaluation mode; the encoder's sinusoidal positions included: loading leaves them
//! trainable, as upstream's),
//! its saved files equal upstream's, and `generate` equal to upstream's ids on each case (the
//! language given by code, name or token, detected per row, the legacy `forced_decoder_ids`,
//! beam search with a task, `max_new_tokens`, a clip shorter than 30 s padded).
//!
//! `WhisperFeatureExtractor` against transformers 5.23 (`scripts/reference/whisper_features.py`):
//! the mel filter banks (slaney, and HTK without normalisation) within 1e-12 of `audio_utils
//! .mel_filter_bank`'s float64 values (numpy's exp / log round the last bit apart from glibc's)
//! and equal once cast to float32 (what the features use), and the log-mel `input_features`
//! of three clips (padded to 30 s, one cut to it) equal upstream's **to the bit**, batched and
//! alone.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use tch::{Device, Tensor};
use tchtrain_models::audio_utils::{MelScale, mel_filter_bank};
use tchtrain_models::{
    AutoTask, GenerationConfig, LoadOptions, ModelInputs, PreTrainedModel, WhisperFeatureExtractor,
    from_pretrained_dir,
};
use tchtrain_testing::{assets, lock, temp_dir};

fn dir() -> std::path::PathBuf {
    assets().join("reference/whisper_features")
}

#[test]
fn whisper_features_equal_transformers() -> Result<()> {
    let _g = lock();
    let path = dir().join("features.safetensors");
    let r: HashMap<String, Tensor> = Tensor::read_safetensors(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?
        .into_iter()
        .collect();
    let extractor = WhisperFeatureExtractor::from_pretrained(&dir())?;
    let diff = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
    // The float64 filters: numpy's exp / log (its own SIMD loops) and glibc's can round an
    // edge frequency's last bit apart (≈1e-12 Hz at 8 kHz), which moves a slope over a band
    // of ≈100 Hz by ≈1e-14 of its value: within 1e-12 of the largest filter value; the
    // float32 filters the features use: equal.
    for (ours, key) in [
        (extractor.mel_filters.shallow_clone(), "mel_filters"),
        (
            Tensor::from_slice(&mel_filter_bank(
                257,
                40,
                20.0,
                7600.0,
                16000,
                false,
                MelScale::Htk,
            )?)
            .reshape([257, 40]),
            "mel_filters_htk",
        ),
    ] {
        let theirs = &r[key];
        let bound = theirs.abs().max().double_value(&[]) * 1e-12;
        let d = diff(&ours, theirs);
        ensure!(
            d <= bound,
            "{key}: float64 filters differ by {d:e} > {bound:e}"
        );
        ensure!(
            ours.to_kind(tch::Kind::Float)
                .equal(&theirs.to_kind(tch::Kind::Float)),
            "{key}: the float32 filters differ"
        );
        eprintln!("{key}: float64 max abs difference {d:e}, float32 equal");
    }
    let waves = (0..3)
        .map(|i| Vec::<f32>::try_from(&r[&format!("wave.{i}")]))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let features = extractor.call(&waves, 16000)?;
    ensure!(
        features.equal(&r["input_features"]),
        "features differ by {}",
        diff(&features, &r["input_features"])
    );
    let single = extractor.call(&waves[..1], 16000)?;
    ensure!(
        single.equal(&r["input_features.0"]),
        "the first clip alone differs"
    );
    // The saved file's derived keys read; a left padding side is refused, naming it.
    let mut config = extractor.config.clone();
    config
        .extra
        .insert("padding_side".into(), serde_json::json!("left"));
    let refused = WhisperFeatureExtractor::new(config)
        .err()
        .context("left padding")?;
    ensure!(refused.to_string().contains("padding_side"), "{refused}");
    let err = extractor.call(&waves, 8000).err().context("8 kHz")?;
    ensure!(err.to_string().contains("sampling rate of 16000"), "{err}");
    Ok(())
}

fn whisper_dir() -> std::path::PathBuf {
    assets().join("reference/whisper")
}

use crate::vision::tensors;

fn load_whisper() -> Result<Box<dyn PreTrainedModel>> {
    let loaded = from_pretrained_dir(
        &whisper_dir().join("model"),
        AutoTask::SpeechSeq2Seq,
        Device::Cpu,
        &LoadOptions::default(),
    )?;
    ensure!(
        loaded.info.missing_keys.is_empty() && loaded.info.unexpected_keys.is_empty(),
        "{:?}",
        loaded.info
    );
    Ok(loaded.model)
}

#[test]
fn whisper_forward_and_gradients_equal_transformers() -> Result<()> {
    let _g = lock();
    let mut model = load_whisper()?;
    ensure!(model.architecture() == "WhisperForConditionalGeneration");
    ensure!(model.main_input_name() == "input_features");
    let r = tensors(&whisper_dir().join("forward.safetensors"))?;
    model.eval();
    let out = model.forward(&ModelInputs {
        input_features: Some(&r["input_features"]),
        labels: Some(&r["labels"]),
        ..ModelInputs::default()
    })?;
    let logits = out.logits.context("logits")?;
    ensure!(
        logits.equal(&r["logits"]),
        "logits differ by {}",
        (&logits - &r["logits"]).abs().max()
    );
    let loss = out.loss.context("loss")?;
    ensure!(
        loss.reshape([1]).equal(&r["loss"].reshape([1])),
        "loss {loss} vs {}",
        r["loss"]
    );
    let encoder = model.encode(&r["input_features"], None)?;
    ensure!(
        encoder.equal(&r["encoder_last_hidden_state"]),
        "encoder differs by {}",
        (&encoder - &r["encoder_last_hidden_state"]).abs().max()
    );
    loss.backward();
    crate::vision::gradients_equal("whisper", &model.var_store().variables(), &r)?;
    // Saved: the same tensors and a generation config with Whisper's fields.
    let out_dir = temp_dir("whisper-save");
    model.save_pretrained(&out_dir)?;
    crate::vision::saved_equal("whisper", &out_dir, &whisper_dir().join("model"))?;
    let generation: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        out_dir.join("generation_config.json"),
    )?)?;
    ensure!(
        generation["lang_to_id"]["<|fr|>"] == 102
            && generation["suppress_tokens"] == serde_json::json!([7, 8]),
        "{generation}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
    Ok(())
}

#[test]
fn whisper_generate_equals_transformers() -> Result<()> {
    let _g = lock();
    let mut model = load_whisper()?;
    model.eval();
    let r = tensors(&whisper_dir().join("forward.safetensors"))?;
    let expected = tensors(&whisper_dir().join("generate.safetensors"))?;
    let base =
        GenerationConfig::from_json(model.generation_config().context("generation config")?)?;
    let features = &r["input_features"];
    let cases: [(&str, serde_json::Value, Option<i64>); 6] = [
        (
            "en_transcribe",
            serde_json::json!({"language": "en", "task": "transcribe"}),
            None,
        ),
        ("detect", serde_json::json!({}), None),
        (
            "fr_translate_beams",
            serde_json::json!({"language": "french", "task": "translate", "num_beams": 3}),
            None,
        ),
        (
            "max_new_5",
            serde_json::json!({"language": "<|en|>", "max_new_tokens": 5}),
            None,
        ),
        (
            "forced",
            serde_json::json!({"forced_decoder_ids": [[1, null], [2, 104]]}),
            None,
        ),
        ("short", serde_json::json!({"language": "en"}), Some(45)),
    ];
    for (name, kwargs, frames) in cases {
        let mut config = base.clone();
        config.update(&GenerationConfig::from_json(&kwargs)?);
        let input = match frames {
            Some(n) => features.narrow(2, 0, n),
            None => features.shallow_clone(),
        };
        let ids = model
            .own_generate(
                &ModelInputs {
                    input_features: Some(&input),
                    ..ModelInputs::default()
                },
                &config,
            )
            .context("Whisper generates by its own generate")??;
        ensure!(
            ids.size() == expected[name].size() && ids.equal(&expected[name]),
            "{name}: {ids:?} vs {:?}",
            expected[name]
        );
    }
    // Refused, naming the option.
    for (kwargs, field) in [
        (
            serde_json::json!({"language": "xx"}),
            "Unsupported language: xx",
        ),
        (
            serde_json::json!({"task": "Transcribe"}),
            "The `Transcribe` task is not supported",
        ),
        (
            serde_json::json!({"return_timestamps": true}),
            "return_timestamps",
        ),
        (
            serde_json::json!({"language": "en", "max_new_tokens": 37}),
            "exceeds the `max_target_positions`",
        ),
    ] {
        let mut config = base.clone();
        config.update(&GenerationConfig::from_json(&kwargs)?);
        let err = model
            .own_generate(
                &ModelInputs {
                    input_features: Some(features),
                    ..ModelInputs::default()
                },
                &config,
            )
            .context("own generate")?
            .err()
            .with_context(|| format!("{kwargs} accepted"))?;
        ensure!(err.to_string().contains(field), "{kwargs}: {err}");
    }
    Ok(())
}

/// `datasets`' Audio column from the speech asset's Parquet file (16-bit mono WAV, FLAC, a
/// stereo WAV averaged, a 24-bit WAV, a float WAV): each clip's array equals what datasets 5.2
/// decodes through torchcodec / FFmpeg **to the bit**, and the Whisper features of the decoded
/// clips equal transformers'. A clip at another rate than the feature's, and a format
/// neither WAV nor FLAC, are refused naming the clip and the fix.
#[test]
fn audio_column_decodes_as_datasets() -> Result<()> {
    let _g = lock();
    let speech = assets().join("speech");
    let r = tensors(&assets().join("reference/speech/decoded.safetensors"))?;
    let table = tchtrain_datasets::Table::read(speech.join("speech.parquet"))?;
    ensure!(table.len() == 12, "{} rows", table.len());
    let mut arrays = Vec::new();
    for i in 0..table.len() {
        let cell = table.cell(i, "audio")?;
        let audio =
            tchtrain_datasets::audio_from_cell(cell, None, &format!("row {i}"), Some(16000))?;
        ensure!(audio.sampling_rate == 16000);
        let theirs = Vec::<f32>::try_from(&r[&format!("array.{i}")])?;
        ensure!(
            audio.array.len() == theirs.len()
                && audio
                    .array
                    .iter()
                    .zip(&theirs)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {i}: {} samples vs {}",
            audio.array.len(),
            theirs.len()
        );
        arrays.push(audio.array);
    }
    let float = tchtrain_datasets::audio_from_cell(
        &serde_json::json!("11.float.wav"),
        Some(&speech),
        "float clip",
        Some(16000),
    )?;
    ensure!(
        float.array == Vec::<f32>::try_from(&r["float"])?,
        "the float WAV differs"
    );
    let extractor = WhisperFeatureExtractor::from_pretrained(&dir())?;
    let features = extractor.call(&arrays[..4], 16000)?;
    ensure!(
        features.equal(&r["input_features"]),
        "features differ by {}",
        (&features - &r["input_features"]).abs().max()
    );
    // Another rate than the feature's is refused (FFmpeg's resampler is not reproduced).
    let mut wav = std::io::Cursor::new(Vec::new());
    {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 8000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::new(&mut wav, spec)?;
        for x in [0i16, 100, -100] {
            w.write_sample(x)?;
        }
        w.finalize()?;
    }
    let err = tchtrain_datasets::decode_audio(wav.get_ref(), "row 3", Some(16000))
        .err()
        .context("an 8 kHz clip")?;
    ensure!(
        err.to_string().contains("8000 Hz") && err.to_string().contains("row 3"),
        "{err}"
    );
    let at_rate = tchtrain_datasets::decode_audio(wav.get_ref(), "row 3", None)?;
    ensure!(at_rate.array == [0.0, 100.0 / 32768.0, -100.0 / 32768.0]);
    let err = tchtrain_datasets::decode_audio(b"ID3\x04rest", "row 4", None)
        .err()
        .context("an MP3 clip")?;
    ensure!(
        err.to_string().contains("MP3") && err.to_string().contains("row 4"),
        "{err}"
    );
    Ok(())
}

/// The Whisper tokenizer of the tiny-whisper asset against transformers 5.23's
/// (`scripts/reference/whisper_tokenizer.py`): the speech sentences' ids under each prefix
/// setting (`set_prefix_tokens` with a language by code or name, a task, timestamps), and
/// `decode` with and without `skip_special_tokens` (a `<|startofprev|>` prompt stripped,
/// timestamp tokens removed from the text).
#[test]
fn whisper_tokenizer_equals_transformers() -> Result<()> {
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        assets().join("reference/whisper_tokenizer/tokenizer.json"),
    )?)?;
    let sentences = std::fs::read_to_string(assets().join("speech/sentences.txt"))?;
    let base = tchtrain_models::AutoTokenizer::from_pretrained(assets().join("tiny-whisper"))?;
    ensure!(base.is_whisper());
    for case in r["encode"].as_array().context("encode")? {
        let s = &case["setting"];
        let mut tok = base.clone();
        tok.set_prefix_tokens(s[0].as_str(), s[1].as_str(), s[2].as_bool())?;
        for (line, expected) in sentences
            .lines()
            .zip(case["ids"].as_array().context("ids")?)
        {
            let ids = tok.encode(line, true)?;
            let expected: Vec<i64> = serde_json::from_value(expected.clone())?;
            ensure!(ids == expected, "{s}: {line}: {ids:?} vs {expected:?}");
        }
    }
    for case in r["decode"].as_array().context("decode")? {
        let ids: Vec<i64> = serde_json::from_value(case["ids"].clone())?;
        let skip = case["skip"].as_bool().context("skip")?;
        let text = base.decode(&ids, skip, None)?;
        ensure!(
            text == case["text"].as_str().context("text")?,
            "{ids:?} {skip}: {text:?} vs {}",
            case["text"]
        );
    }
    let err = base
        .clone()
        .set_prefix_tokens(Some("klingon"), None, None)
        .err()
        .context("an unknown language")?;
    ensure!(
        err.to_string().contains("Unsupported language: klingon"),
        "{err}"
    );
    Ok(())
}
