"""Reference for datasets/src/hub.rs (tchtrain_datasets::load_dataset_files): which files
datasets 5.2 picks for each split and configuration of a dataset folder laid out as hub
dataset repositories are (sharded `data/{split}-NNNNN-of-NNNNN.*` files, split names in
file or folder names, README.md `configs:` with `data_files` / `data_dir` / `default`,
hidden and `__special__` folders, mixed extensions, the `{config}/{split}/NNNN.parquet`
layout of a Parquet export), and the errors it raises.

Usage: python hub_datasets.py OUT_DIR
Writes OUT_DIR/hub_datasets.json: datasets' version, its `_ALL_ALLOWED_EXTENSIONS`, and
for each case its files (path -> content) and, per configuration name asked for (null: none),
`load_dataset_builder(folder, name)`'s configuration name, packaged module, CSV separator
and `config.data_files` as [split, [paths relative to the folder]] pairs, or the error's
type and message. The Rust test builds the same folders, resolves them locally and served
by its local hub, and compares. Everything runs offline on local folders.
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
WORK = Path(tempfile.mkdtemp(prefix="hub_datasets_"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_CACHE"] = str(WORK / "datasets_cache")

import datasets  # noqa: E402
from datasets import load_dataset_builder  # noqa: E402
from datasets.packaged_modules import _ALL_ALLOWED_EXTENSIONS  # noqa: E402

datasets.logging.set_verbosity_error()

CONFIGS_CARD = """---
license: mit
pretty_name: Configs
configs:
- config_name: first   # data_files as {split, path} entries, with a glob and a list
  data_files:
  - split: train
    path: "first/train-*.csv"
  - split: test
    path:
    - first/test-a.csv
    - 'first/test-b.csv'
- config_name: second
  data_files: second/*.csv
  default: true
- config_name: third
  data_dir: third
---
# A card with three configurations
"""

NO_DEFAULT_CARD = """---
configs:
  - config_name: a
    data_files: a/*.jsonl
  - config_name: b
    data_files: [b/x.jsonl, b/y.jsonl]
---
"""

SEP_CARD = """---
configs:
- config_name: default
  data_files: "*.csv"
  sep: ";"
---
"""

CASES = [
    {
        "name": "sharded_parquet",
        "files": {
            "README.md": "# no front matter\n",
            "data/train-00000-of-00002.parquet": "PAR1 train 0",
            "data/train-00001-of-00002.parquet": "PAR1 train 1",
            "data/validation-00000-of-00001.parquet": "PAR1 validation",
            "data/test-00000-of-00001.parquet": "PAR1 test",
            ".gitattributes": "*.parquet filter=lfs\n",
        },
        "queries": [None, "default", "other"],
    },
    {
        "name": "custom_split_sharded",
        "files": {
            "data/train-00000-of-00001.csv": "text\na\n",
            "data/random-00000-of-00001.csv": "text\nb\n",
            "data/test-00000-of-00001.csv": "text\nc\n",
        },
        "queries": [None],
    },
    {
        "name": "split_in_filename",
        "files": {
            "train.jsonl": '{"text": "a"}\n',
            "dev.jsonl": '{"text": "b"}\n',
            "test.jsonl": '{"text": "c"}\n',
            "notes/my-train-extra.jsonl": '{"text": "d"}\n',
            ".hidden/train.jsonl": '{"text": "e"}\n',
        },
        "queries": [None],
    },
    {
        "name": "split_in_dir_name",
        "files": {
            "data/train/shard_0.csv": "text\na\n",
            "data/train/shard_1.csv": "text\nb\n",
            "data/train/.hidden.csv": "text\nc\n",
            "data/train/__extra__/z.csv": "text\nd\n",
            "data/test/shard_0.csv": "text\ne\n",
        },
        "queries": [None],
    },
    {
        "name": "single_file",
        "files": {"README.md": "# corpus\n", "corpus.txt": "line one\nline two\n"},
        "queries": [None],
    },
    {
        "name": "mixed_formats",
        "files": {
            "train.csv": "text\na\n",
            "train.txt": "notes\n",
            "test.csv": "text\nb\n",
        },
        "queries": [None],
    },
    {
        "name": "tsv",
        "files": {"data.tsv": "text\tlabel\na\t1\n"},
        "queries": [None],
    },
    {
        "name": "configs",
        "files": {
            "README.md": CONFIGS_CARD,
            "first/train-0.csv": "text\na\n",
            "first/train-1.csv": "text\nb\n",
            "first/test-a.csv": "text\nc\n",
            "first/test-b.csv": "text\nd\n",
            "second/a.csv": "text\ne\n",
            "second/b.csv": "text\nf\n",
            "third/train.csv": "text\ng\n",
            "third/validation.csv": "text\nh\n",
        },
        "queries": [None, "first", "third", "nope"],
    },
    {
        "name": "configs_without_default",
        "files": {
            "README.md": NO_DEFAULT_CARD,
            "a/1.jsonl": '{"text": "a"}\n',
            "a/2.jsonl": '{"text": "b"}\n',
            "b/x.jsonl": '{"text": "c"}\n',
            "b/y.jsonl": '{"text": "d"}\n',
        },
        "queries": [None, "b"],
    },
    {
        "name": "card_sep",
        "files": {"README.md": SEP_CARD, "rows.csv": "text;label\na;1\n"},
        "queries": [None],
    },
    {
        "name": "parquet_export_layout",
        "files": {
            "default/train/0000.parquet": "PAR1 export train 0",
            "default/train/0001.parquet": "PAR1 export train 1",
            "default/validation/0000.parquet": "PAR1 export validation",
        },
        "queries": [None],
    },
    {
        "name": "no_data_files",
        "files": {"README.md": "# only a card\n", ".gitattributes": "\n"},
        "queries": [None],
    },
]


def resolve(folder: Path, name):
    try:
        builder = load_dataset_builder(str(folder), name=name)
    except Exception as e:  # the error is the reference
        return {"error": type(e).__name__, "message": str(e)}
    splits = []
    for split, files in builder.config.data_files.items():
        splits.append([str(split), [Path(f).relative_to(folder).as_posix() for f in files]])
    module = type(builder).__module__.split(".")[-1]
    return {
        "config_name": builder.config.name,
        "module": module,
        "sep": getattr(builder.config, "sep", None) if module == "csv" else None,
        "splits": splits,
    }


out = []
for case in CASES:
    folder = WORK / case["name"]
    for path, content in case["files"].items():
        p = folder / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    queries = [{"name": q, "result": resolve(folder, q)} for q in case["queries"]]
    out.append({"name": case["name"], "files": case["files"], "queries": queries})
    for q in queries:
        print(case["name"], q["name"], json.dumps(q["result"])[:160])

(OUT / "hub_datasets.json").write_text(
    json.dumps(
        {
            "datasets_version": datasets.__version__,
            "all_allowed_extensions": list(_ALL_ALLOWED_EXTENSIONS),
            "cases": out,
        },
        indent=1,
    )
)
shutil.rmtree(WORK, ignore_errors=True)
