"""Reference for LoRA on Gemma 4's layers with peft 0.21.2 on transformers 5.23
(trainer/tests/it/decoder_families.rs).

Usage: python peft_gemma4.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

gemma4.py's tiny dense Gemma 4 (`gemma4_text`: key / value sharing, per-layer inputs; seeded
as gemma4.py seeds it, saved as OUT_DIR/base/) under `LoraConfig(r=2, lora_alpha=4,
target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "per_layer_input_gate"])`
(the layers that reuse keys and values have no k_proj / v_proj, the full layers no v_proj)
drawn after `torch.manual_seed(1)`, then as peft_experts.py: OUT_DIR/initial.safetensors the
adapter as drawn, every lora_B redrawn from N(0, 0.1) after `torch.manual_seed(2)`, the adapter
saved as OUT_DIR/adapter/, and OUT_DIR/run.safetensors the logits, loss and every trainable
gradient on models.py's 2 x 8 batch, in float32 and under CPU bfloat16 autocast (`autocast.*`,
the backward outside it).
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
    gemma4 = sibling("gemma4")
    qwen3_5 = sibling("qwen3_5")
    _, config, cls = gemma4.cases()[0]
    gemma4.seeded(cls, config).save_pretrained(OUT / "base")
    base = cls.from_pretrained(OUT / "base")
    lora = LoraConfig(
        r=2, lora_alpha=4,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "per_layer_input_gate"],
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
