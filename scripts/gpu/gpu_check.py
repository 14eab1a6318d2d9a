"""The device check of `cargo xtask gpu-bundle`: runs on the GPU machine, from the bundle's
folder, with that machine's own Python, torch and transformers (no Rust, no network):

    python gpu_check.py --out OUT [--steps N] [--minutes M]

`cargo xtask gpu-check` runs the same script here, on the CPU, as a dry run (`--torch-lib`
points our binary at the libtorch the bundle was built against, a tiny model stands in).

What it does, each step timed and written to OUT/check.json, the table printed last:

 1. The machine: `nvidia-smi`, `ldd bin/run_clm` (every library found), a CUDA probe
    (device, capability, memory) and the measured matmul rate of an [8192, 8192] product in
    bf16 and in fp32 without TF32 (the best of 5, CUDA events): MFU is against the bf16 one.
 2. A SmolLM2-135M-shaped Llama (the bundle's config.json, 30 x 576, 49152 tokens) drawn
    from `torch.manual_seed(0)` and saved with `save_pretrained`: both sides start from the
    same weights. On the CPU (the dry run) a 2 x 64 model of the same config stands in.
 3. Causal-LM fine-tuning on hamlet.txt, upstream's run_clm steps (the text builder's lines
    with their line breaks, the tokenizer per line, `group_texts` per 1000 lines, blocks of
    `--block-size`), batch 8, lr 1e-4, `--steps` optimizer steps, a loss logged every step,
    `skip_memory_metrics=False`, no saving, no evaluation:
      * ours: `bin/run_clm` with the same flags (`run_clm`'s own data path);
      * upstream's: transformers' `Trainer` in this process's Python on the same blocks
        (the `datasets` package is not needed);
    in fp32, bf16 and fp16 (each with its parity bound: see BOUNDS), bf16 with activation
    checkpointing (`gradient_checkpointing`: the memory it saves), and ours only: bf16 over
    an NCCL process group of one (`WORLD_SIZE=1`, the collectives run), and ZeRO-3 with the
    optimizer and the parameters offloaded to the CPU (DeepSpeed's JSON; upstream's side
    would need deepspeed, which the machine does not have).
 4. Per run: the per-step losses against upstream's (the largest relative difference),
    tokens/s (`train_samples_per_second` x block size: the same definition on both sides),
    MFU (6 x parameters x tokens/s over the bf16 matmul rate), the peak GPU memory
    (`before_init_mem_gpu + init/train alloc deltas + train peaked delta`, upstream's
    `TrainerMemoryTracker` keys on both sides).

Exit status 0 when every run finished and every parity bound held; the table and
OUT/check.json say which did not.
"""

import argparse
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Largest relative difference of a step's loss against upstream's, per regime. fp32: the
# same kernels in a different order (cuBLAS picks per shape; attention through SDPA on
# both sides); bf16 / fp16: autocast's rounding on top, over a few tens of steps.
BOUNDS = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2, "bf16_ckpt": 2e-2}


def log(msg):
    print(f"gpu-check: {msg}", flush=True)


def sh(cmd, **kw):
    """A command's output (stdout and stderr), or why it could not run."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
        return r.returncode, (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine(torch, binary, env):
    info = {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    code, out = sh(["nvidia-smi"])
    info["nvidia_smi"] = out if code == 0 else f"unavailable: {out}"
    code, out = sh(["ldd", str(binary)], env=env)
    info["ldd"] = out
    info["ldd_missing"] = [l.strip() for l in out.splitlines() if "not found" in l]
    info["cuda"] = torch.cuda.is_available()
    if info["cuda"]:
        p = torch.cuda.get_device_properties(0)
        info["device"] = p.name
        info["capability"] = f"{p.major}.{p.minor}"
        info["memory_gib"] = round(p.total_memory / 2**30, 1)
    return info


def matmul_rate(torch, dtype, n, device):
    """The best of 5 [n, n] x [n, n] products, in FLOP/s."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = math.inf
    for _ in range(6):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            torch.cuda.synchronize()
            t = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            a @ b
            t = time.perf_counter() - t0
        best = min(best, t)
    return 2 * n**3 / best


def make_model(torch, out, cuda):
    """The SmolLM2-135M-shaped model from the bundle's config, drawn from seed 0."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = HERE / "data" / "smollm2"
    config = AutoConfig.from_pretrained(src)
    if not cuda:
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 64, 128
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def blocks(tokenizer, text, block_size):
    """run_clm's data path without `datasets`: the text builder's lines (line breaks kept),
    tokenized one by one, grouped per 1000 lines into blocks (the remainder dropped)."""
    lines = text.splitlines(keepends=True)
    out = []
    for i in range(0, len(lines), 1000):
        ids = [t for line in lines[i : i + 1000] for t in tokenizer(line)["input_ids"]]
        n = (len(ids) // block_size) * block_size
        out += [ids[j : j + block_size] for j in range(0, n, block_size)]
    return out


def common_flags(a, model_dir, out):
    # The CPU dry run says so on both sides (upstream refuses bf16 on the CPU without it).
    return {
        "use_cpu": not a.cuda,
        "model_name_or_path": str(model_dir),
        "train_file": str(HERE / "data" / "hamlet.txt"),
        "block_size": a.block_size,
        "do_train": True,
        "per_device_train_batch_size": 8,
        "learning_rate": 1e-4,
        "max_steps": a.steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "skip_memory_metrics": False,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "output_dir": str(out),
        # Every line of hamlet.txt trains: no validation split taken off it.
        "validation_split_percentage": 0,
    }


def regime_flags(regime):
    return {
        "fp32": {},
        "bf16": {"bf16": True},
        "fp16": {"fp16": True},
        "bf16_ckpt": {"bf16": True, "gradient_checkpointing": True},
        "bf16_nccl": {"bf16": True},
        "zero3_offload": {"bf16": True, "deepspeed": str(HERE / "zero3_offload.json")},
    }[regime]


def run_upstream(torch, a, model_dir, out, regime):
    """transformers' Trainer on run_clm's blocks, in this process."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, default_data_collator

    flags = {**common_flags(a, model_dir, out), **regime_flags(regime)}
    for k in ["model_name_or_path", "train_file", "block_size", "validation_split_percentage"]:
        flags.pop(k)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = blocks(tokenizer, (HERE / "data" / "hamlet.txt").read_text(), a.block_size)
    train = [{"input_ids": r, "labels": list(r)} for r in rows]
    args = TrainingArguments(**flags)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=default_data_collator)
    metrics = trainer.train().metrics
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    del trainer, model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return metrics, losses


def run_ours(a, model_dir, out, regime, env):
    flags = {**common_flags(a, model_dir, out), **regime_flags(regime)}
    cmd = [str(a.binary)]
    for k, v in flags.items():
        cmd += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    env = dict(env)
    if regime in ("bf16_nccl", "zero3_offload"):
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.run_timeout)
    (out / "ours.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "ours.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"run_clm failed ({r.returncode}) after {time.time() - t0:.0f}s:\n{tail}")
    metrics = json.loads((out / "train_results.json").read_text())
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    return metrics, losses


def peak_gib(m):
    keys = ["before_init_mem_gpu", "init_mem_gpu_alloc_delta", "train_mem_gpu_alloc_delta", "train_mem_gpu_peaked_delta"]
    if not all(k in m for k in keys):
        return None
    return sum(m[k] for k in keys) / 2**30


def summary(m, block_size, params, peak):
    tps = m.get("train_samples_per_second", float("nan")) * block_size
    return {
        "tokens_per_s": tps,
        "mfu": 6 * params * tps / peak if peak else None,
        "peak_gib": peak_gib(m),
        "train_runtime": m.get("train_runtime"),
    }


def rel_diff(ours, theirs):
    if not ours or len(ours) != len(theirs):
        return None
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(ours, theirs))


def fmt(x, spec):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 40 on a GPU, 3 on the CPU)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per row (default 512 on a GPU, 64 on the CPU)")
    p.add_argument("--minutes", type=float, default=8.0, help="stop starting runs after this long")
    p.add_argument("--regimes", default="fp32,bf16,fp16,bf16_ckpt,bf16_nccl,zero3_offload")
    p.add_argument("--torch-lib", type=Path, default=None, help="the libtorch our binary runs on (default: this Python's torch/lib)")
    p.add_argument("--run-timeout", type=int, default=300)
    a = p.parse_args()
    t_start = time.time()
    import torch

    cuda = a.cuda = torch.cuda.is_available()
    a.steps = a.steps or (40 if cuda else 3)
    a.block_size = a.block_size or (512 if cuda else 64)
    a.binary = HERE / "bin" / "run_clm"
    a.out.mkdir(parents=True, exist_ok=True)
    torch_lib = a.torch_lib or Path(torch.__file__).parent / "lib"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{torch_lib}:{env.get('LD_LIBRARY_PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", str(min(os.cpu_count() or 1, 16)))
    result = {"machine": machine(torch, a.binary, env), "runs": {}, "errors": {}}
    log(f"torch {torch.__version__}, CUDA {'yes: ' + result['machine'].get('device', '') if cuda else 'no: the CPU dry run'}")
    if result["machine"]["ldd_missing"]:
        log("libraries not found: " + "; ".join(result["machine"]["ldd_missing"]))
    device = "cuda" if cuda else "cpu"
    n = 8192 if cuda else 512
    torch.backends.cuda.matmul.allow_tf32 = False
    result["matmul_bf16_flops"] = matmul_rate(torch, torch.bfloat16, n, device)
    result["matmul_fp32_flops"] = matmul_rate(torch, torch.float32, n, device)
    log(f"matmul [{n}]^2: bf16 {result['matmul_bf16_flops'] / 1e12:.1f} TFLOP/s, fp32 {result['matmul_fp32_flops'] / 1e12:.1f} TFLOP/s")
    model_dir = a.out / "model"
    params = make_model(torch, model_dir, cuda)
    result["params"] = params
    log(f"model: {params / 1e6:.1f}M parameters in {model_dir}")

    for regime in a.regimes.split(","):
        if time.time() - t_start > a.minutes * 60:
            result["errors"][regime] = f"not started: past --minutes {a.minutes}"
            continue
        entry = {}
        sides = ["ours"] if regime in ("bf16_nccl", "zero3_offload") else ["ours", "upstream"]
        if not cuda and regime == "fp16":
            # fp16 autocast on the CPU needs a loss scaler's kwargs here and is slow; the GPU
            # runs it.
            result["errors"][regime] = "skipped on the CPU"
            continue
        for side in sides:
            out = a.out / regime / side
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.time()
            try:
                if side == "ours":
                    m, losses = run_ours(a, model_dir, out, regime, env)
                else:
                    m, losses = run_upstream(torch, a, model_dir, out, regime)
            except Exception as e:  # noqa: BLE001 - reported in the table, the check goes on
                result["errors"][f"{regime}/{side}"] = str(e)
                log(f"{regime} {side}: FAILED: {e}")
                continue
            entry[side] = {**summary(m, a.block_size, params, result["matmul_bf16_flops"]), "losses": losses}
            log(f"{regime} {side}: {entry[side]['tokens_per_s']:.0f} tokens/s, peak {fmt(entry[side]['peak_gib'], '.2f')} GiB, {time.time() - t0:.0f}s")
        if "ours" in entry and "upstream" in entry:
            entry["max_rel_diff"] = rel_diff(entry["ours"]["losses"], entry["upstream"]["losses"])
            entry["bound"] = BOUNDS.get(regime)
        result["runs"][regime] = entry
        (a.out / "check.json").write_text(json.dumps(result, indent=2))

    ok = not result["errors"] or all(v == "skipped on the CPU" for v in result["errors"].values())
    lines = [
        f"GPU check: {result['machine'].get('device', 'CPU dry run')}, torch {torch.__version__}, "
        f"transformers {result['machine']['transformers']}, {params / 1e6:.1f}M parameters, "
        f"{a.steps} steps x 8 x {a.block_size} tokens; bf16 matmul {result['matmul_bf16_flops'] / 1e12:.1f} TFLOP/s",
        "",
        "| run | ours tokens/s | upstream tokens/s | ours / upstream | ours MFU | upstream MFU | ours peak GiB | upstream peak GiB | loss max rel diff | bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for regime, e in result["runs"].items():
        o, u = e.get("ours", {}), e.get("upstream", {})
        ratio = o["tokens_per_s"] / u["tokens_per_s"] if o and u and u["tokens_per_s"] else None
        diff, bound = e.get("max_rel_diff"), e.get("bound")
        held = diff is None or bound is None or diff <= bound
        ok = ok and held
        lines.append(
            f"| {regime} | {fmt(o.get('tokens_per_s'), '.0f')} | {fmt(u.get('tokens_per_s'), '.0f')} | {fmt(ratio, '.2f')} "
            f"| {fmt(o.get('mfu'), '.1%')} | {fmt(u.get('mfu'), '.1%')} | {fmt(o.get('peak_gib'), '.2f')} | {fmt(u.get('peak_gib'), '.2f')} "
            f"| {fmt(diff, '.2e')}{'' if held else ' OVER'} | {fmt(bound, '.0e')} |"
        )
    for k, v in result["errors"].items():
        lines.append(f"- {k}: {v.splitlines()[0] if v else v}")
    lines.append(f"\n{time.time() - t_start:.0f}s in all; details in {a.out / 'check.json'}")
    result["ok"] = ok
    (a.out / "check.json").write_text(json.dumps(result, indent=2))
    (a.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
