"""Reference for LoRA on a mixture of experts' 3-D weights (peft's `target_parameters`,
`ParamWrapper`) with peft 0.21.2 on transformers 5.23 (trainer/tests/it/decoder_families.rs).

Usage: python peft_experts.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

decoder_families.py's tiny Qwen3-MoE (seeded, saved as OUT_DIR/base/) under
`LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])` drawn after
`torch.manual_seed(1)`: OUT_DIR/initial.safetensors is the adapter as drawn
(`get_peft_model_state_dict`). Then every lora_B is redrawn from N(0, 0.1) after
`torch.manual_seed(2)` (so that the adapters change the outputs) and the adapter saved as
OUT_DIR/adapter/. OUT_DIR/run.safetensors holds, on models.py's 2 x 8 batch (row 1's last 3
tokens padded): `logits` (evaluation mode), `loss` (with the labels, padding at -100; the
router's load-balancing term included), `aux_loss` and `grad.<name>` of every trainable parameter, and
the same with the forwards under CPU bfloat16 autocast as `autocast.*` (the backward outside
it, as the Trainer runs it).
"""

import contextlib
import importlib.util
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

OUT = Path(sys.argv[1])
HERE = Path(__file__).resolve().parent


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(model, kwargs, labels, prefix, tensors, region):
    """The forwards inside `region` (autocast or nothing), the backward outside it, as the
    Trainer runs them (accelerate's `backward` leaves the autocast region: peft folds the
    experts' adapters with autocast off, so inside it their backward would run in bfloat16)."""
    model.eval()
    with torch.no_grad(), region():
        tensors[f"{prefix}logits"] = model(**kwargs).logits.float().contiguous()
    model.zero_grad()
    with region():
        out = model(**kwargs, labels=labels)
    loss = out.loss.float()
    loss.backward()
    tensors[f"{prefix}loss"] = loss.detach().reshape(1)
    tensors[f"{prefix}aux_loss"] = out.aux_loss.detach().float().reshape(1)
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"{prefix}grad.{name}"] = p.grad.detach().contiguous()


def adapt(base, lora, out):
    """`get_peft_model` after `torch.manual_seed(1)`, the adapter as drawn saved as
    out/initial.safetensors, every lora_B redrawn from N(0, 0.1) after `torch.manual_seed(2)`,
    the adapter saved as out/adapter/; the model and the drawn adapter."""
    torch.manual_seed(1)
    model = get_peft_model(base, lora)
    initial = {k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(initial, str(out / "initial.safetensors"))
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    model.save_pretrained(out / "adapter")
    return model, initial


def main():
    torch.set_num_threads(2)
    families = sibling("decoder_families")
    _, config, cls = families.cases()[0]
    torch.manual_seed(0)
    cls(config).save_pretrained(OUT / "base")
    base = cls.from_pretrained(OUT / "base")
    lora = LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        task_type="CAUSAL_LM",
    )
    model, initial = adapt(base, lora, OUT)
    ids, mask = sibling("models").batch(config.vocab_size)
    labels = ids.masked_fill(mask == 0, -100)
    kwargs = dict(input_ids=ids, attention_mask=mask)
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    run(model, kwargs, labels, "", tensors, contextlib.nullcontext)
    run(model, kwargs, labels, "autocast.", tensors, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    save_file(tensors, str(OUT / "run.safetensors"))
    print(sorted(initial), float(tensors["loss"]))


if __name__ == "__main__":
    main()
