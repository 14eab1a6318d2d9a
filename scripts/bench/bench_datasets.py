"""Upstream's side of `cargo xtask bench --datasets` (see examples/src/bin/bench_datasets.rs),
and the maker of its Parquet file.

  python bench_datasets.py --make F.parquet --mb N   writes hamlet.txt's lines, repeated, as a
      Parquet file of about N MB of text (column "text", row groups of 100,000 rows, snappy)
  python bench_datasets.py --file F.parquet [--threads N] [--cache_dir D]
      `datasets.load_dataset("parquet", data_files=F, split="train")` then run_clm's
      `tokenize_function` through `map(batched=True)` (batches of 1000 rows, the GPT-2 fast
      tokenizer), counting the tokens; prints one flat JSON line with the same fields.
      `seconds` covers the load (the conversion into datasets' Arrow cache) and the map, as a
      run_clm user waits for both; `map_seconds` the map alone.
"""

import argparse
import json
import os
import time
from pathlib import Path

ROW_GROUP = 100_000


def peak_rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def make(path, mb):
    import pyarrow as pa
    import pyarrow.parquet as pq

    assets = Path(os.environ["TCHTRAIN_ASSETS"])
    lines = (assets / "text" / "hamlet.txt").read_text(encoding="utf-8").splitlines()
    lines = [line for line in lines if line.strip()]
    target = mb * 1024 * 1024
    written = 0
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())]), compression="snappy") as w:
        i = 0
        while written < target:
            group = []
            for _ in range(ROW_GROUP):
                line = lines[i % len(lines)]
                group.append(line)
                written += len(line.encode("utf-8"))
                i += 1
                if written >= target:
                    break
            w.write_table(pa.table({"text": group}))
    print(json.dumps({"made": str(path), "rows": i, "text_mb": written / 1048576.0}))


def bench(path, threads, cache_dir):
    if threads:
        import torch

        torch.set_num_threads(threads)
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    import datasets
    import transformers as tf

    datasets.disable_progress_bars()
    assets = Path(os.environ["TCHTRAIN_ASSETS"])
    tok = tf.GPT2TokenizerFast(
        vocab=str(assets / "gpt2-tokenizer" / "vocab.json"),
        merges=str(assets / "gpt2-tokenizer" / "merges.txt"),
    )
    t0 = time.perf_counter()
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=cache_dir)
    column = "text" if "text" in ds.column_names else ds.column_names[0]
    t1 = time.perf_counter()
    tokenized = ds.map(lambda b: tok(b[column]), batched=True, remove_columns=ds.column_names)
    tokens = 0
    for batch in tokenized.iter(batch_size=10_000):
        tokens += sum(len(ids) for ids in batch["input_ids"])
    t2 = time.perf_counter()
    print(json.dumps({
        "bench": "datasets/parquet_tokenize", "impl": "python", "rows": len(ds), "tokens": tokens,
        "file_mb": path.stat().st_size / 1048576.0, "seconds": t2 - t0, "map_seconds": t2 - t1,
        "tokens_per_s": tokens / (t2 - t0), "peak_rss_mb": peak_rss_mb(),
    }))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--make", type=Path)
    p.add_argument("--mb", type=int, default=1024)
    p.add_argument("--file", type=Path)
    p.add_argument("--threads", type=int)
    p.add_argument("--cache_dir")
    a = p.parse_args()
    if a.make:
        make(a.make, a.mb)
    else:
        bench(a.file, a.threads, a.cache_dir)


if __name__ == "__main__":
    main()
