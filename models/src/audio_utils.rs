//! transformers' `audio_utils.py`: the mel scales and `mel_filter_bank`, in float64 with
//! numpy's operations in numpy's order (`np.linspace`'s `arange · step + start` with the last
//! point set to `stop`, the triangles' slopes, the slaney normalisation), so that the filters
//! equal upstream's.

use crate::{Error, Result};

/// A mel scale (`mel_scale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MelScale {
    /// `"htk"`: `2595 · log10(1 + f / 700)`.
    Htk,
    /// `"kaldi"`: `1127 · ln(1 + f / 700)`.
    Kaldi,
    /// `"slaney"`: linear below 1 kHz, logarithmic above (librosa's default).
    Slaney,
}

/// `hertz_to_mel(freq, mel_scale)`.
pub fn hertz_to_mel(freq: f64, scale: MelScale) -> f64 {
    match scale {
        MelScale::Htk => 2595.0 * (1.0 + freq / 700.0).log10(),
        MelScale::Kaldi => 1127.0 * (1.0 + freq / 700.0).ln(),
        MelScale::Slaney => {
            let (min_log_hertz, min_log_mel) = (1000.0, 15.0);
            let logstep = 27.0 / 6.4f64.ln();
            if freq >= min_log_hertz {
                min_log_mel + (freq / min_log_hertz).ln() * logstep
            } else {
                3.0 * freq / 200.0
            }
        }
    }
}

/// `mel_to_hertz(mels, mel_scale)`.
pub fn mel_to_hertz(mels: f64, scale: MelScale) -> f64 {
    match scale {
        MelScale::Htk => 700.0 * (10f64.powf(mels / 2595.0) - 1.0),
        MelScale::Kaldi => 700.0 * ((mels / 1127.0).exp() - 1.0),
        MelScale::Slaney => {
            let (min_log_hertz, min_log_mel) = (1000.0, 15.0);
            let logstep = 6.4f64.ln() / 27.0;
            if mels >= min_log_mel {
                min_log_hertz * (logstep * (mels - min_log_mel)).exp()
            } else {
                200.0 * mels / 3.0
            }
        }
    }
}

/// `np.linspace(start, stop, num)` (endpoint included).
pub fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 0 {
        return vec![];
    }
    let div = (num - 1).max(1) as f64;
    let step = (stop - start) / div;
    let mut y: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if num > 1 {
        y[num - 1] = stop;
    }
    y
}

/// `mel_filter_bank(num_frequency_bins, num_mel_filters, min_frequency, max_frequency,
/// sampling_rate, norm, mel_scale)` (filters triangular in frequency space): `[bins][mels]`
/// row-major, float64.
pub fn mel_filter_bank(
    num_frequency_bins: usize,
    num_mel_filters: usize,
    min_frequency: f64,
    max_frequency: f64,
    sampling_rate: usize,
    slaney_norm: bool,
    scale: MelScale,
) -> Result<Vec<f64>> {
    if num_frequency_bins < 2 {
        return Err(Error::InvalidConfig {
            field: "num_frequency_bins",
            value: num_frequency_bins.to_string(),
            fix: "Require num_frequency_bins >= 2 (upstream's check)",
        });
    }
    if min_frequency > max_frequency {
        return Err(Error::InvalidConfig {
            field: "min_frequency",
            value: format!("{min_frequency} > {max_frequency}"),
            fix: "Require min_frequency <= max_frequency (upstream's check)",
        });
    }
    let mel_min = hertz_to_mel(min_frequency, scale);
    let mel_max = hertz_to_mel(max_frequency, scale);
    let filter_freqs: Vec<f64> = linspace(mel_min, mel_max, num_mel_filters + 2)
        .into_iter()
        .map(|m| mel_to_hertz(m, scale))
        .collect();
    let fft_freqs = linspace(0.0, (sampling_rate / 2) as f64, num_frequency_bins);
    // _create_triangular_filter_bank.
    let filter_diff: Vec<f64> = filter_freqs.windows(2).map(|w| w[1] - w[0]).collect();
    let mut out = vec![0f64; num_frequency_bins * num_mel_filters];
    for (b, &fft) in fft_freqs.iter().enumerate() {
        for m in 0..num_mel_filters {
            let down = -(filter_freqs[m] - fft) / filter_diff[m];
            let up = (filter_freqs[m + 2] - fft) / filter_diff[m + 1];
            out[b * num_mel_filters + m] = 0f64.max(down.min(up));
        }
    }
    if slaney_norm {
        for m in 0..num_mel_filters {
            let enorm = 2.0 / (filter_freqs[m + 2] - filter_freqs[m]);
            for b in 0..num_frequency_bins {
                out[b * num_mel_filters + m] *= enorm;
            }
        }
    }
    Ok(out)
}
