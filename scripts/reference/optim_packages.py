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

# transformers' `_get_torchao_optimizer` passes optim_args' `block_size` on as a string, and
# torchao's `_new_buffer` then fails (`numel % "128"`: TypeError) on any parameter of 4096
# elements or more. tchtrain reads it as the integer it names; so does the reference.
import torchao.optim.adam  # noqa: E402

_torchao_adam_init = torchao.optim.adam._AdamBase.__init__


def _int_block_size_init(self, *args, block_size, **kwargs):
    _torchao_adam_init(self, *args, block_size=int(block_size), **kwargs)


torchao.optim.adam._AdamBase.__init__ = _int_block_size_init

# galore_torch's AdamW8bit calls `torch.cuda.synchronize()` after every parameter's update,
# which fails without CUDA; the rest of its step runs on a CPU (bitsandbytes' CPU backend does
# the 8-bit update). The reference runs the package's algorithm on the CPU, its CUDA-only
# synchronize call stubbed.
torch.cuda.synchronize = lambda *args, **kwargs: None

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
    # schedulefree: warmup_steps reaches AdamW / SGD as given (a ratio too: 0.5 makes the
    # first step's lr twice the base, as upstream), RAdam ignores it.
    "schedule_free_adamw": dict(optim="schedule_free_adamw"),
    "schedule_free_adamw_warmup_args": dict(optim="schedule_free_adamw", warmup_steps=5, optim_args="weight_lr_power=1.5,r=0.5"),
    "schedule_free_adamw_warmup_ratio_betas": dict(optim="schedule_free_adamw", warmup_steps=0.5, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6),
    "schedule_free_sgd": dict(optim="schedule_free_sgd"),
    "schedule_free_sgd_warmup_args": dict(optim="schedule_free_sgd", learning_rate=0.05, warmup_steps=5, optim_args="weight_lr_power=1.5,r=0.5"),
    "schedule_free_radam": dict(optim="schedule_free_radam"),
    "schedule_free_radam_args": dict(optim="schedule_free_radam", warmup_steps=5, adam_beta2=0.99, optim_args="weight_lr_power=1.5,r=0.5"),
    # LOMO / AdaLomo: updated inside `fused_backward(loss, lr)`, from a backward of
    # sum(p * g) whose gradients are the reference's.
    "lomo": dict(optim="lomo"),
    "adalomo": dict(optim="adalomo"),
    "adalomo_lr": dict(optim="adalomo", learning_rate=5e-2),
    # GaLore / APOLLO: update_proj_gap=10 so the projection is recomputed within the 50 steps
    "galore_adamw": dict(optim="galore_adamw", optim_target_modules=["proj", "head"], optim_args="rank=8,update_proj_gap=10,scale=0.25"),
    "galore_adamw_regex_reverse_std": dict(optim="galore_adamw", optim_target_modules=r"pro.*", optim_args="rank=8,update_proj_gap=10,proj_type=reverse_std"),
    "galore_adamw_all_linear_full": dict(optim="galore_adamw", optim_target_modules="all-linear", optim_args="rank=6,update_proj_gap=7,scale=0.5,proj_type=full"),
    "galore_adamw_left": dict(optim="galore_adamw", optim_target_modules=["head", "embed"], optim_args="rank=4,update_proj_gap=10,proj_type=left"),
    "galore_adamw_right": dict(optim="galore_adamw", optim_target_modules=["pro"], optim_args="rank=4,update_proj_gap=10,proj_type=right", adam_beta1=0.8),
    "galore_adafactor": dict(optim="galore_adafactor", optim_target_modules=["proj", "head"], optim_args="rank=8,update_proj_gap=10,scale=0.25"),
    "galore_adafactor_all_linear_full": dict(optim="galore_adafactor", optim_target_modules="all_linear", optim_args="rank=6,update_proj_gap=7,proj_type=full"),
    # GaLoreAdamW8bit: the Trainer passes only lr (bitsandbytes' eps 1e-8 and weight decay 1e-2
    # stay) and, "bitsandbytes" not being in the class's name, no 32-bit override: the
    # embedding (4608 elements) keeps 8-bit state in every case. Projected states are 80x8 /
    # 8x80 (32-bit) but for rank=52, where proj's 80x52 = 4160 elements (17 blocks, the last
    # partial) are 8-bit.
    "galore_adamw_8bit": dict(optim="galore_adamw_8bit", optim_target_modules=["proj", "head"], optim_args="rank=8,update_proj_gap=10,scale=0.25"),
    "galore_adamw_8bit_reverse_std": dict(optim="galore_adamw_8bit", optim_target_modules=r"pro.*", optim_args="rank=8,update_proj_gap=10,proj_type=reverse_std"),
    "galore_adamw_8bit_rank52": dict(optim="galore_adamw_8bit", optim_target_modules=["proj"], optim_args="rank=52,update_proj_gap=10,scale=0.5"),
    "galore_adamw_8bit_all_linear_full": dict(optim="galore_adamw_8bit", optim_target_modules="all-linear", optim_args="rank=6,update_proj_gap=7,scale=0.5,proj_type=full"),
    "apollo_adamw": dict(optim="apollo_adamw", optim_target_modules=["proj", "head"], optim_args="rank=8,update_proj_gap=10"),
    "apollo_adamw_tensor_reverse_std": dict(optim="apollo_adamw", optim_target_modules="all-linear", optim_args="rank=4,update_proj_gap=10,scale=2,scale_type=tensor,proj_type=reverse_std", adam_epsilon=1e-7),
    "apollo_adamw_svd": dict(optim="apollo_adamw", optim_target_modules=["proj", "head"], optim_args="rank=8,proj=svd,update_proj_gap=10,scale=0.5"),
    "apollo_adamw_left": dict(optim="apollo_adamw", optim_target_modules=r"(proj|head)", optim_args="rank=4,update_proj_gap=9,proj_type=left,scale_type=tensor"),
    "apollo_adamw_right": dict(optim="apollo_adamw", optim_target_modules=["proj", "head"], optim_args="rank=4,update_proj_gap=9,proj_type=right,scale_type=tensor"),
    # Layer-wise GaLore / APOLLO: one optimizer per parameter, stepped by post-accumulate-grad
    # hooks during `loss.backward()` (gradient_accumulation_steps stays 1, as upstream needs).
    "galore_adamw_layerwise": dict(optim="galore_adamw_layerwise", optim_target_modules=["proj", "head"], optim_args="rank=8,update_proj_gap=10,scale=0.25"),
    "galore_adamw_layerwise_all_linear_full": dict(optim="galore_adamw_layerwise", optim_target_modules="all-linear", optim_args="rank=6,update_proj_gap=7,scale=0.5,proj_type=full"),
    "galore_adamw_8bit_layerwise": dict(optim="galore_adamw_8bit_layerwise", optim_target_modules=["proj", "head"], optim_args="rank=8,update_proj_gap=10,scale=0.25"),
    "galore_adamw_8bit_layerwise_rank52": dict(optim="galore_adamw_8bit_layerwise", optim_target_modules=["proj"], optim_args="rank=52,update_proj_gap=10,scale=0.5"),
    "apollo_adamw_layerwise": dict(optim="apollo_adamw_layerwise", optim_target_modules=["proj", "head"], optim_args="rank=8,update_proj_gap=10"),
    "apollo_adamw_layerwise_tensor_reverse_std": dict(optim="apollo_adamw_layerwise", optim_target_modules="all-linear", optim_args="rank=4,update_proj_gap=10,scale=2,scale_type=tensor,proj_type=reverse_std", adam_epsilon=1e-7),
    "apollo_adamw_layerwise_svd": dict(optim="apollo_adamw_layerwise", optim_target_modules=["proj", "head"], optim_args="rank=8,proj=svd,update_proj_gap=10,scale=0.5"),
    # bitsandbytes (0.50.2 on CPU: paged falls back to non-paged; 8-bit state above min_8bit_size)
    "adamw_bnb_8bit": dict(optim="adamw_bnb_8bit"),
    "adamw_8bit": dict(optim="adamw_8bit"),
    "adamw_8bit_betas": dict(optim="adamw_8bit", adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6),
    "paged_adamw_32bit": dict(optim="paged_adamw_32bit"),
    "paged_adamw_8bit": dict(optim="paged_adamw_8bit"),
    "ademamix": dict(optim="ademamix"),
    "ademamix_8bit": dict(optim="ademamix_8bit"),
    "paged_ademamix_32bit": dict(optim="paged_ademamix_32bit"),
    "paged_ademamix_8bit": dict(optim="paged_ademamix_8bit"),
    "ademamix_schedules": dict(optim="ademamix", optim_args="t_alpha=20,t_beta3=30"),
    "ademamix_8bit_args": dict(optim="ademamix_8bit", optim_args="beta1=0.8,beta2=0.99,beta3=0.999,alpha=3.0,eps=1e-6,t_alpha=20,t_beta3=30"),
    "lion_8bit": dict(optim="lion_8bit"),
    "paged_lion_8bit": dict(optim="paged_lion_8bit"),
    "lion_32bit": dict(optim="lion_32bit"),
    "paged_lion_32bit": dict(optim="paged_lion_32bit", adam_beta1=0.95, adam_beta2=0.98),
    "rmsprop_bnb": dict(optim="rmsprop_bnb"),
    "rmsprop_bnb_8bit": dict(optim="rmsprop_bnb_8bit"),
    "rmsprop_bnb_32bit": dict(optim="rmsprop_bnb_32bit"),
    "rmsprop_bnb_8bit_optim_bits_arg": dict(optim="rmsprop_bnb_8bit", optim_args="optim_bits=32"),
    # torchao (AdamW8bit / AdamW4bit; the Trainer passes block_size=256 to both). block_size=1024
    # leaves the embedding (4608 elements, not a multiple) in fp32 state.
    "adamw_torch_8bit": dict(optim="adamw_torch_8bit"),
    "adamw_torch_4bit": dict(optim="adamw_torch_4bit"),
    "adamw_torch_8bit_block128": dict(optim="adamw_torch_8bit", optim_args="block_size=128"),
    "adamw_torch_4bit_block128": dict(optim="adamw_torch_4bit", optim_args="block_size=128"),
    "adamw_torch_8bit_block1024": dict(optim="adamw_torch_8bit", optim_args="block_size=1024", adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6),
    "adamw_torch_4bit_args": dict(optim="adamw_torch_4bit", optim_args="block_size=1024,bf16_stochastic_round=True", adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6),
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
    # bitsandbytes' GlobalOptimManager is a process-wide singleton: the Trainer's 32-bit
    # override of embeddings (by parameter position) would leak from one case into the next.
    import bitsandbytes

    bitsandbytes.optim.GlobalOptimManager._instance = None
    model = Tiny()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, report_to=[], **{**BASE, **overrides})
        trainer = Trainer(model=model, args=args)
        # lomo-optim's AdaLomo allocates its state with `.cuda()`: on this CPU the reference
        # keeps it on the CPU (the package's algorithm, unchanged).
        cuda = torch.Tensor.cuda
        torch.Tensor.cuda = lambda self, *a, **k: self
        try:
            opt = trainer.create_optimizer()
        finally:
            torch.Tensor.cuda = cuda
    params = dict(model.named_parameters())
    # Layer-wise: a dummy optimizer; each parameter's own optimizer steps in its hook.
    layerwise = getattr(opt, "optimizer_dict", None)
    for step in range(STEPS):
        if layerwise is not None:
            # upstream's training_step: `accelerator.backward(loss)` runs the hooks (the
            # dummy's step / zero_grad do nothing, the Trainer's clip finds no gradient)
            loss = sum((p * grads[n][step]).sum() for n, p in params.items())
            loss.backward()
            continue
        if hasattr(opt, "fused_backward"):
            # upstream's training_step: accelerator.backward(loss, learning_rate=lr)
            loss = sum((p * grads[n][step]).sum() for n, p in params.items())
            opt.fused_backward(loss, args.learning_rate)
            continue
        for n, p in params.items():
            p.grad = grads[n][step].clone()
        if hasattr(opt, "train") and callable(opt.train):
            opt.train()
        opt.step()
        opt.zero_grad()
    for n, p in params.items():
        tensors[f"{name}.final.{n}"] = p.detach().clone()
    names = {id(p): n for n, p in params.items()}
    inner = list(layerwise.values()) if layerwise is not None else [opt]
    states = [(p, st) for o in inner for p, st in o.state.items()]
    for p, st in states:
        for k, v in st.items():
            if torch.is_tensor(v) and id(p) in names:
                key = f"{name}.state.{names[id(p)]}.{k}"
                if hasattr(v, "codes") and hasattr(v, "scale"):  # torchao's quantized states
                    tensors[f"{key}.codes"] = v.codes.detach().clone()
                    tensors[f"{key}.scale"] = v.scale.detach().clone()
                    tensors[f"{key}.qmap"] = v.qmap.detach().clone()
                else:
                    tensors[key] = v.detach().clone()
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
            for o in inner
            for g in o.param_groups
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
