"""The upstream side of `cargo xtask e2e`'s grpo case: TRL's own `trl grpo` script
(trl/scripts/grpo.py, trl 1.16), run as its `__main__` with the same flags as our `grpo`."""

import runpy

runpy.run_module("trl.scripts.grpo", run_name="__main__", alter_sys=True)
