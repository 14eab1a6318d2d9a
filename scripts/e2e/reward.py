"""The upstream side of `cargo xtask e2e`'s reward case: TRL's own `trl reward` script
(trl/scripts/reward.py, trl 1.16), run as its `__main__` with the same flags as our `reward`."""

import runpy

runpy.run_module("trl.scripts.reward", run_name="__main__", alter_sys=True)
