"""Reference for `datasets`' Audio column (models/tests/it/audio.rs): the speech asset's
Parquet file read with `load_dataset("parquet")`, cast to `Audio(sampling_rate=16000)` and
decoded by datasets 5.2 (torchcodec over FFmpeg), and the Whisper log-mel features of the
decoded clips.

Usage: python speech.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/decoded.safetensors: `array.<i>` (float32) for each of the 12 rows of speech.parquet
(16-bit mono WAV, FLAC, stereo WAV, 24-bit WAV), `float` the float32 WAV `11.float.wav` decoded
the same way (`datasets.features._torchcodec.AudioDecoder(path, sample_rate=16000)["array"]`),
and `input_features` of rows 0-3 through `WhisperFeatureExtractor()` (padded to 30 s).
"""

import os
import sys
from pathlib import Path

import torch

import transformers as tf
from datasets import Audio, load_dataset
from datasets.features._torchcodec import AudioDecoder
from safetensors.torch import save_file

OUT = Path(sys.argv[1])
SPEECH = Path(os.environ["TCHTRAIN_ASSETS"]) / "speech"


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    ds = load_dataset("parquet", data_files=str(SPEECH / "speech.parquet"))["train"]
    ds = ds.cast_column("audio", Audio(sampling_rate=16000))
    out = {}
    arrays = []
    for i, row in enumerate(ds):
        assert row["audio"]["sampling_rate"] == 16000
        arrays.append(row["audio"]["array"])
        out[f"array.{i}"] = torch.from_numpy(arrays[-1].copy())
    out["float"] = torch.from_numpy(AudioDecoder(str(SPEECH / "11.float.wav"), sample_rate=16000)["array"].copy())
    features = tf.WhisperFeatureExtractor()(arrays[:4], sampling_rate=16000, return_tensors="pt")
    out["input_features"] = features["input_features"]
    save_file(out, OUT / "decoded.safetensors")


if __name__ == "__main__":
    main()
