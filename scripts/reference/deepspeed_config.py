"""Reference for integrations/deepspeed: HfTrainerDeepSpeedConfig's "auto" filling and
mismatch errors (transformers 5.23 + accelerate), without the deepspeed package (its
version check is skipped: only the config logic is exercised).

Usage: python deepspeed_config.py OUT_DIR  (writes OUT_DIR/deepspeed_config.json)
"""

import copy
import json
import sys
import tempfile
from pathlib import Path

import transformers.integrations.deepspeed as tds
from transformers import TrainingArguments

from accelerate.utils.deepspeed import HfDeepSpeedConfig as AccelerateDeepSpeedConfig

tds.dep_version_check = lambda *a, **k: None
# Without the deepspeed package transformers falls back to `object` as the base class:
# re-run upstream's exact class source with accelerate's config class (the real base).
import inspect

_ns = dict(tds.__dict__, DeepSpeedConfig=AccelerateDeepSpeedConfig)
exec(inspect.getsource(tds.HfDeepSpeedConfig) + "\n" + inspect.getsource(tds.HfTrainerDeepSpeedConfig), _ns)
HfTrainerDeepSpeedConfig = _ns["HfTrainerDeepSpeedConfig"]

ARGS = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, learning_rate=3e-5, weight_decay=0.01,
            max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, warmup_steps=0.1)

AUTO_ZERO2 = {
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "offload_optimizer": {"device": "cpu"}},
}

CASES = [
    ("all_auto_zero2", AUTO_ZERO2, {}, 64, 100),
    ("zero3_hidden_size_keys", {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}}, {}, 384, 50),
    ("mismatches", {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.5, "train_batch_size": 16,
                    "optimizer": {"params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
                    "bf16": {"enabled": True}}, {}, 64, 100),
    ("explicit_matching_values", {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "gradient_clipping": 1,
                                  "optimizer": {"params": {"lr": 3e-5, "betas": [0.9, 0.999]}}}, {}, 64, 100),
    ("no_hidden_size", {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}, {}, None, 10),
    ("save_on_each_node_and_warmup_zero", {"scheduler": {"params": {"warmup_num_steps": "auto", "total_num_steps": "auto"}}},
     {"save_on_each_node": True, "warmup_steps": 0}, 64, 7),
    ("scheduler_mismatch", {"scheduler": {"params": {"total_num_steps": 99, "warmup_max_lr": 0.1}}}, {}, 64, 100),
]


def run(config, overrides, hidden_size, steps):
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, use_cpu=True, report_to="none", **{**ARGS, **overrides})
    ds = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    ds.trainer_config_process(args)
    model = type("M", (), {})()
    model.config = type("C", (), {"hidden_size": hidden_size})() if hidden_size else type("C", (), {})()
    try:
        ds.trainer_config_finalize(args, model, steps)
    except ValueError as e:
        return {"error": str(e)}
    return {"config": ds.config, "zero_stage": ds._stage, "is_offload": ds.is_offload(), "dtype": str(ds._dtype)}


out = []
for name, config, overrides, hidden, steps in CASES:
    out.append({"name": name, "input": config, "overrides": overrides, "hidden_size": hidden, "num_training_steps": steps,
                "result": run(config, overrides, hidden, steps)})
Path(sys.argv[1], "deepspeed_config.json").write_text(json.dumps({"args": ARGS, "cases": out}, indent=2))
