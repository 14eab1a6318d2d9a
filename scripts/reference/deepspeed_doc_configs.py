"""Reference for integrations/deepspeed/tests/doc_configs.rs: upstream's
HfTrainerDeepSpeedConfig (transformers 5.23 + accelerate, loaded as in deepspeed_config.py)
applied to the documentation's ZeRO-2 / ZeRO-3 example configs in
integrations/deepspeed/tests/fixtures/: the filled configs (written next to them as
ds_config_zero{2,3}.filled.json) and the mismatch messages (printed; the test states them).

Usage (repository root): python scripts/reference/deepspeed_doc_configs.py
"""

import json
import sys
import tempfile
from pathlib import Path

sys.argv = [sys.argv[0], tempfile.gettempdir()]
_src = Path(__file__).with_name("deepspeed_config.py").read_text().split("CASES = [")[0]
exec(_src)

FIXTURES = Path("integrations/deepspeed/tests/fixtures")
# The test's arguments: batch 2, accumulation 2, lr 1e-3, weight decay 0.01, warmup 2 of 6
# steps, tiny GPT-2's hidden size 64.
ARGS_TEST = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-3,
                 weight_decay=0.01, max_grad_norm=1.0, warmup_steps=2)


def run(name, overrides):
    cfg = json.loads((FIXTURES / name).read_text())
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, use_cpu=True, report_to="none", **ARGS_TEST)
    ds = HfTrainerDeepSpeedConfig(cfg)
    ds.trainer_config_process(args)
    model = type("M", (), {})()
    model.config = type("C", (), {"hidden_size": 64})()
    try:
        ds.trainer_config_finalize(args, model, 6)
    except ValueError as e:
        return None, str(e)
    return ds.config, None


for stage in (2, 3):
    name = f"ds_config_zero{stage}.json"
    config, _ = run(name, {})
    (FIXTURES / f"ds_config_zero{stage}.filled.json").write_text(json.dumps(config, indent=4) + "\n")
print(repr(run("ds_config_zero2.json", {"gradient_accumulation_steps": 4, "optimizer.params.lr": 3e-5,
                                        "fp16.enabled": True})[1]))
print(repr(run("ds_config_zero3.json", {"gradient_clipping": 0.5, "train_micro_batch_size_per_gpu": 3})[1]))
