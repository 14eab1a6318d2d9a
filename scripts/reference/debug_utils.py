"""Reference for `debug="underflow_overflow"`: upstream's DebugUnderflowOverflow reports.

Usage: python debug_utils.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

For the tiny GPT-2 (LM head), Llama (causal LM) and BERT (masked LM) checkpoints of the
assets, and a tiny Qwen2 and Qwen3 made here (OUT_DIR/qwen2/, OUT_DIR/qwen3/), OUT_DIR/<case>.safetensors holds the batch (input_ids, attention_mask, labels) and
OUT_DIR/<case>.json what transformers 5.23's DebugUnderflowOverflow printed and raised:
  trace       train mode (dropout on), torch.manual_seed(0) before each of two forwards,
              trace_batch_nums=[1]: the second forward's every frame
  overflow    eval mode, one weight of the second layer set to inf: the frames before the
              first inf and the ValueError
  abort       eval mode, max_frames_to_save=3, abort_after_batch_num=1: three forwards
The model's `use_cache` is false, as the Trainer sets it. GPT-2 and BERT get no padded
row: upstream's tracer fails on the boolean padding mask their layers then receive.
"""

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf
from transformers.debug_utils import DebugUnderflowOverflow

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
torch.set_num_threads(2)
OUT.mkdir(parents=True, exist_ok=True)

# Tiny Qwen2 (q/k/v biases, the last layer sliding over 4 tokens) and Qwen3 (q/k RMSNorm),
# made here (seeded) and saved into OUT_DIR/<case>/.
SMALL = dict(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=96, max_position_embeddings=256, vocab_size=1000,
)
for case, config, cls in [
    ("qwen2", tf.Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=1), tf.Qwen2ForCausalLM),
    ("qwen3", tf.Qwen3Config(**SMALL, head_dim=32), tf.Qwen3ForCausalLM),
]:
    torch.manual_seed(0)
    cls(config).save_pretrained(OUT / case)

CASES = {
    # case: (asset, class, padded batch, the weight set to inf)
    "gpt2": ("tiny-gpt2", tf.GPT2LMHeadModel, False, "transformer.h.1.mlp.c_fc.weight"),
    "llama": ("tiny-llama", tf.LlamaForCausalLM, True, "model.layers.1.mlp.up_proj.weight"),
    "bert": ("tiny-bert", tf.BertForMaskedLM, False, "bert.encoder.layer.1.intermediate.dense.weight"),
    "qwen2": (OUT / "qwen2", tf.Qwen2ForCausalLM, True, "model.layers.1.mlp.up_proj.weight"),
    "qwen3": (OUT / "qwen3", tf.Qwen3ForCausalLM, True, "model.layers.1.mlp.up_proj.weight"),
}


def load(asset, cls):
    model = cls.from_pretrained(ASSETS / asset if isinstance(asset, str) else asset)
    model.config.use_cache = False
    return model


def run(model, tracer_kwargs, forwards, batch, seeds=None):
    """Registers a tracer, runs `forwards` forwards; returns (stdout, error message)."""
    buf = io.StringIO()
    error = None
    with contextlib.redirect_stdout(buf):
        DebugUnderflowOverflow(model, **tracer_kwargs)
        for i in range(forwards):
            if seeds is not None:
                torch.manual_seed(seeds[i])
            try:
                model(**batch)
            except ValueError as e:
                error = str(e)
                break
    return buf.getvalue(), error


for case, (asset, cls, padded, inf_weight) in CASES.items():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 90, (2, 6), generator=g)
    mask = torch.ones(2, 6, dtype=torch.int64)
    if padded:
        mask[1, 4:] = 0
    labels = ids.clone()
    labels[mask == 0] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    save_file({k: v.contiguous() for k, v in batch.items()}, str(OUT / f"{case}.safetensors"))

    result = {}
    model = load(asset, cls).train()
    result["trace"] = run(model, {"trace_batch_nums": [1]}, 2, batch, seeds=[0, 0])

    model = load(asset, cls).eval()
    with torch.no_grad():
        model.get_parameter(inf_weight)[0, 0] = float("inf")
    result["overflow"] = run(model, {}, 1, batch)

    model = load(asset, cls).eval()
    result["abort"] = run(model, {"max_frames_to_save": 3, "abort_after_batch_num": 1}, 3, batch)

    result = {k: {"stdout": v[0], "error": v[1]} for k, v in result.items()}
    result["inf_weight"] = inf_weight
    (OUT / f"{case}.json").write_text(json.dumps(result, indent=1))
    print(case, {k: len(v["stdout"]) for k, v in result.items() if isinstance(v, dict)})
