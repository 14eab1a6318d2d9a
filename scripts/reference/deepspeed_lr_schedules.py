"""Reference for integrations/deepspeed/tests/it/lr_schedules.rs: DeepSpeed's own
`deepspeed.runtime.lr_schedules` (WarmupLR, WarmupDecayLR, WarmupCosineLR) driving a torch
optimizer with two param groups (lr 1e-3 and 5e-4), as DeepSpeed's engine builds them from a
config's `scheduler` section. Index 0 of `lrs` is the groups' lr right after construction,
index k the lr after k `scheduler.step()` calls (DeepSpeed steps after each optimizer step).

Usage: python deepspeed_lr_schedules.py OUT_DIR  (writes OUT_DIR/deepspeed_lr_schedules.json)
"""

import json
import logging
import sys
from pathlib import Path

import torch
from deepspeed.runtime import lr_schedules

logging.getLogger("DeepSpeed").setLevel(logging.ERROR)

STEPS = 60

CASES = [
    ("warmup_log", "WarmupLR", {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}),
    ("warmup_linear", "WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 2e-3, "warmup_num_steps": 7, "warmup_type": "linear"}),
    ("warmup_default_max_per_group", "WarmupLR", {"warmup_num_steps": 5}),
    ("warmup_list", "WarmupLR", {"warmup_min_lr": [0, 1e-6], "warmup_max_lr": [1e-3, 3e-4], "warmup_num_steps": 12}),
    ("warmup_one_step", "WarmupLR", {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 1}),
    ("decay_log", "WarmupDecayLR", {"total_num_steps": 50, "warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}),
    ("decay_linear", "WarmupDecayLR", {"total_num_steps": 40, "warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 4, "warmup_type": "linear"}),
    ("decay_defaults", "WarmupDecayLR", {"total_num_steps": 45, "warmup_num_steps": 3}),
    ("cosine_log", "WarmupCosineLR", {"total_num_steps": 50, "warmup_num_steps": 10}),
    # The Trainer test's run: 6 steps, `"auto"` warm-up from --warmup_steps 3.
    ("trainer_decay", "WarmupDecayLR", {"total_num_steps": 6, "warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 3}),
    ("cosine_linear_ratios", "WarmupCosineLR", {"total_num_steps": 30, "warmup_num_steps": 6, "warmup_type": "linear", "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}),
]


def run(kind, params):
    a = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [a], "lr": 1e-3}, {"params": [b], "lr": 5e-4}], lr=1e-3)
    sched = getattr(lr_schedules, kind)(opt, **params)
    lrs = [[g["lr"] for g in opt.param_groups]]
    last = []
    for _ in range(STEPS):
        sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
        last.append(list(sched.get_last_lr()))
    return {"lrs": lrs, "last_lr": last, "state": sched.state_dict()}


def main(out_dir: str) -> None:
    out = {
        "steps": STEPS,
        "cases": [dict(name=name, type=kind, params=params, **run(kind, params)) for name, kind, params in CASES],
    }
    for bad in [{"warmup_num_steps": 0}, {"warmup_num_steps": 10.0}]:
        try:
            run("WarmupLR", bad)
            raise SystemExit(f"{bad} was accepted")
        except ValueError as e:
            out.setdefault("errors", []).append({"params": bad, "error": str(e)})
    path = Path(out_dir) / "deepspeed_lr_schedules.json"
    path.write_text(json.dumps(out))
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1])
