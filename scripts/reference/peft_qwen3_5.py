"""Reference for LoRA on Qwen3.5's layers with peft 0.21.2 on transformers 5.23
(trainer/tests/it/decoder_families.rs).

Usage: python peft_qwen3_5.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

qwen3_5.py's tiny Qwen3.5 (`qwen3_5_text`, seeded, saved as OUT_DIR/base/) under
`LoraConfig(r=2, lora_alpha=4, target_modules=[the gated attention's q_proj and o_proj, the
linear attention's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a and out_proj, the MLPs'
gate_proj])` drawn after `torch.manual_seed(1)`, then as peft_experts.py: OUT_DIR/initial.safetensors
the adapter as drawn, every lora_B redrawn from N(0, 0.1) after `torch.manual_seed(2)`, the
adapter saved as OUT_DIR/adapter/, and OUT_DIR/run.safetensors the logits, loss and every
trainable gradient on models.py's 2 x 8 batch, in float32 and under CPU bfloat16 autocast
(`autocast.*`, the backward outside it).
"""

import importlib.util
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from peft import LoraConfig

OUT = Path(sys.argv[1])
HERE = Path(__file__).resolve().parent


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    torch.set_num_threads(2)
    qwen3_5 = sibling("qwen3_5")
    _, config, cls = qwen3_5.cases()[0]
    torch.manual_seed(0)
    cls(config).save_pretrained(OUT / "base")
    base = cls.from_pretrained(OUT / "base")
    lora = LoraConfig(
        r=2, lora_alpha=4,
        target_modules=["q_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                        "out_proj", "gate_proj"],
        task_type="CAUSAL_LM",
    )
    model, initial = sibling("peft_experts").adapt(base, lora, OUT)
    ids, mask = sibling("models").batch(config.vocab_size)
    labels = ids.masked_fill(mask == 0, -100)
    kwargs = dict(input_ids=ids, attention_mask=mask)
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    qwen3_5.run(model, kwargs, labels, "", tensors, autocast=False)
    qwen3_5.run(model, kwargs, labels, "autocast.", tensors, autocast=True)
    save_file(tensors, str(OUT / "run.safetensors"))
    print(sorted(initial)[:4], len(initial), float(tensors["loss"]))


if __name__ == "__main__":
    main()
