//! `datasets`' `Audio` feature: a cell `{"bytes": ..., "path": ...}` (or a path) decoded as
//! `datasets` 5.2 decodes it (torchcodec's `AudioDecoder`, FFmpeg underneath), and its
//! `["array"]`: the samples as float32 (integer PCM scaled as FFmpeg's sample-format
//! conversion does, `x · 2^-(bits-1)`, exact), the channels averaged as numpy's `mean` over
//! the first axis (summed in order, divided by the count, float32). WAV (PCM 8 / 16 / 24 / 32
//! bits, float 32 / 64) through `hound`, FLAC through `claxon`, both lossless, so the samples
//! equal FFmpeg's. Other formats (MP3, Ogg, ...) are refused naming the file: their decoders
//! round differently from FFmpeg's.
//!
//! `Audio(sampling_rate=...)` resamples through FFmpeg's `swresample` when the file's rate
//! differs; that resampler is not reproduced here, and such a file is refused with the rates
//! and the fix (resample the files to the target rate beforehand).

use std::path::Path;

use crate::error::{Error, Result};

/// A decoded clip: `datasets`' `{"array": ..., "sampling_rate": ...}`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedAudio {
    /// The samples (channels averaged), float32.
    pub array: Vec<f32>,
    /// Samples per second.
    pub sampling_rate: u32,
}

fn bad(what: &str, detail: impl Into<String>) -> Error {
    Error::Audio {
        what: what.to_string(),
        detail: detail.into(),
    }
}

/// numpy's `np.mean(y, axis=0)` of `[channels, samples]` float32 (interleaved here).
fn mean_channels(interleaved: &[f32], channels: usize) -> Vec<f32> {
    if channels == 1 {
        return interleaved.to_vec();
    }
    interleaved
        .chunks_exact(channels)
        .map(|frame| {
            let mut sum = frame[0];
            for x in &frame[1..] {
                sum += x;
            }
            sum / channels as f32
        })
        .collect()
}

/// An integer sample of `bits` bits as FFmpeg converts it to float.
fn int_to_f32(x: i32, bits: u32) -> f32 {
    // `bits` ≤ 32: 2^-(bits-1) is a power of two, so only the conversion of `x` rounds (and
    // only past 24 significant bits, as FFmpeg's).
    (x as f32) * (-((bits - 1) as f32)).exp2()
}

fn decode_wav(bytes: &[u8], what: &str) -> Result<(Vec<f32>, usize, u32)> {
    let reader = hound::WavReader::new(std::io::Cursor::new(bytes))
        .map_err(|e| bad(what, format!("not a readable WAV file: {e}")))?;
    let spec = reader.spec();
    let samples: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Int => {
            if !(8..=32).contains(&spec.bits_per_sample) {
                return Err(bad(what, format!("{}-bit PCM", spec.bits_per_sample)));
            }
            reader
                .into_samples::<i32>()
                .map(|s| s.map(|x| int_to_f32(x, u32::from(spec.bits_per_sample))))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| bad(what, e.to_string()))?
        }
        hound::SampleFormat::Float => reader
            .into_samples::<f32>()
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| bad(what, e.to_string()))?,
    };
    Ok((samples, usize::from(spec.channels), spec.sample_rate))
}

fn decode_flac(bytes: &[u8], what: &str) -> Result<(Vec<f32>, usize, u32)> {
    let mut reader = claxon::FlacReader::new(std::io::Cursor::new(bytes))
        .map_err(|e| bad(what, format!("not a readable FLAC file: {e}")))?;
    let info = reader.streaminfo();
    let samples = reader
        .samples()
        .map(|s| s.map(|x| int_to_f32(x, info.bits_per_sample)))
        .collect::<std::result::Result<Vec<f32>, _>>()
        .map_err(|e| bad(what, e.to_string()))?;
    Ok((samples, info.channels as usize, info.sample_rate))
}

/// Decodes an audio file's bytes (`what` names it in errors); with `sampling_rate` (the
/// feature's `Audio(sampling_rate=...)`), a file at another rate is refused.
pub fn decode_audio(bytes: &[u8], what: &str, sampling_rate: Option<u32>) -> Result<DecodedAudio> {
    let (samples, channels, rate) = if bytes.starts_with(b"RIFF")
        && bytes.get(8..12) == Some(b"WAVE")
    {
        decode_wav(bytes, what)?
    } else if bytes.starts_with(b"fLaC") {
        decode_flac(bytes, what)?
    } else {
        let kind = if bytes.starts_with(b"ID3") || bytes.starts_with(&[0xFF, 0xFB]) {
            "an MP3 file"
        } else if bytes.starts_with(b"OggS") {
            "an Ogg file"
        } else {
            "neither WAV nor FLAC"
        };
        return Err(bad(
            what,
            format!(
                "{kind}: only WAV and FLAC are decoded here (lossless, so the samples equal FFmpeg's); convert the files to WAV or FLAC"
            ),
        ));
    };
    if channels == 0 {
        return Err(bad(what, "no channels"));
    }
    if let Some(target) = sampling_rate.filter(|t| *t != rate) {
        return Err(bad(
            what,
            format!(
                "recorded at {rate} Hz, and the Audio feature asks for {target} Hz: datasets resamples through FFmpeg's swresample, which is not reproduced here; resample the files to {target} Hz beforehand (e.g. `sox in.wav -r {target} out.wav`)"
            ),
        ));
    }
    Ok(DecodedAudio {
        array: mean_channels(&samples, channels),
        sampling_rate: rate,
    })
}

/// An `Audio` cell as `datasets` decodes it (the embedded bytes, else the file at `path`,
/// relative to `base_dir` when not absolute; or a path), at `sampling_rate` when given.
pub fn audio_from_cell(
    cell: &serde_json::Value,
    base_dir: Option<&Path>,
    what: &str,
    sampling_rate: Option<u32>,
) -> Result<DecodedAudio> {
    match crate::media::cell_bytes(cell, base_dir, "Audio").map_err(|d| bad(what, d))? {
        crate::media::CellBytes::Bytes(bytes) => decode_audio(&bytes, what, sampling_rate),
        crate::media::CellBytes::Path(path) => {
            let bytes = std::fs::read(&path).map_err(|source| Error::Io {
                action: "reading",
                path: path.clone(),
                source,
            })?;
            decode_audio(&bytes, &path.display().to_string(), sampling_rate)
        }
    }
}
