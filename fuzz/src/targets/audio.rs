//! `datasets`' `Audio` cells: `decode_audio` on any bytes (an error, never a panic), and for
//! a clip that decodes, finite samples in [-1, 1] for integer PCM, and for a short clip at
//! 16 kHz the Whisper log-mel features `[80, 3000]`, finite.

use tchtrain_models::{WhisperFeatureExtractor, WhisperFeatureExtractorConfig};

/// One input.
pub fn run(data: &[u8]) {
    let Ok(audio) = tchtrain_datasets::decode_audio(data, "fuzz input", None) else {
        return;
    };
    // A plain PCM WAV (format tag 1) or a FLAC stream: integer samples.
    let integer = data.get(20..22) == Some(&[1, 0]) || data.starts_with(b"fLaC");
    if integer {
        assert!(
            audio
                .array
                .iter()
                .all(|x| x.is_finite() && (-1.0..=1.0).contains(x)),
            "integer PCM scales into [-1, 1]"
        );
    }
    if audio.sampling_rate != 16000
        || audio.array.len() > 16000
        || audio.array.iter().any(|x| !x.is_finite())
    {
        return;
    }
    let extractor = WhisperFeatureExtractor::new(WhisperFeatureExtractorConfig::default())
        .expect("the extractor");
    let features = extractor
        .call(&[audio.array], 16000)
        .expect("a 16 kHz clip");
    assert_eq!(features.size(), [1, 80, 3000]);
    assert!(
        features.isfinite().all().int64_value(&[]) == 1,
        "finite features"
    );
}
