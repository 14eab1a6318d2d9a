"""Data for `cargo xtask e2e`: every file both sides of the parity cases read.

Usage: python prepare_data.py WORK_DIR   (TCHTRAIN_ASSETS names the assets folder)

Writes into WORK_DIR/data/ (pyarrow for the Parquet files, one row group each):

  gpt2-tokenizer/        the GPT-2 BPE of assets/gpt2-tokenizer (vocab.json + merges.txt) saved
                         by transformers as a full tokenizer folder (tokenizer.json,
                         tokenizer_config.json), so that `AutoTokenizer.from_pretrained` loads it
                         as it loads a hub checkpoint's tokenizer
  hamlet.parquet         hamlet.txt, one row per line (line breaks dropped), column "text"
  hamlet-repo/data/      hamlet.txt laid out as a hub dataset repository: the first 10 % of the
                         lines in validation-00000-of-00001.parquet, the rest in
                         train-00000-of-00001.parquet (column "text")
  rotten-tomatoes/       train.parquet, validation.parquet and test.parquet, columns
                         sentence,label: the corpus's fresh and rotten reviews (the plot
                         synopses dropped), the two labels alternating; N_TRAIN rows for
                         training, the next N_VALID for validation, the next N_TEST for
                         prediction; column score is the label as a float (fresh 1.0,
                         rotten 0.0) for the regression case
  tiny-llama-chat/        a tiny Llama causal LM (2 layers, hidden 64, 4 heads over 2, untied head)
                         at SmolLM2-135M's vocabulary, drawn after `torch.manual_seed(0)`, with
                         SmolLM2's tokenizer files beside it: the model TRL's scripts load
  tiny-llama-reward/     the same shape as a one-label sequence classifier, drawn after
                         `torch.manual_seed(1)`, with the same tokenizer files: `trl grpo`'s
                         reward model
  trl-messages/          train.jsonl / test.jsonl: `messages` (a user line of hamlet.txt and the
                         assistant's next line), 40 and 8 rows, for `trl sft`
  trl-pairs/             train.jsonl / test.jsonl: explicit-prompt preference pairs (`prompt` a
                         line, `chosen` " " + the next, `rejected` " " + a line further on), 40
                         and 8 rows, for `trl dpo` and `trl reward`
  trl-prompts/           train.jsonl / test.jsonl: `prompt` (a user message: a line's first 40
                         characters), 16 and 8 rows, for `trl grpo`
  speech-repo/data/      the speech asset as a hub dataset repository: clips 0-7 in
                         train-00000-of-00001.parquet, 8-11 in test-00000-of-00001.parquet
                         (columns audio, sentence), for run_speech_recognition_seq2seq
  images-repo/data/      the vision reference's 24 PNGs as a hub dataset repository: 0-15 in
                         train-00000-of-00001.parquet, 16-23 in validation-00000-of-00001.parquet
                         (columns image, label: a ClassLabel red / green / blue = i % 3)
  tiny-vit/              the vision reference's tiny ViT with its image processor's
                         preprocessor_config.json, for run_image_classification
  vlm-repo/data/         the trl_sft_vlm reference's rows (`messages`, `images`: none, one or
                         two PNGs) as a hub dataset repository: 20 in
                         train-00000-of-00001.parquet, 4 in test-00000-of-00001.parquet, for
                         `trl sft` on the tiny-gemma3 asset
  manifest.json          row counts, for the log
"""

import bz2
import csv
import io
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import GPT2TokenizerFast

N_TRAIN = 320
N_VALID = 100
N_TEST = 40


def write_parquet(path, columns):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def main():
    work = Path(sys.argv[1])
    assets = Path(os.environ["TCHTRAIN_ASSETS"])
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}

    tokenizer = GPT2TokenizerFast(
        vocab=str(assets / "gpt2-tokenizer" / "vocab.json"),
        merges=str(assets / "gpt2-tokenizer" / "merges.txt"),
    )
    tokenizer.save_pretrained(out / "gpt2-tokenizer")

    lines = (assets / "text" / "hamlet.txt").read_text(encoding="utf-8").splitlines()
    write_parquet(out / "hamlet.parquet", {"text": lines})
    cut = len(lines) // 10
    repo = out / "hamlet-repo" / "data"
    write_parquet(repo / "train-00000-of-00001.parquet", {"text": lines[cut:]})
    write_parquet(repo / "validation-00000-of-00001.parquet", {"text": lines[:cut]})
    manifest["hamlet_lines"] = len(lines)
    manifest["hamlet_repo"] = {"train": len(lines) - cut, "validation": cut}

    with bz2.open(assets / "text" / "rotten_tomatoes_corpus.csv.bz2", "rb") as raw:
        reader = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        by_label = {"fresh": [], "rotten": []}
        for row in reader:
            if row["category"] in by_label:
                by_label[row["category"]].append(row["text"])
    pairs = [
        (text, label)
        for i in range((N_TRAIN + N_VALID + N_TEST) // 2)
        for label, text in (("fresh", by_label["fresh"][i]), ("rotten", by_label["rotten"][i]))
    ]
    splits = (
        ("train", pairs[:N_TRAIN]),
        ("validation", pairs[N_TRAIN : N_TRAIN + N_VALID]),
        ("test", pairs[N_TRAIN + N_VALID :]),
    )
    for name, part in splits:
        write_parquet(
            out / "rotten-tomatoes" / f"{name}.parquet",
            {
                "sentence": [t for t, _ in part],
                "label": [lab for _, lab in part],
                "score": [1.0 if lab == "fresh" else 0.0 for _, lab in part],
            },
        )
        manifest[f"rotten_tomatoes_{name}"] = len(part)

    trl_data(assets, out, manifest)
    # The speech asset as a hub dataset repository: clips 0-7 for training, 8-11 for testing
    # (`datasets`' Audio column and its features metadata kept).
    speech = pq.read_table(assets / "speech" / "speech.parquet")
    repo = out / "speech-repo" / "data"
    repo.mkdir(parents=True, exist_ok=True)
    pq.write_table(speech.slice(0, 8), repo / "train-00000-of-00001.parquet")
    pq.write_table(speech.slice(8, 4), repo / "test-00000-of-00001.parquet")
    manifest["speech_train"] = 8
    manifest["speech_test"] = 4
    image_data(assets, out, manifest)
    vlm_data(assets, out, manifest)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest))


def image_data(assets, out, manifest):
    """The vision reference's 24 PNGs as a dataset repository with a ClassLabel column, and its
    tiny ViT with the image processor's preprocessor_config.json beside it."""
    import shutil

    from datasets import ClassLabel, Dataset, Features, Image

    vision = assets / "reference" / "vision"
    repo = out / "images-repo" / "data"
    repo.mkdir(parents=True, exist_ok=True)
    features = Features({"image": Image(), "label": ClassLabel(names=["red", "green", "blue"])})
    for split, (lo, hi) in {"train": (0, 16), "validation": (16, 24)}.items():
        rows = {
            "image": [{"bytes": (vision / "images" / f"{i}.png").read_bytes(), "path": f"{i}.png"} for i in range(lo, hi)],
            "label": [i % 3 for i in range(lo, hi)],
        }
        Dataset.from_dict(rows, features=features).to_parquet(str(repo / f"{split}-00000-of-00001.parquet"))
        manifest[f"images_{split}"] = hi - lo
    model = out / "tiny-vit"
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(vision / "vit" / "model", model)
    shutil.copy(vision / "vit" / "processor" / "preprocessor_config.json", model / "preprocessor_config.json")


def vlm_data(assets, out, manifest):
    """The trl_sft_vlm reference's Parquet splits as a dataset repository."""
    import shutil

    repo = out / "vlm-repo" / "data"
    repo.mkdir(parents=True, exist_ok=True)
    source = assets / "reference" / "trl_sft_vlm" / "vlm"
    for split, rows in (("train", 20), ("test", 4)):
        shutil.copy(source / f"{split}.parquet", repo / f"{split}-00000-of-00001.parquet")
        manifest[f"vlm_{split}"] = rows


def trl_data(assets, out, manifest):
    import shutil

    import torch
    import transformers as tf

    model = out / "tiny-llama-chat"
    config = tf.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).save_pretrained(model)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(assets / "smollm2-135m" / f, model / f)
    reward = out / "tiny-llama-reward"
    torch.manual_seed(1)
    reward_config = tf.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, num_labels=1,
    )
    tf.LlamaForSequenceClassification(reward_config).save_pretrained(reward)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(assets / "smollm2-135m" / f, reward / f)
    text = (assets / "text" / "hamlet.txt").read_text(encoding="utf-8")
    ls = [line.strip() for line in text.splitlines() if len(line.strip()) > 20][:200]
    triples = [(ls[i], ls[i + 1], ls[(i + 57) % 150]) for i in range(0, 96, 2)]
    for name, part in (("train", triples[:40]), ("test", triples[40:48])):
        rows = {
            "trl-messages": [
                {"messages": [{"role": "user", "content": a}, {"role": "assistant", "content": b}]}
                for a, b, _ in part
            ],
            "trl-pairs": [{"prompt": a, "chosen": " " + b, "rejected": " " + c} for a, b, c in part],
            "trl-prompts": [{"prompt": [{"role": "user", "content": a[:40]}]} for a, _, _ in part[:16]],
        }
        for folder, data in rows.items():
            (out / folder).mkdir(exist_ok=True)
            (out / folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
            manifest[f"{folder}_{name}"] = len(data)


if __name__ == "__main__":
    main()
