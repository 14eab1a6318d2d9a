"""Reference for tchtrain-datasets' numpy_random module: numpy's `default_rng(seed)`
(SeedSequence → PCG64) as `datasets`' `Dataset.shuffle(seed=...)` uses it.

Usage: python numpy_random.py OUT_DIR

OUT_DIR/numpy_random.json: `cases`: for each [seed, n], `np.random.default_rng(seed)
.permutation(n)`; `raw`: the first 4 `bit_generator.random_raw()` of seed 42; `pool`:
`SeedSequence(seed).pool` and `generate_state(8)` for a few seeds (a seed above 2**32
included); `shuffle`: `Dataset.from_dict({"i": range(n)}).shuffle(seed=s)["i"]`.
"""

import json
import sys
from pathlib import Path

import numpy as np
from datasets import Dataset

OUT = Path(sys.argv[1])


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    cases = [[s, n, [int(x) for x in np.random.default_rng(s).permutation(n)]]
             for s, n in [(0, 1), (0, 16), (42, 10), (42, 1000), (7, 100), (123456789, 5), (2**40 + 3, 50)]]
    raw = [int(x) for x in np.random.default_rng(42).bit_generator.random_raw(4)]
    pool = [[s, [int(x) for x in np.random.SeedSequence(s).pool], [int(x) for x in np.random.SeedSequence(s).generate_state(8)]]
            for s in (0, 42, 2**32 + 5)]
    shuffle = [[s, n, list(Dataset.from_dict({"i": list(range(n))}).shuffle(seed=s)["i"])] for s, n in [(42, 16), (3, 24)]]
    (OUT / "numpy_random.json").write_text(json.dumps({"cases": cases, "raw": raw, "pool": pool, "shuffle": shuffle}))


if __name__ == "__main__":
    main()
