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

    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
