"""Reference for optim/tests/optimizers.rs: 50 steps of every optimizer, and clip_grad_norm_.

Parameters and the gradients of every step are seeded and saved, so the Rust test feeds the
very same tensors. Two param groups: group 0 ("decay": a 2-d matrix and a 3-d tensor) with
weight decay, group 1 ("no decay": a 1-d bias and a norm weight) without, and its own lr.
torch.optim runs its CPU default (single-tensor) path unless the case says fused.

Lion has no torch.optim class: the reference is lion-pytorch's `update_fn` (lucidrains,
lion_pytorch/lion_pytorch.py, v0.2), which bitsandbytes' 32-bit Lion also computes,
transcribed below op for op.

Usage: python optim_parity.py OUT_DIR
Writes OUT_DIR/optim_parity.safetensors (inputs, results) and OUT_DIR/optim_parity.json
(cases with their hyper-parameters, clip totals).
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers.optimization import Adafactor

STEPS = 50
SHAPES = {
    "weight": (8, 6),
    "conv": (2, 3, 4),
    "bias": (6,),
    "norm.weight": (6,),
}
GROUPS = [["weight", "conv"], ["bias", "norm.weight"]]

torch.manual_seed(0)
init = {n: torch.randn(s, dtype=torch.float32) for n, s in SHAPES.items()}
grads = {n: torch.randn((STEPS, *s), dtype=torch.float32) * 0.5 for n, s in SHAPES.items()}


class Lion(torch.optim.Optimizer):
    """lion-pytorch's Lion (decoupled_weight_decay=False), op for op."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, lr, wd = p.grad, group["lr"], group["weight_decay"]
                beta1, beta2 = group["betas"]
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.data.mul_(1.0 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(grad, alpha=1.0 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(grad, alpha=1.0 - beta2)


# name -> (class, defaults for the constructor, group-0 overrides, group-1 overrides)
CASES = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, foreach=False), dict(weight_decay=0.1), dict(weight_decay=0.0, lr=5e-3)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, amsgrad=True, foreach=False), dict(weight_decay=0.05), dict(weight_decay=0.0)),
    "adamw_maximize": (torch.optim.AdamW, dict(lr=1e-3, maximize=True, foreach=False), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "adamw_fused": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, fused=True), dict(weight_decay=0.1), dict(weight_decay=0.0, lr=5e-3)),
    "adamw_fused_amsgrad": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, amsgrad=True, fused=True), dict(weight_decay=0.05), dict(weight_decay=0.0)),
    "adam": (torch.optim.Adam, dict(lr=1e-2, foreach=False), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "adam_fused": (torch.optim.Adam, dict(lr=1e-2, fused=True), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "sgd": (torch.optim.SGD, dict(lr=0.05, foreach=False), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, foreach=False), dict(weight_decay=0.01), dict(weight_decay=0.0, lr=0.02)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, foreach=False), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "sgd_fused": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, fused=True), dict(weight_decay=0.01), dict(weight_decay=0.0, lr=0.02)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01, eps=1e-10, initial_accumulator_value=0.1, foreach=False), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=0.01, foreach=False), dict(weight_decay=0.0), dict(weight_decay=0.0)),
    "rmsprop_centered_momentum": (torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, eps=1e-6, momentum=0.9, centered=True, foreach=False), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "adafactor": (Adafactor, dict(), dict(), dict()),
    "adafactor_trainer": (Adafactor, dict(lr=1e-3, scale_parameter=False, relative_step=False), dict(weight_decay=0.01), dict(weight_decay=0.0)),
    "adafactor_warmup_init": (Adafactor, dict(warmup_init=True), dict(), dict()),
    "adafactor_beta1": (Adafactor, dict(lr=1e-2, beta1=0.9, clip_threshold=0.5, decay_rate=-0.6, eps=(1e-30, 1e-2), relative_step=False), dict(weight_decay=0.1), dict(weight_decay=0.0)),
    "lion": (Lion, dict(lr=1e-3, betas=(0.9, 0.99)), dict(weight_decay=0.1), dict(weight_decay=0.0)),
}


def jsonable(d):
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


tensors = {f"init.{n}": t for n, t in init.items()}
tensors.update({f"grads.{n}": g for n, g in grads.items()})
meta = {"steps": STEPS, "groups": GROUPS, "shapes": {n: list(s) for n, s in SHAPES.items()}, "cases": {}}

for case, (cls, defaults, g0, g1) in CASES.items():
    params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    groups = [
        {"params": [params[n] for n in GROUPS[0]], **g0},
        {"params": [params[n] for n in GROUPS[1]], **g1},
    ]
    opt = cls(groups, **defaults)
    for step in range(STEPS):
        for n, p in params.items():
            p.grad = grads[n][step].clone()
        opt.step()
        if step == 0:
            for n, p in params.items():
                tensors[f"{case}.step1.{n}"] = p.detach().clone()
    for n, p in params.items():
        tensors[f"{case}.final.{n}"] = p.detach().clone()
    meta["cases"][case] = {
        "defaults": jsonable({k: v for k, v in defaults.items() if k not in ("foreach",)}),
        "groups": [jsonable(g0), jsonable(g1)],
    }

# clip_grad_norm_: the gradients of step 0, scaled so that some cases clip and some do not.
clip_cases = {
    "l2_clip": dict(max_norm=1.0, norm_type=2.0),
    "l2_noclip": dict(max_norm=100.0, norm_type=2.0),
    "inf_clip": dict(max_norm=0.5, norm_type=float("inf")),
    "l1_clip": dict(max_norm=2.0, norm_type=1.0),
    "l3_clip": dict(max_norm=1.5, norm_type=3.0),
}
meta["clip"] = {}
for case, kw in clip_cases.items():
    params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    for n, p in params.items():
        p.grad = grads[n][0].clone() * 2.0
    total = torch.nn.utils.clip_grad_norm_(list(params.values()), **kw)
    for n, p in params.items():
        tensors[f"clip.{case}.{n}"] = p.grad.detach().clone()
    meta["clip"][case] = {
        "max_norm": kw["max_norm"],
        "norm_type": "inf" if kw["norm_type"] == float("inf") else kw["norm_type"],
        "total_norm": total.item(),
    }

out = Path(sys.argv[1])
save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "optim_parity.safetensors"))
meta["torch_version"] = torch.__version__
(out / "optim_parity.json").write_text(json.dumps(meta, indent=2))

# get_decay_parameter_names on small GPT-2 / BERT / Llama models built from configs, with the
# paths of their nn.LayerNorm modules (what the Rust side passes for the LayerNorm rule).
import transformers as tf  # noqa: E402
from transformers import Trainer  # noqa: E402

models = {
    "gpt2": tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)),
    "bert": tf.BertForSequenceClassification(tf.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                                           intermediate_size=64, vocab_size=100)),
    "llama": tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                                num_key_value_heads=1, intermediate_size=64, vocab_size=100)),
}
meta["decay"] = {}
for kind, model in models.items():
    meta["decay"][kind] = {
        "names": [n for n, _ in model.named_parameters(remove_duplicate=False)],
        "layernorm_modules": [n for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)],
        "decay": Trainer.get_decay_parameter_names(None, model),
    }
(out / "optim_parity.json").write_text(json.dumps(meta, indent=2))
