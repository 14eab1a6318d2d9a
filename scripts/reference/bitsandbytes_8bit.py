"""Reference for 8-bit quantization (LLM.int8) and for merging LoRA into quantized layers
(trainer/tests/it/bitsandbytes.rs): bitsandbytes 0.50.2's CPU backend, transformers 5.23's
`BitsAndBytesConfig(load_in_8bit=True)` loading and saving, peft 0.21.2's LoRA over
`Linear8bitLt` and its `merge_and_unload` over 8-bit and 4-bit layers.

Usage: python bitsandbytes_8bit.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/functional.safetensors: `int8_vectorwise_quant` of `w` [96, 64] in float16 (as
`Int8Params` quantizes a weight: `w.cb`, `w.scb`) and its `int8_vectorwise_dequant`
(`w.deq`); of activations `a` [12, 64] in float16 holding outliers, with threshold 6 (`a.6.cb`,
`a.6.scb`, `a.6.cols`) and 0 (`a.0.cb`, `a.0.scb`), and of its first row alone (`a1.6.*`: one
row keeps its outlier columns' codes).

OUT_DIR/linear.safetensors: `bnb.nn.Linear8bitLt(64, 96, has_fp16_weights=False,
threshold=6.0)` over `w` with a bias: the input `x` [2, 5, 64] (two outliers), the output's
gradient `g`; in training mode (`MatMul8bitFp`) and evaluation mode (`MatMul8bitLt`, LLM.int8's
int8 product with the outlier columns in float32), each plain and under CPU bfloat16 autocast
(`train.`, `train_autocast.`, `eval.`, `eval_autocast.`): the output, the input's and the
bias's gradients.

OUT_DIR/base/: a tiny Llama (2 layers, hidden 64, MLP 128, untied head) in float32.
OUT_DIR/prequantized/: it loaded with `BitsAndBytesConfig(load_in_8bit=True)` and saved
(transformers' 8-bit checkpoint: int8 `weight`, `SCB`, `weight_format`). OUT_DIR/lora/: peft's
`LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])` on the
pre-quantized model drawn as peft_experts.py's `adapt` draws it, and `run.safetensors`:
models.py's 2 x 8 batch, the logits in training mode (no gradient), the loss and the adapter's
gradients in float32 and under CPU bfloat16 autocast, the logits in evaluation mode (`eval.`,
the int8 product) for the base and the adapted model, and after `merge_and_unload()` the merged
layers' `weight` and `SCB` (`merged.<key>`) and the evaluation logits (`merged.eval.logits`).

OUT_DIR/merge4/: the same adapter drawn over the base loaded in 4 bits (nf4, double
quantization; `adapter/`) and merged: the merged layers' packed weights and states
(`merged.safetensors`).

OUT_DIR/dora4/: DoRA (`use_dora=True`, the same targets) over the base loaded in 4 bits (nf4,
double quantization), drawn as `adapt` draws it (the magnitude from the dequantized weight),
`run.safetensors` (training mode, float32 and autocast, as `lora/`) and after
`merge_and_unload()` the merged layers' tensors (`merged.<key>`). (DoRA over the 8-bit base
fails in peft 0.21.2 on the CPU: `dequantize_module_weight` moves the weight, whose copy loses
its `SCB`, and the next forward reads `None`.)

OUT_DIR/trainer_qlora8/: LoRA over the 8-bit base trained 20 steps by the Trainer (see
`trainer`).
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import bitsandbytes as bnb
import bitsandbytes.functional as F
import transformers as tf
from peft import LoraConfig, get_peft_model

OUT = Path(sys.argv[1])
HERE = Path(__file__).resolve().parent


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def functional():
    g = torch.Generator().manual_seed(21)
    w = torch.randn(96, 64, generator=g) * 0.05
    a = torch.randn(12, 64, generator=g) * 2.0
    a[3, 5] = 7.5
    a[7, 40] = -9.0
    a[9, 5] = 6.0
    out = {"w": w, "a": a}
    cb, scb, _ = F.int8_vectorwise_quant(w.half())
    out.update({"w.cb": cb, "w.scb": scb, "w.deq": F.int8_vectorwise_dequant(cb, scb)})
    for threshold in [6, 0]:
        cb, scb, cols = F.int8_vectorwise_quant(a.half(), threshold=float(threshold))
        out.update({f"a.{threshold}.cb": cb, f"a.{threshold}.scb": scb})
        if cols is not None:
            out[f"a.{threshold}.cols"] = cols
    cb, scb, cols = F.int8_vectorwise_quant(a[3:4].half(), threshold=6.0)
    out.update({"a1.6.cb": cb, "a1.6.scb": scb, "a1.6.cols": cols})
    save_file({k: x.contiguous() for k, x in out.items()}, str(OUT / "functional.safetensors"))
    return w


def linear(w):
    g = torch.Generator().manual_seed(22)
    bias = torch.randn(96, generator=g) * 0.1
    x0 = torch.randn(2, 5, 64, generator=g)
    x0[0, 1, 7] = 8.0
    x0[1, 3, 20] = -6.5
    grad = torch.randn(2, 5, 96, generator=g)
    out = {"weight": w, "bias": bias, "x": x0, "g": grad}
    for prefix, training, autocast in [("train.", True, False), ("train_autocast.", True, True),
                                       ("eval.", False, False), ("eval_autocast.", False, True)]:
        layer = bnb.nn.Linear8bitLt(64, 96, bias=True, has_fp16_weights=False, threshold=6.0)
        layer.weight = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False).to("cpu")
        layer.bias = torch.nn.Parameter(bias.clone())
        layer.train(training)
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = layer(x)
        y.backward(grad.to(y.dtype))
        out[f"{prefix}y"] = y.detach()
        out[f"{prefix}x_grad"] = x.grad
        out[f"{prefix}bias_grad"] = layer.bias.grad
        if prefix == "train.":
            out["cb"] = layer.state.CB
            out["scb"] = layer.state.SCB
    save_file({k: x.contiguous() for k, x in out.items()}, str(OUT / "linear.safetensors"))


def eval_logits(model, kwargs, prefix, tensors):
    model.eval()
    with torch.no_grad():
        tensors[f"{prefix}eval.logits"] = model(**kwargs).logits.float().contiguous()


def models():
    config = tf.LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).save_pretrained(OUT / "base")
    q = tf.BitsAndBytesConfig(load_in_8bit=True)
    base = tf.AutoModelForCausalLM.from_pretrained(OUT / "base", quantization_config=q)
    base.save_pretrained(OUT / "prequantized")
    base = tf.AutoModelForCausalLM.from_pretrained(OUT / "prequantized")
    ids, mask = sibling("models").batch(1000)
    labels = ids.masked_fill(mask == 0, -100)
    kwargs = dict(input_ids=ids, attention_mask=mask)
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    four = sibling("bitsandbytes_4bit")
    four.run(base, kwargs, labels, "base.", tensors, autocast=False)
    eval_logits(base, kwargs, "base.", tensors)
    (OUT / "lora").mkdir()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    model, _ = sibling("peft_experts").adapt(base, lora, OUT / "lora")
    four.run(model, kwargs, labels, "", tensors, autocast=False)
    four.run(model, kwargs, labels, "autocast.", tensors, autocast=True)
    eval_logits(model, kwargs, "", tensors)
    merged = model.merge_and_unload()
    for key, t in merged.state_dict().items():
        if any(m in key for m in ["q_proj", "v_proj", "down_proj"]) and key.endswith((".weight", ".SCB")):
            tensors[f"merged.{key}"] = t.contiguous()
    eval_logits(merged, kwargs, "merged.", tensors)
    save_file(tensors, str(OUT / "lora" / "run.safetensors"))
    print("loss", float(tensors["loss"]), float(tensors["autocast.loss"]))

    # The same adapter over the 4-bit base, merged.
    (OUT / "merge4").mkdir()
    q4 = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    base4 = tf.AutoModelForCausalLM.from_pretrained(OUT / "base", quantization_config=q4)
    model4, _ = sibling("peft_experts").adapt(base4, lora, OUT / "merge4")
    merged4 = model4.merge_and_unload()
    out = {k: t.contiguous() for k, t in merged4.state_dict().items()
           if any(m in k for m in ["q_proj", "v_proj", "down_proj"])}
    save_file(out, str(OUT / "merge4" / "merged.safetensors"))


def dora():
    ids, mask = sibling("models").batch(1000)
    labels = ids.masked_fill(mask == 0, -100)
    kwargs = dict(input_ids=ids, attention_mask=mask)
    four = sibling("bitsandbytes_4bit")
    targets = ["q_proj", "v_proj", "down_proj"]
    for name, q in [
        ("dora4", tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)),
    ]:
        (OUT / name).mkdir()
        base = tf.AutoModelForCausalLM.from_pretrained(OUT / "base", quantization_config=q)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=targets, use_dora=True, task_type="CAUSAL_LM")
        model, _ = sibling("peft_experts").adapt(base, lora, OUT / name)
        tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        four.run(model, kwargs, labels, "", tensors, autocast=False)
        four.run(model, kwargs, labels, "autocast.", tensors, autocast=True)
        merged = model.merge_and_unload()
        for key, t in merged.state_dict().items():
            if any(m in key for m in targets):
                tensors[f"merged.{key}"] = t.contiguous()
        save_file(tensors, str(OUT / name / "run.safetensors"))
        print(name, float(tensors["loss"]), float(tensors["autocast.loss"]))


def trainer():
    """bitsandbytes_4bit.py's QLoRA Trainer run over the base loaded in 8 bits: the tiny Llama
    at SmolLM2's vocabulary in float32 (`initial/`), `BitsAndBytesConfig(load_in_8bit=True)`,
    peft's LoRA drawn after `torch.manual_seed(1)` (`adapter_config/`), trained 20 steps on the
    Hamlet blocks (training runs `MatMul8bitFp`, the evaluations LLM.int8's int8 product)."""
    parity = sibling("trainer_parity")
    blocks = parity.llama_blocks()
    train_rows, eval_rows = blocks[:48], blocks[48:56]
    name = "trainer_qlora8"
    folder = OUT / name
    folder.mkdir()
    (folder / "blocks.json").write_text(json.dumps({"train": train_rows, "eval": eval_rows}))
    config = tf.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).save_pretrained(folder / "initial")
    base = tf.AutoModelForCausalLM.from_pretrained(
        folder / "initial", quantization_config=tf.BitsAndBytesConfig(load_in_8bit=True)
    )
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    torch.manual_seed(1)
    model = get_peft_model(base, lora)
    model.peft_config["default"].save_pretrained(folder / "adapter_config")
    args = parity.common_args(
        name, per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=20,
        learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.1,
        max_grad_norm=1.0, eval_strategy="steps", eval_steps=10,
    )

    def rows(part):
        return parity.Rows([{"input_ids": r, "labels": list(r)} for r in part])

    t = tf.Trainer(model=model, args=args, train_dataset=rows(train_rows), eval_dataset=rows(eval_rows),
                   data_collator=tf.default_data_collator)
    result = t.train()
    parity.write_run(name, t, result, model)
    print(name, t.state.log_history[-1])


def main():
    torch.set_num_threads(2)
    linear(functional())
    models()
    dora()
    trainer()


if __name__ == "__main__":
    main()
