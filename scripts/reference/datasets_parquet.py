"""Reference for tchtrain-datasets' Parquet / Arrow readers: files written by pyarrow 26.0.1
and `datasets` 5.2.0, and the rows `datasets` reads back from them.

Usage: python datasets_parquet.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Files (OUT_DIR/...):
  parquet/types_{snappy,zstd,gzip,brotli,lz4,none}.parquet
              the same 43 rows in row groups of 8 (6 groups, the last of 3), one file per
              compression; zstd with data page v2, none without dictionary encoding. Columns:
              int8..int64, uint8..uint64 (extremes included), float16 / float32 / float64,
              bool, string (unicode, empty, line breaks), large_string, an Arrow
              dictionary<int32, string>, list<int64>, list<string>, large_list<float64>,
              fixed_size_list<int32, 3> (never null itself), struct<a: int32, b: string, c: list<float32>>,
              list<struct<k: string, v: int64>>, list<list<int16>>, and a null column;
              about a tenth of the cells of every column null.
  parquet/hamlet.parquet
              columns id, text: the rows of `load_dataset("text", hamlet.txt,
              keep_linebreaks=True)` (run_clm.py's loading), in row groups of 700.
  parquet/first_column.parquet
              columns content, id (no "text" column: run_clm.py then takes the first one),
              row groups of 5.
  parquet/ner_class_label.parquet
              `Dataset.to_parquet` of 24 NER rows (tokens: list<string>, ner_tags:
              list<ClassLabel>, label: ClassLabel), so the schema's `huggingface` metadata
              names the classes.
  parquet/unsupported.parquet
              columns text, when (timestamp[ms]), blob (binary): text reads, `when` is a
              type that has no JSON cell, blob reads as lists of byte values.
  arrow/types_stream.arrow, types_file.arrow, types_stream_zstd.arrow, types_stream_lz4.arrow
              the types table as an Arrow IPC stream (the format `datasets` writes), as an
              IPC file, and as streams with zstd / lz4 buffer compression; batches of 8 rows.
  saved_dataset/
              `Dataset.save_to_disk(num_shards=3)` of a shuffled dataset (an indices mapping,
              which save_to_disk flattens) with ClassLabel, string, float32, list and struct
              features.
  saved_dict/ `DatasetDict.save_to_disk(num_shards={"train": 2})` of train / validation / test.
  expected.json
              what `datasets` reads back, via `.to_list()`: for each Parquet file
              `load_dataset("parquet", data_files=...)` (columns, rows, num_row_groups), for
              each Arrow file `load_dataset("arrow", data_files=...)`, and `load_from_disk`
              of both folders (the splits in order); class_labels: for
              ner_class_label.parquet, the ClassLabel names `load_dataset` gives each column.
"""

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import ClassLabel, Dataset, DatasetDict, Features, List, Value

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ.get("TCHTRAIN_ASSETS", Path(__file__).resolve().parents[2] / "assets"))
CACHE = Path(tempfile.mkdtemp(prefix="datasets_parquet_cache_"))

ROWS = 43
ROW_GROUP = 8


def maybe(rng, value):
    """`value`, or None one time in ten."""
    return None if rng.random() < 0.1 else value


def types_table() -> pa.Table:
    rng = random.Random(20240501)
    words = ["", "a", "héllo wörld", "line\nbreak", 'quote " and , comma', "日本語テキスト", "emoji 🙂", "tab\tend "]
    cols = {k: [] for k in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64", "flag")}
    cols.update({k: [] for k in ("s", "ls", "dict", "ints", "strs", "lfloats", "fixed", "st", "pairs", "nested", "nothing")})
    extremes = {
        "i8": (-(2**7), 2**7 - 1), "i16": (-(2**15), 2**15 - 1), "i32": (-(2**31), 2**31 - 1),
        "i64": (-(2**63), 2**63 - 1), "u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1),
        "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1),
    }
    for r in range(ROWS):
        for k, (lo, hi) in extremes.items():
            v = lo if r == 0 else hi if r == 1 else rng.randint(lo, hi)
            cols[k].append(v if r < 2 else maybe(rng, v))
        cols["f16"].append(maybe(rng, rng.choice([0.5, -2.25, 0.1, 65504.0, rng.uniform(-10, 10)])))
        cols["f32"].append(maybe(rng, rng.choice([0.1, -0.0, 3.4e38, 1e-40, rng.uniform(-1e6, 1e6)])))
        cols["f64"].append(maybe(rng, rng.choice([0.1, -0.0, 1e300, 5e-324, 2.0**53 + 1, rng.gauss(0, 1e3)])))
        cols["flag"].append(maybe(rng, rng.random() < 0.5))
        cols["s"].append(maybe(rng, rng.choice(words) + str(r)))
        cols["ls"].append(maybe(rng, rng.choice(words) * rng.randint(0, 3)))
        cols["dict"].append(maybe(rng, rng.choice(["red", "green", "blue", ""])))
        cols["ints"].append(maybe(rng, [rng.randint(-1000, 1000) for _ in range(rng.randint(0, 5))]))
        cols["strs"].append(maybe(rng, [maybe(rng, rng.choice(words)) for _ in range(rng.randint(0, 4))]))
        cols["lfloats"].append(maybe(rng, [rng.uniform(-1, 1) for _ in range(rng.randint(0, 3))]))
        # No null lists here: pyarrow 26 reads a null fixed_size_list back from Parquet as a
        # list of size 0 and then refuses it ("Expected all lists to be of size=3").
        cols["fixed"].append([rng.randint(-5, 5), maybe(rng, rng.randint(-5, 5)), rng.randint(-5, 5)])
        cols["st"].append(maybe(rng, {
            "a": maybe(rng, rng.randint(-100, 100)),
            "b": maybe(rng, rng.choice(words)),
            "c": maybe(rng, [rng.uniform(-2, 2) for _ in range(rng.randint(0, 3))]),
        }))
        cols["pairs"].append(maybe(rng, [
            maybe(rng, {"k": rng.choice(words), "v": maybe(rng, rng.randint(0, 99))}) for _ in range(rng.randint(0, 3))
        ]))
        cols["nested"].append(maybe(rng, [
            maybe(rng, [rng.randint(-300, 300) for _ in range(rng.randint(0, 3))]) for _ in range(rng.randint(0, 3))
        ]))
        cols["nothing"].append(None)
    types = {
        "i8": pa.int8(), "i16": pa.int16(), "i32": pa.int32(), "i64": pa.int64(),
        "u8": pa.uint8(), "u16": pa.uint16(), "u32": pa.uint32(), "u64": pa.uint64(),
        "f16": pa.float16(), "f32": pa.float32(), "f64": pa.float64(), "flag": pa.bool_(),
        "s": pa.string(), "ls": pa.large_string(),
        "ints": pa.list_(pa.int64()), "strs": pa.list_(pa.string()),
        "lfloats": pa.large_list(pa.float64()), "fixed": pa.list_(pa.int32(), 3),
        "st": pa.struct([("a", pa.int32()), ("b", pa.string()), ("c", pa.list_(pa.float32()))]),
        "pairs": pa.list_(pa.struct([("k", pa.string()), ("v", pa.int64())])),
        "nested": pa.list_(pa.list_(pa.int16())), "nothing": pa.null(),
    }
    arrays = {}
    for name, values in cols.items():
        if name == "dict":
            arrays[name] = pa.array(values, pa.string()).dictionary_encode()
        else:
            arrays[name] = pa.array(values, types[name])
    return pa.table(arrays)


def rows_of(ds) -> dict:
    return {"columns": ds.column_names, "rows": ds.to_list()}


def load(kind: str, path: Path):
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(CACHE))


def main():
    datasets.disable_progress_bars()
    expected = {"parquet": {}, "arrow": {}}
    (OUT / "parquet").mkdir()
    (OUT / "arrow").mkdir()
    table = types_table()

    parquet_files = {
        "types_snappy.parquet": dict(compression="snappy"),
        "types_zstd.parquet": dict(compression="zstd", data_page_version="2.0"),
        "types_gzip.parquet": dict(compression="gzip"),
        "types_brotli.parquet": dict(compression="brotli"),
        "types_lz4.parquet": dict(compression="lz4"),
        "types_none.parquet": dict(compression="none", use_dictionary=False),
    }
    for name, options in parquet_files.items():
        pq.write_table(table, OUT / "parquet" / name, row_group_size=ROW_GROUP, **options)

    hamlet = datasets.load_dataset(
        "text", data_files=str(ASSETS / "text" / "hamlet.txt"), split="train", keep_linebreaks=True, cache_dir=str(CACHE)
    )
    lines = hamlet["text"]
    pq.write_table(
        pa.table({"id": pa.array(range(len(lines)), pa.int64()), "text": pa.array(lines, pa.string())}),
        OUT / "parquet" / "hamlet.parquet",
        row_group_size=700,
    )
    content = [f"Row {i}: the quick brown fox jumps over the lazy dog {i * 7}.\n" for i in range(23)]
    pq.write_table(
        pa.table({"content": content, "id": list(range(len(content)))}),
        OUT / "parquet" / "first_column.parquet",
        row_group_size=5,
    )
    pq.write_table(
        pa.table({
            "text": ["a", "b", "c"],
            "when": pa.array([0, 1_000, None], pa.timestamp("ms")),
            "blob": pa.array([b"\x00", b"xy", None], pa.binary()),
        }),
        OUT / "parquet" / "unsupported.parquet",
    )
    ner_names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC"]
    ner_features = Features({
        "tokens": List(Value("string")),
        "ner_tags": List(ClassLabel(names=ner_names)),
        "label": ClassLabel(names=["prose", "verse"]),
    })
    words = " ".join(lines[:400]).split()
    ner_rows = {"tokens": [], "ner_tags": [], "label": []}
    for i in range(24):
        toks = words[i * 7:(i * 7) + 5 + i % 4]
        ner_rows["tokens"].append(toks)
        ner_rows["ner_tags"].append([(i + j) % len(ner_names) for j in range(len(toks))])
        ner_rows["label"].append(i % 2)
    Dataset.from_dict(ner_rows, features=ner_features).to_parquet(str(OUT / "parquet" / "ner_class_label.parquet"))
    loaded_ner = load("parquet", OUT / "parquet" / "ner_class_label.parquet")
    expected["class_labels"] = {
        "ner_class_label.parquet": {
            "ner_tags": loaded_ner.features["ner_tags"].feature.names,
            "label": loaded_ner.features["label"].names,
        }
    }

    for path in sorted((OUT / "parquet").glob("*.parquet")):
        if path.name == "unsupported.parquet":
            continue
        entry = rows_of(load("parquet", path))
        entry["num_row_groups"] = pq.ParquetFile(path).metadata.num_row_groups
        expected["parquet"][path.name] = entry

    batches = table.to_batches(max_chunksize=ROW_GROUP)
    streams = {
        "types_stream.arrow": pa.ipc.IpcWriteOptions(),
        "types_stream_zstd.arrow": pa.ipc.IpcWriteOptions(compression="zstd"),
        "types_stream_lz4.arrow": pa.ipc.IpcWriteOptions(compression="lz4"),
    }
    for name, options in streams.items():
        with pa.OSFile(str(OUT / "arrow" / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema, options=options) as w:
            for b in batches:
                w.write_batch(b)
    with pa.OSFile(str(OUT / "arrow" / "types_file.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for b in batches:
            w.write_batch(b)
    for path in sorted((OUT / "arrow").glob("*.arrow")):
        entry = rows_of(load("arrow", path))
        entry["num_batches"] = len(batches)
        expected["arrow"][path.name] = entry

    rng = random.Random(7)
    features = Features({
        "text": Value("string"),
        "label": ClassLabel(names=["neg", "pos"]),
        "score": Value("float32"),
        "input_ids": List(Value("int32")),
        "meta": {"source": Value("string"), "tags": List(Value("string"))},
    })

    def make(n, offset):
        return Dataset.from_dict({
            "text": [f"example {offset + i} " + "word " * rng.randint(0, 5) for i in range(n)],
            "label": [rng.randint(0, 1) for _ in range(n)],
            "score": [rng.uniform(-1, 1) for _ in range(n)],
            "input_ids": [[rng.randint(0, 50000) for _ in range(rng.randint(0, 6))] for _ in range(n)],
            "meta": [{"source": rng.choice(["web", "book", None]), "tags": ["t"] * rng.randint(0, 2)} for _ in range(n)],
        }, features=features)

    single = make(31, 0).shuffle(seed=0)
    single.save_to_disk(str(OUT / "saved_dataset"), num_shards=3)
    dd = DatasetDict({"train": make(25, 100), "validation": make(6, 200), "test": make(4, 300)})
    dd.save_to_disk(str(OUT / "saved_dict"), num_shards={"train": 2})
    expected["saved_dataset"] = rows_of(datasets.load_from_disk(str(OUT / "saved_dataset")))
    loaded = datasets.load_from_disk(str(OUT / "saved_dict"))
    expected["saved_dict"] = {"splits": list(loaded), **{k: rows_of(v) for k, v in loaded.items()}}

    (OUT / "expected.json").write_text(json.dumps(expected, allow_nan=False, ensure_ascii=False))
    for kind in ("parquet", "arrow"):
        for name, entry in expected[kind].items():
            print(f"{kind}/{name}: {len(entry['rows'])} rows, {len(entry['columns'])} columns")
    print("saved_dataset:", len(expected["saved_dataset"]["rows"]), "rows;",
          "saved_dict:", {k: len(expected["saved_dict"][k]["rows"]) for k in expected["saved_dict"]["splits"]})
    shutil.rmtree(CACHE, ignore_errors=True)


if __name__ == "__main__":
    main()
