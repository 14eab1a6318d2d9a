"""The upstream side of `cargo xtask e2e`'s sft case: TRL's own `trl sft` script
(trl/scripts/sft.py, trl 1.16), run as its `__main__` with the same flags as our `sft`."""

import runpy

runpy.run_module("trl.scripts.sft", run_name="__main__", alter_sys=True)
