"""Reference for optim/tests/it/packages.rs: the `optim` names whose optimizers come from
packages (bitsandbytes, schedulefree, torch-optimi, grokadamw, galore-torch, apollo-torch,
torchao, lomo-optim), each built exactly as upstream's Trainer builds it, then 50 steps on
seeded gradients.

The optimizer of each case comes from `Trainer.create_optimizer()` on a real `Trainer` over a
tiny module, so the handler (`get_optimizer_cls_and_kwargs`), the decay / no-decay groups, the
GaLore / APOLLO target groups and the 32-bit override of embeddings under bitsandbytes' 8-bit
optimizers are upstream's own. Each step sets every gradient, calls `optimizer.train()` where
the optimizer has one (upstream's `training_step` does), `step()` and `zero_grad()`.

The module: an embedding of 4608 elements (8-bit-sized, kept in 32-bit by the Trainer's
override), a linear layer of 5120 weights (8-bit state under bitsandbytes; a GaLore / APOLLO
target), a LayerNorm and a bias-free linear head of 1920 weights (below bitsandbytes'
`min_8bit_size`, so its state stays 32-bit).

Usage: python optim_packages.py OUT_DIR [CASE ...]
Writes OUT_DIR/optim_packages.safetensors (`init.*`, `grads.*`, per case `CASE.final.*`, the
state tensors `CASE.state.PARAM.KEY`, and for optimizers with an `eval()` the parameters
after it, `CASE.eval.*`) and OUT_DIR/optim_packages.json (the cases, their arguments, the
optimizer class and its param-group hyper-parameters).
"""

import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import Trainer, TrainingArguments

warnings.filterwarnings("ignore")
torch.set_num_threads(2)

# optimi 0.3.3 picks its Triton kernel from the group's parameter list before filling it
# (`_default_to_triton([])` is True whenever triton imports, and torch installs triton), so
# upstream's `stable_adamw` fails in Triton on a CPU. The reference runs what optimi runs where
# triton is absent: its single-tensor path.
import optimi.stableadamw  # noqa: E402

sys.modules["optimi.stableadamw"]._default_to_triton = lambda params: False

STEPS = 50


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(72, 64)
        self.proj = nn.Linear(64, 80)
        self.norm = nn.LayerNorm(80)
        self.head = nn.Linear(80, 24, bias=False)

    def forward(self, input_ids=None):
        return self.head(self.norm(self.proj(self.embed(input_ids))))


# The TrainingArguments every case starts from (upstream defaults otherwise).
BASE = dict(learning_rate=1e-3, weight_decay=0.1)

# case name -> TrainingArguments overrides (`optim` at least). Cases named after an optim
# value use its defaults; suffixed cases exercise `optim_args` and other fields.
CASES = {
    "adamw_torch": dict(optim="adamw_torch"),
    "stable_adamw": dict(optim="stable_adamw"),
    "stable_adamw_decouple_lr": dict(optim="stable_adamw", optim_args="decouple_lr=True,max_lr=0.002"),
    "grokadamw": dict(optim="grokadamw"),
    "grokadamw_args": dict(optim="grokadamw", optim_args="alpha_init=0.9,lamb=1.5,gamma=0.2,grokking_signal_decay_rate=0.05,gradient_clipping=0.5"),
}

torch.manual_seed(0)
template = Tiny()
init = {n: p.detach().clone() for n, p in template.named_parameters()}
grads = {n: torch.randn((STEPS, *p.shape)) * 0.5 for n, p in init.items()}


def jsonable(v):
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k if isinstance(k, str) else type(k).__name__: jsonable(x) for k, x in v.items()}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if torch.is_tensor(v) and v.numel() == 1:
        return v.item()
    return repr(v)


def run_case(name, overrides, tensors, meta):
    model = Tiny()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, report_to=[], **{**BASE, **overrides})
        trainer = Trainer(model=model, args=args)
        opt = trainer.create_optimizer()
    params = dict(model.named_parameters())
    for step in range(STEPS):
        for n, p in params.items():
            p.grad = grads[n][step].clone()
        if hasattr(opt, "train") and callable(opt.train):
            opt.train()
        opt.step()
        opt.zero_grad()
    for n, p in params.items():
        tensors[f"{name}.final.{n}"] = p.detach().clone()
    names = {id(p): n for n, p in params.items()}
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v) and id(p) in names:
                tensors[f"{name}.state.{names[id(p)]}.{k}"] = v.detach().clone()
    if hasattr(opt, "eval") and callable(opt.eval):
        opt.eval()
        for n, p in params.items():
            tensors[f"{name}.eval.{n}"] = p.detach().clone()
    meta["cases"][name] = {
        "args": jsonable({**BASE, **overrides}),
        "class": f"{type(opt).__module__}.{type(opt).__qualname__}",
        "param_groups": [
            {
                "params": [names[id(p)] for p in g["params"]],
                # (GrokAdamW keeps a copy of its state in each group: left out)
                **{k: jsonable(v) for k, v in g.items() if k not in ("params", "state")},
            }
            for g in opt.param_groups
        ],
    }


def main():
    out = Path(sys.argv[1])
    only = sys.argv[2:]
    tensors = {f"init.{n}": t for n, t in init.items()}
    tensors.update({f"grads.{n}": g for n, g in grads.items()})
    meta = {"steps": STEPS, "params": list(init), "cases": {}}
    for name, overrides in CASES.items():
        if only and name not in only:
            continue
        run_case(name, overrides, tensors, meta)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "optim_packages.safetensors"))
    meta["torch_version"] = torch.__version__
    (out / "optim_packages.json").write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
