//! `WhisperFeatureExtractor` against transformers 5.23 (`scripts/reference/whisper_features.py`):
//! the mel filter banks (slaney, and HTK without normalisation) within 1e-12 of `audio_utils
//! .mel_filter_bank`'s float64 values (numpy's exp / log round the last bit apart from glibc's)
//! and equal once cast to float32 (what the features use), and the log-mel `input_features`
//! of three clips (padded to 30 s, one cut to it) equal upstream's **to the bit**, batched and
//! alone.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use tch::Tensor;
use tchtrain_models::WhisperFeatureExtractor;
use tchtrain_models::audio_utils::{MelScale, mel_filter_bank};
use tchtrain_testing::{assets, lock};

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
