//! transformers 5.23's `WhisperFeatureExtractor` on its torch path (what it runs when torch
//! is installed): each clip padded with `padding_value` (or cut) to `chunk_length` seconds,
//! a centred `torch.stft` (reflect padding, a periodic Hann window of `n_fft`, hop
//! `hop_length`), the power of every frame but the last, the slaney mel filters
//! ([`crate::audio_utils::mel_filter_bank`], float64 cast to float32), `log10` clamped at
//! 1e-10, floored at each clip's maximum minus 8, then `(x + 4) / 4` — libtorch's own ops in
//! upstream's order, so the features are upstream's.
//!
//! ```no_run
//! use tchtrain_models::WhisperFeatureExtractor;
//! let extractor = WhisperFeatureExtractor::from_pretrained("assets/whisper-tiny".as_ref())?;
//! let clip: Vec<f32> = vec![0.0; 16000]; // one second at 16 kHz
//! let features = extractor.call(&[clip], 16000)?; // [1, 80, 3000] float32
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use crate::audio_utils::{MelScale, mel_filter_bank};
use crate::{Error, Result};

/// The fields of the extractor's `preprocessor_config.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct WhisperFeatureExtractorConfig {
    /// `feature_size` (80 mel bins; 128 for large-v3).
    pub feature_size: usize,
    /// `sampling_rate` (16 kHz).
    pub sampling_rate: usize,
    /// `hop_length` (160).
    pub hop_length: usize,
    /// `chunk_length` (30 s).
    pub chunk_length: usize,
    /// `n_fft` (400).
    pub n_fft: usize,
    /// `padding_value` (0.0).
    pub padding_value: f64,
    /// `dither` (refused unless 0: upstream draws Gaussian noise).
    pub dither: f64,
    /// `return_attention_mask` (refused when true).
    pub return_attention_mask: bool,
    /// Every other key: `n_samples` / `nb_max_frames` checked against the values they derive
    /// from, `padding_side` `"right"`, the class names; anything else refused.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Default for WhisperFeatureExtractorConfig {
    fn default() -> Self {
        Self {
            feature_size: 80,
            sampling_rate: 16000,
            hop_length: 160,
            chunk_length: 30,
            n_fft: 400,
            padding_value: 0.0,
            dither: 0.0,
            return_attention_mask: false,
            extra: serde_json::Map::new(),
        }
    }
}

/// Upstream's `WhisperFeatureExtractor`.
#[derive(Debug)]
pub struct WhisperFeatureExtractor {
    /// Its configuration.
    pub config: WhisperFeatureExtractorConfig,
    /// `mel_filters` `[1 + n_fft / 2, feature_size]` (float64, as upstream keeps them).
    pub mel_filters: Tensor,
}

impl WhisperFeatureExtractor {
    /// An extractor of `config` (its mel filters computed as upstream's `__init__`).
    pub fn new(config: WhisperFeatureExtractorConfig) -> Result<Self> {
        let refuse = |field: &'static str, value: String, fix: &'static str| Error::InvalidConfig {
            field,
            value,
            fix,
        };
        if config.dither != 0.0 {
            return Err(refuse(
                "dither",
                config.dither.to_string(),
                "dithering (Gaussian noise added to the waveform) is not implemented here; set it to 0.0",
            ));
        }
        if config.return_attention_mask {
            return Err(refuse(
                "return_attention_mask",
                "true".into(),
                "the features' attention mask is not implemented here; Whisper reads 30-second windows without one",
            ));
        }
        if config.n_fft < 2 || config.hop_length == 0 || config.feature_size == 0 {
            return Err(refuse(
                "n_fft",
                format!(
                    "n_fft {}, hop_length {}, feature_size {}",
                    config.n_fft, config.hop_length, config.feature_size
                ),
                "give n_fft >= 2, hop_length >= 1 and feature_size >= 1",
            ));
        }
        let n_samples = (config.chunk_length * config.sampling_rate) as u64;
        for (key, value) in &config.extra {
            let fine = match key.as_str() {
                "feature_extractor_type" | "processor_class" => true,
                "padding_side" => value.as_str() == Some("right"),
                "n_samples" => value.as_u64() == Some(n_samples),
                "nb_max_frames" => value.as_u64() == Some(n_samples / config.hop_length as u64),
                _ => false,
            };
            if !fine {
                return Err(refuse(
                    "preprocessor_config.json",
                    format!("{key}: {value}"),
                    "not implemented here (or inconsistent with chunk_length, sampling_rate and hop_length); remove it",
                ));
            }
        }
        let bins = 1 + config.n_fft / 2;
        let filters = mel_filter_bank(
            bins,
            config.feature_size,
            0.0,
            8000.0,
            config.sampling_rate,
            true,
            MelScale::Slaney,
        )?;
        let mel_filters =
            Tensor::from_slice(&filters).f_reshape([bins as i64, config.feature_size as i64])?;
        Ok(Self {
            config,
            mel_filters,
        })
    }

    /// `WhisperFeatureExtractor.from_pretrained(dir)`: `preprocessor_config.json`.
    pub fn from_pretrained(dir: &Path) -> Result<Self> {
        let config: WhisperFeatureExtractorConfig =
            crate::configuration_utils::read_config(&dir.join(crate::IMAGE_PROCESSOR_NAME))?;
        Self::new(config)
    }

    /// Samples per window (`n_samples`: `chunk_length × sampling_rate`).
    pub fn n_samples(&self) -> usize {
        self.config.chunk_length * self.config.sampling_rate
    }

    /// `extractor(clips, sampling_rate=..., return_tensors="pt")["input_features"]`:
    /// `[clips, feature_size, n_samples / hop_length]` float32. A `sampling_rate` other than
    /// the extractor's is refused with upstream's message.
    pub fn call(&self, clips: &[Vec<f32>], sampling_rate: usize) -> Result<Tensor> {
        let c = &self.config;
        if sampling_rate != c.sampling_rate {
            return Err(Error::InvalidInput {
                name: "sampling_rate",
                detail: format!(
                    "The model corresponding to this feature extractor: WhisperFeatureExtractor was trained using a sampling rate of {}. Please make sure that the provided `raw_speech` input was sampled with {} and not {sampling_rate}. (upstream's message)",
                    c.sampling_rate, c.sampling_rate
                ),
            });
        }
        if clips.is_empty() {
            return Err(Error::InvalidInput {
                name: "raw_speech",
                detail: "no clip given".into(),
            });
        }
        // `pad(padding="max_length", max_length=n_samples, truncation=True)`.
        let n = self.n_samples();
        let mut flat = Vec::with_capacity(clips.len() * n);
        for clip in clips {
            let take = clip.len().min(n);
            flat.extend_from_slice(&clip[..take]);
            flat.extend(std::iter::repeat_n(c.padding_value as f32, n - take));
        }
        let waveform = Tensor::from_slice(&flat).f_reshape([clips.len() as i64, n as i64])?;
        self.extract_fbank_features(&waveform)
    }

    /// `_torch_extract_fbank_features` of a `[batch, samples]` float32 waveform.
    pub fn extract_fbank_features(&self, waveform: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let n_fft = c.n_fft as i64;
        let window = Tensor::f_hann_window(n_fft, (Kind::Float, Device::Cpu))?;
        // torch.stft(center=True, pad_mode="reflect"): the input viewed as [1, batch,
        // samples], reflect-padded by n_fft // 2 on both sides, viewed back.
        let size = waveform.size();
        let pad = n_fft / 2;
        let padded = waveform
            .f_view([1, size[0], size[1]])?
            .f_reflection_pad1d([pad, pad])?;
        let padded = padded.f_view([size[0], -1])?;
        let stft = padded.f_stft(
            n_fft,
            c.hop_length as i64,
            None::<i64>,
            Some(&window),
            false,
            true,
            true,
            false,
        )?;
        let frames = stft.size()[2];
        let magnitudes = stft
            .f_narrow(2, 0, frames - 1)?
            .f_abs()?
            .f_pow_tensor_scalar(2)?
            .f_contiguous()?;
        let mel_filters = self.mel_filters.f_to_kind(Kind::Float)?;
        let mel_spec = mel_filters.f_tr()?.f_matmul(&magnitudes)?;
        let log_spec = mel_spec.f_clamp_min(1e-10)?.f_log10()?;
        let max_val = log_spec.f_amax(&[2][..], true)?.f_amax(&[1][..], true)?;
        let log_spec = log_spec.f_maximum(&max_val.f_sub_scalar(8.0)?)?;
        Ok(log_spec.f_add_scalar(4.0)?.f_div_scalar(4.0)?)
    }
}
