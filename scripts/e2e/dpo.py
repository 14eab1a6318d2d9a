"""The upstream side of `cargo xtask e2e`'s dpo case: TRL's own `trl dpo` script
(trl/scripts/dpo.py, trl 1.16), run as its `__main__` with the same flags as our `dpo`."""

import runpy

runpy.run_module("trl.scripts.dpo", run_name="__main__", alter_sys=True)
