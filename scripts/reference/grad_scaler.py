"""Reference for optim/tests/grad_scaler.rs: torch.amp.GradScaler on the CPU.

Two parameters under AdamW. At every step the gradients of a "scaled loss" are fed
(`p.grad = g * scaler.get_scale()`, what `scaler.scale(loss).backward()` gives for a loss
whose gradient is g), then `unscale_`, `clip_grad_norm_`, `step`, `update`, as accelerate
and the Trainer do with fp16. Some steps carry an inf or a NaN (skipped, scale backed off);
the scale grows after `growth_interval` clean steps; one case starts from a scale so large
that the scaled gradients overflow float32 until it has backed off. Saved per step: the scale
and growth tracker after `update`, whether the optimizer stepped, the clip total and the
parameters; at the end the state_dict, and `scale(loss)` of a float32 and a float16 loss.

Usage: python grad_scaler.py OUT_DIR
Writes OUT_DIR/grad_scaler.safetensors and OUT_DIR/grad_scaler.json.
"""

import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

STEPS = 14
SHAPES = {"weight": (5, 4), "bias": (4,)}

torch.manual_seed(0)
init = {n: torch.randn(s, dtype=torch.float32) for n, s in SHAPES.items()}
grads = {n: torch.randn((STEPS, *s), dtype=torch.float32) for n, s in SHAPES.items()}
# Non-finite gradients: an inf at step 2 in the weight, a NaN at step 6 in the bias,
# a -inf at step 7 in the weight.
grads["weight"][2, 1, 2] = math.inf
grads["bias"][6, 3] = math.nan
grads["weight"][7, 0, 0] = -math.inf

CASES = {
    "default": dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000),
    "grows": dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3),
    "odd_factors": dict(init_scale=3.0e4, growth_factor=3.0, backoff_factor=0.25, growth_interval=2),
    # 2**127 * |g| overflows float32 for |g| >= 2: the first steps are skipped.
    "overflow": dict(init_scale=2.0**127, growth_factor=2.0, backoff_factor=0.5, growth_interval=4),
}

tensors = {f"init.{n}": t for n, t in init.items()}
tensors.update({f"grads.{n}": g for n, g in grads.items()})
meta = {"steps": STEPS, "shapes": {n: list(s) for n, s in SHAPES.items()}, "cases": {}}

for case, kw in CASES.items():
    params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=1e-2, weight_decay=0.01, foreach=False)
    scaler = torch.amp.GradScaler("cpu", **kw)
    record = {"kwargs": kw, "scale": [], "growth_tracker": [], "stepped": [], "clip_total": []}
    for step in range(STEPS):
        # scaler.scale(loss) initialises the scale lazily on the loss's device.
        scaler.scale(torch.tensor(1.0))
        for n, p in params.items():
            p.grad = grads[n][step].clone() * scaler.get_scale()
        scaler.unscale_(opt)
        total = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        steps_before = opt.state[params["bias"]].get("step", torch.tensor(0.0)).item()
        scaler.step(opt)
        scaler.update()
        steps_after = opt.state[params["bias"]].get("step", torch.tensor(0.0)).item()
        record["scale"].append(scaler.get_scale())
        record["growth_tracker"].append(scaler._get_growth_tracker())
        record["stepped"].append(steps_after > steps_before)
        record["clip_total"].append(total.item() if math.isfinite(total.item()) else str(total.item()))
        opt.zero_grad()
    for n, p in params.items():
        tensors[f"{case}.final.{n}"] = p.detach().clone()
    record["state_dict"] = scaler.state_dict()
    meta["cases"][case] = record

scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
loss32 = torch.tensor(3.3, dtype=torch.float32)
loss16 = torch.tensor(3.3, dtype=torch.float16)
tensors["scale.loss32"] = loss32
tensors["scale.scaled32"] = scaler.scale(loss32)
tensors["scale.loss16"] = loss16
tensors["scale.scaled16"] = scaler.scale(loss16)

out = Path(sys.argv[1])
save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "grad_scaler.safetensors"))
meta["torch_version"] = torch.__version__
(out / "grad_scaler.json").write_text(json.dumps(meta, indent=2))
