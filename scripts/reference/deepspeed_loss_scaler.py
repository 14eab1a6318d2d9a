"""Reference for accelerate/tests/it/loss_scaler.rs and integrations/deepspeed/tests/it/config.rs:
DeepSpeed 0.19.8's own loss scalers as its ZeRO optimizers build them
(`CreateLossScaler(dtype, static_loss_scale, dynamic_scaling, dynamic_loss_args)` with the
arguments `DeepSpeedFP16Config` derives from a config's `fp16` section), driven through a
fixed pattern of overflows: the scale, hysteresis and iteration counters after every
`update_scale(overflow)`, and the step at which the scaler raises at its minimum scale.

Usage: python deepspeed_loss_scaler.py OUT_DIR  (writes OUT_DIR/deepspeed_loss_scaler.json)
"""

import json
import logging
import sys
from pathlib import Path

import torch
import deepspeed.comm as dist
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
from deepspeed.runtime.precision_config import DeepSpeedFP16Config

logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
# The scalers log through `dist.get_rank()`; one process is rank 0.
dist.get_rank = lambda *a, **k: 0

# Overflow patterns: 1 = the step's gradients overflowed.
PATTERNS = {
    "early_overflows": [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
    "alternating": [1, 0] * 12,
    "long_stable": [0] * 40 + [1] + [0] * 20,
    "down_to_min": [1] * 40,
}

# `fp16` sections (as a config writes them) and the dtype.
SECTIONS = [
    ("documents", {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}),
    ("small_window", {"enabled": True, "loss_scale": 0, "initial_scale_power": 5, "loss_scale_window": 3,
                      "hysteresis": 2, "min_loss_scale": 1}),
    ("consecutive", {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 4, "hysteresis": 3,
                     "consecutive_hysteresis": True, "min_loss_scale": 2}),
    ("no_hysteresis", {"enabled": True, "initial_scale_power": 6, "loss_scale_window": 2, "hysteresis": 1,
                       "min_loss_scale": 1}),
    ("static", {"enabled": True, "loss_scale": 128}),
]


def run(section, pattern):
    cfg = DeepSpeedFP16Config(**section)
    dynamic = cfg.loss_scale == 0
    scaler = CreateLossScaler(torch.half, cfg.loss_scale, dynamic, cfg.dynamic_loss_scale_args())
    trace = []
    raised_at = None
    for i, overflow in enumerate(pattern):
        try:
            scaler.update_scale(bool(overflow))
        except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
            assert "already at minimum" in str(e), e
            raised_at = i
            break
        trace.append({
            "cur_scale": scaler.cur_scale,
            "cur_iter": getattr(scaler, "cur_iter", None),
            "last_overflow_iter": getattr(scaler, "last_overflow_iter", None),
            "cur_hysteresis": getattr(scaler, "cur_hysteresis", None),
        })
    return {"dynamic": dynamic, "init_scale": float(CreateLossScaler(torch.half, cfg.loss_scale, dynamic,
                                                                       cfg.dynamic_loss_scale_args()).cur_scale),
            "trace": trace, "raised_at": raised_at}


def main(out_dir: str) -> None:
    cases = []
    for name, section in SECTIONS:
        for pname, pattern in PATTERNS.items():
            cases.append(dict(name=f"{name}/{pname}", section=section, pattern=pattern, **run(section, pattern)))
    # bf16: a static scaler of 1 whatever the section says.
    bf16 = CreateLossScaler(torch.bfloat16, 0, True, DeepSpeedFP16Config().dynamic_loss_scale_args())
    bf16.update_scale(True)
    # DeepSpeed's validators on the fp16 section.
    refused = []
    for bad in [{"enabled": True, "loss_scale": -1}, {"enabled": True, "loss_scale_window": 0},
                {"enabled": True, "min_loss_scale": 0}, {"enabled": True, "loss_scale": True}]:
        try:
            DeepSpeedFP16Config(**bad)
            raise SystemExit(f"{bad} was accepted")
        except ValueError:
            refused.append(bad)
    out = {"cases": cases, "bf16_scale": bf16.cur_scale, "refused": refused}
    path = Path(out_dir) / "deepspeed_loss_scaler.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}: {len(cases)} trajectories")


if __name__ == "__main__":
    main(sys.argv[1])
