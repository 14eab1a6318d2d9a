"""Reference for optim/tests/schedules.rs: the learning rate of every transformers scheduler
at every step of a 100-step run, with kwargs variants, through `get_scheduler`.

Two param groups (lr 1e-3 and 5e-4; the optimizer's default lr is 1e-3). Index 0 of `lrs`
is the lr right after construction, index k the lr after k `scheduler.step()` calls.
Plateau-style schedulers (reduce_lr_on_plateau, greedy) step with the saved `metrics`.

Usage: python optim_schedules.py OUT_DIR  (writes OUT_DIR/optim_schedules.json)
"""

import json
import math
import sys
from pathlib import Path

import torch
from transformers.optimization import get_scheduler

STEPS = 100
WARMUP = 10

# A noisy curve that improves, then plateaus, then gets worse: exercises patience,
# cooldown, increases (greedy) and reductions.
gen = torch.Generator().manual_seed(0)
noise = torch.rand(STEPS, generator=gen, dtype=torch.float64).tolist()
metrics = [
    (max(0.3, 1.0 - 0.02 * t) if t < 60 else 0.3 + 0.01 * (t - 60)) + 0.05 * noise[t] for t in range(STEPS)
]

CASES = [
    ("linear", "linear", WARMUP, {}),
    ("linear_nowarmup", "linear", 0, {}),
    ("cosine", "cosine", WARMUP, {}),
    ("cosine_cycles", "cosine", WARMUP, {"num_cycles": 1.5}),
    ("cosine_with_restarts", "cosine_with_restarts", WARMUP, {"num_cycles": 3}),
    ("polynomial", "polynomial", WARMUP, {}),
    ("polynomial_power", "polynomial", WARMUP, {"lr_end": 1e-5, "power": 2.0}),
    ("constant", "constant", WARMUP, {}),
    ("constant_with_warmup", "constant_with_warmup", WARMUP, {}),
    ("inverse_sqrt", "inverse_sqrt", WARMUP, {}),
    ("inverse_sqrt_timescale", "inverse_sqrt", WARMUP, {"timescale": 20}),
    ("inverse_sqrt_nowarmup", "inverse_sqrt", 0, {}),
    ("reduce_lr_on_plateau", "reduce_lr_on_plateau", WARMUP, {}),
    ("reduce_lr_on_plateau_kwargs", "reduce_lr_on_plateau", WARMUP,
     {"mode": "min", "factor": 0.5, "patience": 2, "threshold": 0.01, "threshold_mode": "abs", "cooldown": 3, "min_lr": 1e-4}),
    ("reduce_lr_on_plateau_max", "reduce_lr_on_plateau", WARMUP,
     {"mode": "max", "factor": 0.3, "patience": 1, "min_lr": [1e-5, 2e-5]}),
    ("cosine_with_min_lr", "cosine_with_min_lr", WARMUP, {"min_lr": 1e-5}),
    ("cosine_with_min_lr_rate", "cosine_with_min_lr", WARMUP, {"min_lr_rate": 0.1, "num_cycles": 0.75}),
    ("cosine_warmup_with_min_lr", "cosine_warmup_with_min_lr", WARMUP, {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr_rate", "cosine_warmup_with_min_lr", WARMUP, {"min_lr": 2e-5, "warmup_lr_rate": 0.2}),
    ("warmup_stable_decay", "warmup_stable_decay", WARMUP, {"num_decay_steps": 30}),
    ("warmup_stable_decay_kwargs", "warmup_stable_decay", WARMUP,
     {"num_decay_steps": 20, "num_stable_steps": 40, "warmup_type": "cosine", "decay_type": "1-sqrt", "min_lr_ratio": 0.1}),
    ("warmup_stable_decay_sqrt", "warmup_stable_decay", WARMUP,
     {"num_decay_steps": 25, "warmup_type": "1-sqrt", "decay_type": "linear", "num_cycles": 1.0}),
    ("greedy", "greedy", WARMUP, {"min_lr": 1e-5, "max_lr": 5e-3, "patience": 2}),
    ("greedy_smooth", "greedy", WARMUP,
     {"min_lr": [1e-5, 1e-5], "max_lr": 2e-3, "patience": 1, "factor": 0.8, "threshold": 0.01, "threshold_mode": "rel",
      "cooldown": 2, "warmup": 1, "smooth": True, "window_size": 5, "reset_start": 10}),
]

out = {"steps": STEPS, "group_lrs": [1e-3, 5e-4], "default_lr": 1e-3, "metrics": metrics, "cases": {}}
for case, name, warmup, kwargs in CASES:
    w = torch.zeros(2, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([{"params": [w]}, {"params": [b], "lr": 5e-4}], lr=1e-3)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=STEPS,
                          scheduler_specific_kwargs=dict(kwargs))
    lrs = [list(sched.get_last_lr())]
    metric_based = name in ("reduce_lr_on_plateau", "greedy")
    for t in range(STEPS):
        opt.step()
        if metric_based:
            sched.step(metrics[t])
        else:
            sched.step()
        lrs.append([float(x) for x in sched.get_last_lr()])
        # the optimizer holds the same values
        assert all(math.isclose(g["lr"], x, rel_tol=0, abs_tol=0) for g, x in zip(opt.param_groups, lrs[-1]))
    out["cases"][case] = {"name": name, "warmup": warmup, "kwargs": kwargs, "lrs": lrs}

Path(sys.argv[1], "optim_schedules.json").write_text(json.dumps(out, indent=1))
