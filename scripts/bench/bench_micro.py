"""Micro-benchmarks of PyTorch / transformers on CPU, fp32: the counterpart of
examples/src/bin/bench_micro.rs, for `cargo xtask bench --micro`.

Measures the same things on the same data as the Rust example:

* optimizer step time on a ~30M-parameter set (8 x [1920, 1920] weights + 8 x [1920] biases,
  fixed random grads, one param group): torch.optim.AdamW(foreach=False) (`adamw_torch`),
  torch.optim.AdamW(fused=True) (`adamw_torch_fused`), torch.optim.SGD(momentum=0.9,
  foreach=False), transformers' Adafactor with the Trainer's settings (lr=1e-3,
  scale_parameter=False, relative_step=False). Median of --steps steps after --warmup steps
  (`min_ms`: the fastest step).
* the package-backed `optim` names (PACKAGE_OPTIMS), each built by upstream's
  `Trainer.get_optimizer_cls_and_kwargs` (optim, learning_rate=1e-3,
  optim_target_modules="all-linear") over a module whose eight Linear layers hold the
  parameter set, one group. Every optimizer row reports `state_bytes`: the optimizer's state
  after the steps (each storage counted once; torchao's codes and scales).
* collator throughput: DataCollatorWithPadding and DataCollatorForLanguageModeling(mlm, seed=42)
  on the hamlet.txt lines longer than 20 characters, tokenized with the MiniLM tokenizer
  (input_ids, token_type_ids, attention_mask, special_tokens_mask as lists), 32 rows per batch.
  `median_ms` is the mean batch time of the median of --passes passes (after one warm-up pass),
  `min_ms` that of the fastest pass; `tokens_per_s` counts real (unpadded) tokens.

Prints one flat JSON object per line, with "impl": "python".

Usage: python bench_micro.py [--threads N] [--steps N] [--warmup N] [--passes N]
                             [--only optim|collate|dropout]
Assets: $TCHTRAIN_ASSETS or <workspace>/assets.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
)
from transformers.optimization import Adafactor

LAYERS = 8
WIDTH = 1920
BATCH_ROWS = 32
MIN_LINE_CHARS = 20
MLM_SEED = 42


PACKAGE_OPTIMS = [
    "stable_adamw", "grokadamw", "schedule_free_adamw", "schedule_free_sgd", "schedule_free_radam",
    "paged_adamw_32bit", "adamw_bnb_8bit", "ademamix", "ademamix_8bit", "lion_8bit",
    "rmsprop_bnb_8bit", "galore_adamw", "galore_adafactor", "apollo_adamw", "adamw_torch_8bit",
    "adamw_torch_4bit",
]


def state_bytes(opt):
    seen, total = set(), 0
    # GrokAdamW keeps its state in each param group (`group["state"]`), not in `opt.state`.
    states = list(opt.state.values()) + [
        st for g in opt.param_groups for st in g.get("state", {}).values()
    ]
    for st in states:
        for v in st.values():
            if hasattr(v, "codes"):  # torchao's quantized states
                parts = [v.codes, v.scale, v.qmap]
            elif hasattr(v, "ortho_matrix"):  # GaLore / APOLLO projectors (tensors inside)
                m = v.ortho_matrix
                parts = list(m) if isinstance(m, (list, tuple)) else [m]
            else:
                parts = [v]
            for t in parts:
                if torch.is_tensor(t) and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total


def package_optimizer(name, params):
    """The optimizer upstream's Trainer builds for `optim=name` over the parameter set."""
    import tempfile

    from transformers import Trainer, TrainingArguments

    # optimi 0.3.3 picks its Triton kernel on a CPU when triton imports (see
    # scripts/reference/optim_packages.py): run its single-tensor path.
    import optimi.stableadamw  # noqa: F401
    import sys
    sys.modules["optimi.stableadamw"]._default_to_triton = lambda params: False

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
    for i, layer in enumerate(model.layers):
        layer.weight, layer.bias = params[2 * i], params[2 * i + 1]
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, report_to=[], optim=name, learning_rate=1e-3,
                                 optim_target_modules="all-linear")
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    groups = kwargs.pop("params", list(model.parameters()))
    opt = cls(groups, **kwargs)
    if hasattr(opt, "train"):
        opt.train()
    return opt


def parameter_set():
    torch.manual_seed(0)
    params = []
    for _ in range(LAYERS):
        w = torch.nn.Parameter(torch.randn(WIDTH, WIDTH))
        b = torch.nn.Parameter(torch.randn(WIDTH) * 0.02)
        params += [w, b]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def bench_optimizer(name, threads, args, make):
    params = parameter_set()
    opt = make(params)
    for _ in range(args.warmup):
        opt.step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({
        "bench": f"optim/{name}",
        "impl": "python",
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "steps": args.steps,
        "params": sum(p.numel() for p in params),
        "threads": threads,
        "state_bytes": state_bytes(opt),
    }), flush=True)


def bench_collator(name, threads, args, batches, collator):
    tokens = sum(len(f["input_ids"]) for b in batches for f in b)
    padded = 0

    def one_pass():
        nonlocal padded
        t0 = time.perf_counter()
        for b in batches:
            out = collator(b)
            padded += out["input_ids"].shape[1]
        return time.perf_counter() - t0

    one_pass()
    times = [one_pass() for _ in range(args.passes)]
    pass_s = statistics.median(times)
    print(json.dumps({
        "bench": f"collate/{name}",
        "impl": "python",
        "median_ms": pass_s * 1e3 / len(batches),
        "min_ms": min(times) * 1e3 / len(batches),
        "tokens_per_s": tokens / pass_s,
        "batches": len(batches),
        "rows_per_batch": BATCH_ROWS,
        "tokens": tokens,
        "threads": threads,
        "padded_len_sum": padded // (args.passes + 1),
    }), flush=True)


DROPOUT_CALLS = 20


def bench_dropout(shape, p, threads, args):
    torch.manual_seed(0)
    x = torch.randn(shape)
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        for _ in range(DROPOUT_CALLS):
            torch.nn.functional.dropout(x, p, training=True)
        if step >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3 / DROPOUT_CALLS)
    print(json.dumps({
        "bench": f"dropout/{'x'.join(map(str, shape))}_p{p}",
        "impl": "python",
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "threads": threads,
    }), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default: torch's own, the core count)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--only", choices=["optim", "collate", "dropout"], default=None)
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    assets = Path(os.environ.get("TCHTRAIN_ASSETS", Path(__file__).resolve().parents[2] / "assets"))

    if args.only in (None, "optim"):
        bench_optimizer("adamw_torch", threads, args,
                        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=False))
        bench_optimizer("adamw_torch_fused", threads, args,
                        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, fused=True))
        bench_optimizer("sgd_momentum", threads, args,
                        lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, foreach=False))
        bench_optimizer("adafactor", threads, args,
                        lambda p: Adafactor(p, lr=1e-3, scale_parameter=False, relative_step=False))
        for name in PACKAGE_OPTIMS:
            bench_optimizer(name, threads, args, lambda p, name=name: package_optimizer(name, p))

    if args.only in (None, "dropout"):
        for shape in ([4, 128, 576], [4, 128, 1536]):
            for p in (0.05, 0.1):
                bench_dropout(shape, p, threads, args)

    if args.only in (None, "collate"):
        tokenizer = AutoTokenizer.from_pretrained(str(assets / "minilm"))
        text = (assets / "text" / "hamlet.txt").read_text()
        lines = [l.strip() for l in text.splitlines() if len(l.strip()) > MIN_LINE_CHARS]
        rows = [dict(tokenizer(l, return_special_tokens_mask=True)) for l in lines]
        batches = [rows[i:i + BATCH_ROWS] for i in range(0, len(rows) - BATCH_ROWS + 1, BATCH_ROWS)]
        bench_collator("with_padding", threads, args, batches, DataCollatorWithPadding(tokenizer))
        mlm = DataCollatorForLanguageModeling(tokenizer, mlm=True, seed=MLM_SEED)
        bench_collator("language_modeling_mlm", threads, args, batches, mlm)


if __name__ == "__main__":
    main()
