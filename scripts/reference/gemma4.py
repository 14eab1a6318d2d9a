"""Reference for Gemma 4 (trainer/tests/it/decoder_families.rs, models/tests/it): transformers
5.23's `modeling_gemma4.py` through SDPA.

Usage: python gemma4.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Tiny seeded models (hidden 64, 4 heads of 16, 2 key / value heads, sliding window 4), saved into
OUT_DIR/<case>/:

  gemma4_text        Gemma4ForCausalLM with every dense part: six layers (sliding, sliding,
                     full, sliding, sliding, full), the full layers' heads of 32 with one
                     key / value head whose values are the keys' projection
                     (attention_k_eq_v), the last two layers reusing layers 2 and 3's keys
                     and values with MLPs twice as wide (num_kv_shared_layers 2,
                     use_double_wide_mlp), per-layer input embeddings of 8, the logits
                     soft-capped at 30, every `layer_scalar` set to its own value
  gemma4_text_moe    Gemma4ForCausalLM with the experts beside each MLP (4 experts of 32, 2
                     per token, the router's scales and per-expert scales drawn), no per-layer
                     inputs, no sharing, the full layers with their own `v_proj`
  gemma4             Gemma4ForConditionalGeneration (a `gemma4` checkpoint: gemma4_text's
                     language model under `model.language_model.`, a tiny vision tower beside
                     it), its image token id one of the batch's ids (embedded as the pad
                     token, as upstream's placeholders are); OUT_DIR/gemma4.saved/ is what
                     `save_pretrained` writes after AutoModelForCausalLM loaded it

OUT_DIR/<case>.safetensors holds what qwen3_5.py records (the 2 x 8 batch of models.py: logits,
loss, every gradient in float32 and under CPU bfloat16 autocast, the backward after the
autocast region as the Trainer's); OUT_DIR/<case>.long.safetensors the same on qwen3_5.py's
2 x 150 batch. <case>.parameters.json is `named_parameters()`'s order, <case>.generate.safetensors
greedy and beam search as models.py's `record_generate`.

OUT_DIR/trainer_<case>/: gemma4_text and gemma4_text_moe at trainer_parity.py's FAMILY_VOCAB
trained 20 steps by the Trainer as decoder_families.py trains its families.
"""

import importlib.util
import json
from pathlib import Path

import torch

import transformers as tf

HERE = Path(__file__).resolve().parent


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = dict(
    hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=256, sliding_window=4, pad_token_id=0,
)
DENSE = dict(
    BASE, num_hidden_layers=6,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
    num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
    final_logit_softcapping=30.0,
)
MOE = dict(
    BASE, num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    global_head_dim=32, hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4,
    top_k_experts=2, moe_intermediate_size=32,
)


def text_config(kind, vocab):
    return tf.Gemma4TextConfig(**(DENSE if kind == "dense" else MOE), vocab_size=vocab,
                               vocab_size_per_layer_input=vocab)


def cases(vocab=1000):
    return [
        ("gemma4_text", text_config("dense", vocab), tf.Gemma4ForCausalLM),
        ("gemma4_text_moe", text_config("moe", vocab), tf.Gemma4ForCausalLM),
    ]


def seeded(cls, config):
    """The model as `cls(config)` draws it, then the weights upstream initialises to ones
    drawn too (each `layer_scalar`, the routers' scales), so that they count."""
    torch.manual_seed(0)
    m = cls(config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, t in list(m.named_parameters()) + list(m.named_buffers()):
            if name.endswith(("layer_scalar", "router.scale", "router.per_expert_scale")):
                t.copy_(0.5 + torch.rand(t.shape, generator=g))
    return m


def vlm_config(image_token_id):
    return tf.Gemma4Config(
        text_config=dict(DENSE, vocab_size=1000, vocab_size_per_layer_input=1000),
        vision_config=dict(
            hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, head_dim=8, patch_size=4, position_embedding_size=32,
        ),
        audio_config=None,
        image_token_id=image_token_id,
    )


def models(out, models_ref, qwen3_5):
    ids, _ = models_ref.batch(1000)
    image_token_id = int(ids[0, 3])
    vlm = seeded(tf.Gemma4ForConditionalGeneration, vlm_config(image_token_id))
    vlm.save_pretrained(out / "gemma4")
    for case, config, cls in cases() + [("gemma4", None, None)]:
        if config is None:
            m = tf.AutoModelForCausalLM.from_pretrained(out / case)
            m.save_pretrained(out / f"{case}.saved")
        else:
            m = seeded(cls, config)
            m.save_pretrained(out / case)
        vocab = m.config.get_text_config().vocab_size
        tensors = qwen3_5.record(out, case, m, *models_ref.batch(vocab))
        qwen3_5.record(out, case, m, *qwen3_5.long_batch(vocab), suffix=".long")
        models_ref.record_generate(case, m, *models_ref.batch(vocab))
        names = [name for name, _ in m.named_parameters()]
        (out / f"{case}.parameters.json").write_text(json.dumps(names))
        print(case, float(tensors["loss"]))


def main():
    parity = sibling("trainer_parity")
    families = sibling("decoder_families")
    models(parity.OUT, sibling("models"), sibling("qwen3_5"))
    for case, config, cls in cases(vocab=parity.FAMILY_VOCAB):
        families.train(parity, case, config, cls)


if __name__ == "__main__":
    main()
