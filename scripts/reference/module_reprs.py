"""Reference for models/tests/it/module_repr.rs: what `print(model)` shows (torch 2.13's module
tree with transformers 5.23's class names), the text W&B's model artifacts carry as
`model_architecture.txt`.

Usage: python module_reprs.py OUT_DIR

OUT_DIR/<case>/: a tiny model of each architecture whose tree tchtrain writes out, saved with
`save_pretrained`, and `repr.txt`, `str(model)`. The configs change what shows in the text:
sizes, grouped key-value heads, biases, norms' epsilons, dropout probabilities, the padding
index, the activation.
"""

import sys
from pathlib import Path

import torch

import transformers as tf

OUT = Path(sys.argv[1])
SMALL = dict(vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2)

CASES = {
    "gpt2_lm": (tf.GPT2LMHeadModel, tf.GPT2Config(
        vocab_size=96, n_positions=40, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.05, embd_pdrop=0.0,
        attn_pdrop=0.25, layer_norm_epsilon=1e-6, bos_token_id=0, eos_token_id=0)),
    "gpt2_cls": (tf.GPT2ForSequenceClassification, tf.GPT2Config(
        vocab_size=96, n_positions=40, n_embd=16, n_layer=3, n_head=2, n_inner=24, activation_function="relu",
        num_labels=3, bos_token_id=0, eos_token_id=0, pad_token_id=0)),
    "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**SMALL, rms_norm_eps=1e-5, pad_token_id=0)),
    "llama_bias_cls": (tf.LlamaForSequenceClassification, tf.LlamaConfig(
        **SMALL, attention_bias=True, mlp_bias=True, num_labels=5, pad_token_id=1)),
    "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**SMALL, head_dim=8, tie_word_embeddings=True)),
    "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**SMALL)),
    "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config(**SMALL, head_dim=6)),
    "qwen3_cls": (tf.Qwen3ForSequenceClassification, tf.Qwen3Config(**SMALL, num_labels=2, pad_token_id=0)),
}


def main():
    for case, (cls, config) in CASES.items():
        torch.manual_seed(0)
        model = cls(config)
        model.save_pretrained(OUT / case)
        (OUT / case / "repr.txt").write_text(str(model), encoding="utf-8")
    print("module_reprs:", len(CASES), "cases")


if __name__ == "__main__":
    main()
