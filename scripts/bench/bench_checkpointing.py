"""Upstream's side of `cargo xtask bench --activation-memory` (see
examples/src/bin/bench_checkpointing.rs): SmolLM2-135M (assets/smollm2-135m, fp32, training
mode) on batches of --batch rows of 512 tokens (the same ids: torch.manual_seed(0), randint),
forward and backward --steps times, with or without `activation_checkpointing_enable()`;
one flat JSON line with the same fields.

Usage: python bench_checkpointing.py [--activation_checkpointing] [--batch N] [--steps N] [--threads N]
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import transformers as tf

BLOCK = 512


def status_mb(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024.0
    return 0.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--activation_checkpointing", action="store_true")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = tf.AutoModelForCausalLM.from_pretrained(Path(os.environ["TCHTRAIN_ASSETS"]) / "smollm2-135m")
    if a.activation_checkpointing:
        model.activation_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    param_mb = sum(t.numel() * 4 for t in model.parameters() if t.requires_grad) / 2**20
    torch.manual_seed(0)
    ids = torch.randint(49152, (a.batch, BLOCK))
    baseline = status_mb("VmRSS:")
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        del loss
        model.zero_grad(set_to_none=False)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    peak = status_mb("VmHWM:")
    print(json.dumps({
        "impl": "python", "activation_checkpointing": a.activation_checkpointing, "batch": a.batch,
        "block": BLOCK, "baseline_rss_mb": baseline, "peak_rss_mb": peak, "param_mb": param_mb,
        "activation_mb": peak - baseline - param_mb, "median_step_ms": times[len(times) // 2],
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
