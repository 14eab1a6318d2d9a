"""Reference for trainer/src/numpy_mean.rs: numpy's mean of a 1-D float32 array, which
upstream's `evaluation_loop` uses for `{prefix}_loss` (`all_losses.mean().item()` over the
concatenated per-row losses).

Usage: python numpy_mean.py OUT_DIR
Writes OUT_DIR/numpy_mean.json: for arrays of lengths around numpy's pairwise-summation
boundaries (8, 128 and their multiples), the float32 values (as their bit patterns) and
the mean `.item()` (as the bit pattern of the float64 Python float).
"""

import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)

rng = np.random.default_rng(0)
cases = []
for n in [1, 5, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 257, 1000, 1023, 4097, 20011]:
    # Losses over several binades (like per-row cross entropies), so the order matters.
    values = (rng.lognormal(mean=1.0, sigma=1.5, size=n)).astype(np.float32)
    mean = values.mean().item()
    cases.append(
        {
            "n": n,
            "bits": values.view(np.uint32).tolist(),
            "mean_bits": int(np.float64(mean).view(np.uint64)),
        }
    )
(OUT / "numpy_mean.json").write_text(json.dumps({"numpy": np.__version__, "cases": cases}))
