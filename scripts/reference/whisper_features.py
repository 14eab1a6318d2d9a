"""Reference for WhisperFeatureExtractor (models/tests/it/audio.rs): transformers 5.23's
`WhisperFeatureExtractor` (its torch path, what it runs when torch is installed) and
`audio_utils.mel_filter_bank`.

Usage: python whisper_features.py OUT_DIR

OUT_DIR/features.safetensors:
  mel_filters          the default extractor's filters (float64 [201, 80]: 80 slaney mels, 0-8 kHz)
  mel_filters_htk      `mel_filter_bank(257, 40, 20.0, 7600.0, 16000, norm=None, mel_scale="htk")`
  wave.{i}             three clips at 16 kHz (float32): a chirp with noise of 1.5 s, a chord of
                       2 s, a noisy tone of 31 s (truncated to 30 s by the extractor)
  input_features       `extractor(waves, sampling_rate=16000, return_tensors="pt")`
                       (float32 [3, 80, 3000])
  input_features.0     the first clip alone
OUT_DIR/preprocessor_config.json: the extractor's configuration.
"""

import sys
from pathlib import Path

import numpy as np
import torch

import transformers as tf
from safetensors.torch import save_file
from transformers.audio_utils import mel_filter_bank

OUT = Path(sys.argv[1])
torch.set_num_threads(2)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    extractor = tf.WhisperFeatureExtractor()
    extractor.save_pretrained(OUT)
    rs = np.random.RandomState(0)
    sr = 16000
    t1 = np.arange(int(1.5 * sr)) / sr
    chirp = np.sin(2 * np.pi * (200 + 900 * t1) * t1) + 0.05 * rs.normal(size=t1.shape)
    t2 = np.arange(2 * sr) / sr
    chord = sum(np.sin(2 * np.pi * f * t2) for f in (261.6, 329.6, 392.0)) / 3
    t3 = np.arange(31 * sr) / sr
    tone = 0.3 * np.sin(2 * np.pi * 440 * t3) + 0.1 * rs.normal(size=t3.shape)
    waves = [w.astype(np.float32) for w in (chirp, chord, tone)]
    features = extractor(waves, sampling_rate=sr, return_tensors="pt")["input_features"]
    single = extractor(waves[0], sampling_rate=sr, return_tensors="pt")["input_features"]
    tensors = {
        "mel_filters": torch.from_numpy(extractor.mel_filters.copy()),
        "mel_filters_htk": torch.from_numpy(
            mel_filter_bank(257, 40, 20.0, 7600.0, 16000, norm=None, mel_scale="htk").copy()
        ),
        "input_features": features.contiguous(),
        "input_features.0": single.contiguous(),
    }
    for i, w in enumerate(waves):
        tensors[f"wave.{i}"] = torch.from_numpy(w)
    save_file(tensors, OUT / "features.safetensors")
    print(features.shape, float(features.mean()))


if __name__ == "__main__":
    main()
