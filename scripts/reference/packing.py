"""Reference for tchtrain-datasets' packing: TRL's `pack_dataset` (trl 1.16.0).

Usage: python packing.py OUT_DIR

OUT_DIR/packing.json holds the rows packed and, for each case, TRL's packed columns and
`seq_lengths`:
  rows        2,300 rows (seeded): `input_ids`, `attention_mask` (0 / 1), `labels`; lengths
              0..300, 2 % of them empty, many equal lengths (the sort's ties)
  cases       bfd at seq_length 128 / 100 / 7, bfd_split and wrapped at 128 / 100, packed
              with datasets' default batch of 1000 rows, and bfd with batch_size 64
"""

import json
import random
import sys
from pathlib import Path

from datasets import Dataset
from trl import pack_dataset

OUT = Path(sys.argv[1])


def main():
    rng = random.Random(1234)
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for _ in range(2300):
        n = 0 if rng.random() < 0.02 else rng.choice([rng.randint(1, 300), rng.choice([5, 17, 64, 100, 128])])
        ids = [rng.randint(0, 50000) for _ in range(n)]
        rows["input_ids"].append(ids)
        rows["attention_mask"].append([rng.randint(0, 1) for _ in range(n)])
        rows["labels"].append([i if rng.random() < 0.8 else -100 for i in ids])
    dataset = Dataset.from_dict(rows)
    cases = []
    for strategy, lengths in (("bfd", (128, 100, 7)), ("bfd_split", (128, 100)), ("wrapped", (128, 100))):
        for seq_length in lengths:
            packed = pack_dataset(dataset, seq_length, strategy=strategy)
            cases.append({"strategy": strategy, "seq_length": seq_length, "batch_size": 1000, "packed": packed[:]})
    packed = pack_dataset(dataset, 128, strategy="bfd", map_kwargs={"batch_size": 64})
    cases.append({"strategy": "bfd", "seq_length": 128, "batch_size": 64, "packed": packed[:]})
    for c in cases:
        print(c["strategy"], c["seq_length"], c["batch_size"], len(c["packed"]["input_ids"]), "rows")
    (OUT / "packing.json").write_text(json.dumps({"rows": rows, "cases": cases}))


if __name__ == "__main__":
    main()
