"""Reference for 4-bit quantization (models/tests/it/bitsandbytes.rs): bitsandbytes 0.50.2's CPU
backend, transformers 5.23's `BitsAndBytesConfig` loading and saving, peft 0.21.2's LoRA over
`Linear4bit`.

Usage: python bitsandbytes_4bit.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/functional.safetensors: `quantize_4bit` of three weights (`a` [96, 64] and `b` [33, 41]
(an odd count: a short last block, an odd nibble) in float32, `c` [64, 64] in bfloat16) for
nf4 / fp4 with and without double quantization — `<w>.<type>.<dq>.packed`, `.absmax`,
`.quant_map`, `.nested_absmax`, `.nested_quant_map`, `.offset`, the dequantized weight in
float32 and bfloat16 (`.deq_f32`, `.deq_bf16`); `dynamic_map` (`create_dynamic_map()`); and
`quantize_blockwise` of `v` (5000 values) with it, blocks of 256 (`blockwise.q`,
`blockwise.absmax`: the C kernel's lookup table).

OUT_DIR/linear.safetensors: `bnb.nn.Linear4bit(64, 96)` (nf4, double quantization, bias) over
`a`, in training mode (the AVX512-bf16 inference path off): for the compute dtypes float32 and
bfloat16 and under CPU bfloat16 autocast (`f32.`, `bf16.`, `autocast.`), the input `x` [2, 5, 64],
the output, the output's gradient `g`, and the input's and the bias's gradients.

OUT_DIR/base/: a tiny Llama (2 layers, hidden 64, MLP 128, untied head) in float32: every linear
layer's input width a multiple of the block size 64, as in the hub's models (bitsandbytes'
AVX512 dequantization kernel reads each row's absmax as if rows held whole blocks, which gives
other numbers than its own scalar and torch paths where they do not). OUT_DIR/prequantized/:
it loaded with `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True)` and saved (transformers' 4-bit checkpoint). OUT_DIR/lora/: peft's
`LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])` on the
pre-quantized model as peft_experts.py's `adapt` draws it (`initial.safetensors`, every lora_B
redrawn, `adapter/`), and `run.safetensors`: models.py's 2 x 8 batch, the logits (training mode,
no gradient), the loss and the adapter's gradients in float32 and under CPU bfloat16 autocast (the
backward after it), as qwen3_5.py's `run` records them.

OUT_DIR/trainer_qlora/: QLoRA trained 20 steps by the Trainer (see `trainer`).

OUT_DIR/families/<case>/: the newer families' tiny models and their 4-bit saves (see `families`).
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
    g = torch.Generator().manual_seed(11)
    weights = {
        "a": torch.randn(96, 64, generator=g) * 0.05,
        "b": torch.randn(33, 41, generator=g) * 0.3,
        "c": (torch.randn(64, 64, generator=g) * 0.02).to(torch.bfloat16),
    }
    out = {"dynamic_map": F.create_dynamic_map(signed=True)}
    for w, t in weights.items():
        out[w] = t
        for qt in ["nf4", "fp4"]:
            for dq in [False, True]:
                key = f"{w}.{qt}.{int(dq)}"
                packed, st = F.quantize_4bit(t, blocksize=64, quant_type=qt, compress_statistics=dq)
                out[f"{key}.packed"] = packed
                out[f"{key}.absmax"] = st.absmax
                out[f"{key}.quant_map"] = st.code
                if dq:
                    out[f"{key}.nested_absmax"] = st.state2.absmax
                    out[f"{key}.nested_quant_map"] = st.state2.code
                    out[f"{key}.offset"] = st.offset.reshape(1)
                out[f"{key}.deq_f32"] = F.dequantize_4bit(packed, st).float()
                out[f"{key}.deq_bf16"] = torch.ops.bitsandbytes.dequantize_4bit.default(
                    packed, F.dequantize_blockwise(st.absmax, st.state2) + st.offset if dq else st.absmax,
                    64, qt, st.shape, torch.bfloat16,
                )
    v = torch.randn(5000, generator=g) * 0.7
    q, absmax = torch.ops.bitsandbytes.quantize_blockwise.default(v, out["dynamic_map"], 256)
    out.update({"v": v, "blockwise.q": q, "blockwise.absmax": absmax})
    save_file({k: x.contiguous() for k, x in out.items()}, str(OUT / "functional.safetensors"))
    return weights["a"]


def linear(a):
    g = torch.Generator().manual_seed(12)
    bias = torch.randn(96, generator=g) * 0.1
    x0 = torch.randn(2, 5, 64, generator=g)
    grad = torch.randn(2, 5, 96, generator=g)
    out = {"weight": a, "bias": bias, "x": x0, "g": grad}
    for prefix, compute, autocast in [("f32.", torch.float32, False), ("bf16.", torch.bfloat16, False),
                                      ("autocast.", torch.float32, True)]:
        layer = bnb.nn.Linear4bit(64, 96, bias=True, compute_dtype=compute, compress_statistics=True,
                                  quant_type="nf4")
        layer.weight = bnb.nn.Params4bit(a.clone(), requires_grad=False, quant_type="nf4",
                                         compress_statistics=True).to("cpu")
        layer.bias = torch.nn.Parameter(bias.clone())
        layer.train()
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = layer(x)
        y.backward(grad.to(y.dtype))
        out[f"{prefix}y"] = y.detach()
        out[f"{prefix}x_grad"] = x.grad
        out[f"{prefix}bias_grad"] = layer.bias.grad
        if prefix == "f32.":
            out["packed"] = layer.weight.data
            for k, v in layer.weight.quant_state.as_dict(packed=True).items():
                out[f"state.{k}"] = v
    save_file({k: x.contiguous() for k, x in out.items()}, str(OUT / "linear.safetensors"))


def run(model, kwargs, labels, prefix, tensors, autocast):
    """qwen3_5.py's `run` with the logits in training mode (bitsandbytes' inference path on
    AVX512-bf16 CPUs packs the weights for a fused bf16 kernel; training runs the dequantizing
    one, which this reference pins)."""
    context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    model.train()
    with torch.no_grad(), context:
        tensors[f"{prefix}logits"] = model(**kwargs).logits.float().contiguous()
    model.zero_grad()
    with context:
        out = model(**kwargs, labels=labels)
    loss = out.loss.float()
    loss.backward()
    tensors[f"{prefix}loss"] = loss.detach().reshape(1)
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"{prefix}grad.{name}"] = p.grad.detach().contiguous()


def models():
    config = tf.LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).save_pretrained(OUT / "base")
    q = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    base = tf.AutoModelForCausalLM.from_pretrained(OUT / "base", quantization_config=q)
    base.save_pretrained(OUT / "prequantized")
    base = tf.AutoModelForCausalLM.from_pretrained(OUT / "prequantized")
    ids, mask = sibling("models").batch(1000)
    labels = ids.masked_fill(mask == 0, -100)
    kwargs = dict(input_ids=ids, attention_mask=mask)
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    run(base, kwargs, labels, "base.", tensors, autocast=False)
    (OUT / "lora").mkdir()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    model, _ = sibling("peft_experts").adapt(base, lora, OUT / "lora")
    run(model, kwargs, labels, "", tensors, autocast=False)
    run(model, kwargs, labels, "autocast.", tensors, autocast=True)
    save_file(tensors, str(OUT / "lora" / "run.safetensors"))
    print("loss", float(tensors["loss"]), float(tensors["autocast.loss"]))


def trainer():
    """decoder_families.py's Trainer run for QLoRA: the tiny Llama at SmolLM2's vocabulary in
    float32 (`initial/`), loaded in 4 bits (nf4, double quantization), peft's LoRA drawn after
    `torch.manual_seed(1)` (`adapter_config/`), trained 20 steps on the Hamlet blocks. The
    evaluation runs bitsandbytes' dequantizing path: its fused AVX512-bf16 inference kernel
    (`support_avx512bf16_for_cpu`, machine-dependent, bf16 arithmetic) is turned off."""
    parity = sibling("trainer_parity")
    blocks = parity.llama_blocks()
    train_rows, eval_rows = blocks[:48], blocks[48:56]
    name = "trainer_qlora"
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
    q = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    base = tf.AutoModelForCausalLM.from_pretrained(folder / "initial", quantization_config=q)
    for module in base.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
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


FAMILIES = [("decoder_families", "qwen3_moe"), ("decoder_families", "qwen2_moe"),
            ("decoder_families", "gpt_oss"), ("qwen3_5", "qwen3_5_text"), ("gemma4", "gemma4_text"),
            ("gemma4", "gemma4_text_moe")]


def families():
    """The newer families' tiny models (their scripts' `cases()`, seeded as they seed them,
    saved as OUT_DIR/families/<case>/base/) loaded in 4 bits (nf4, double quantization) and
    saved (OUT_DIR/families/<case>/prequantized/): which linear layers transformers quantizes
    in each (routers, shared-expert gates, Gated DeltaNet's projections, Gemma 4's per-layer
    projection), and their codes."""
    q = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    for script, case in FAMILIES:
        _, config, cls = next(c for c in sibling(script).cases() if c[0] == case)
        folder = OUT / "families" / case
        torch.manual_seed(0)
        cls(config).save_pretrained(folder / "base")
        tf.AutoModelForCausalLM.from_pretrained(folder / "base", quantization_config=q).save_pretrained(
            folder / "prequantized"
        )


def main():
    torch.set_num_threads(2)
    linear(functional())
    models()
    trainer()
    families()


if __name__ == "__main__":
    main()
