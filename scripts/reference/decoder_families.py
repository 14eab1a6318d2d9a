"""Reference for the decoder families added on the Llama house (trainer/tests/it/decoder_families.rs):
transformers 5.23.

Usage: python decoder_families.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Tiny seeded models of each family, saved into OUT_DIR/<case>/ (3 layers, hidden 64, 4 heads,
2 key / value heads, vocabulary 1000). The mixture-of-experts ones have 4 experts of
intermediate size 32, 2 per token, `output_router_logits=True` and `router_aux_loss_coef`
0.05 so that the auxiliary term shows:

  qwen3_moe  per-head q/k RMSNorm, head_dim 32, norm_topk_prob, layer 1 dense (mlp_only_layers)
  qwen2_moe  q/k/v biases, the shared expert (48) and its gate, layer 2 dense, layer 0 sliding
             over 3 tokens (use_sliding_window, max_window_layers 2)
  mixtral    renormalised float32 router scores, every layer sliding over 3 tokens
  olmoe      q/k RMSNorm over the whole projections, clip_qkv 0.5
  gpt_oss    attention sinks (eager), layers 0 and 2 sliding over 3 tokens, YaRN, the router's
             bias and softmax over the top-k logits, transposed experts with biases and the
             clamped interleaved SwiGLU

and the dense ones:

  granite    embedding_multiplier 4, residual_multiplier 0.5, attention_multiplier 0.2,
             logits_scaling 2.5, attention biases
  smollm3    layer 1 NoPE (no_rope_layer_interval 2) and sliding over 3 tokens, tied head
  olmo2      no input norms, post-norms, q/k RMSNorm over the projections, attention biases
  olmo3      OLMo 2's layers, layers 0 and 2 sliding over 3 tokens with their own RoPE base
             (100), the full layer's linear-scaled RoPE
  gemma3     Gemma3ForConditionalGeneration (a `gemma3` checkpoint) on text: a tiny SigLIP
             vision tower and projector beside the Gemma 3 text model (layers 0 and 2 sliding
             over 3 tokens, the text config's final soft-capping 0.3, which this class does
             not apply), tied head

OUT_DIR/<case>.safetensors holds, on the 2 × 8 batch of models.py (row 1's last 3 tokens
padded), the evaluation-mode `logits`, and with the labels (padding at -100) the train-mode
`loss` (for a mixture of experts the language-model loss plus router_aux_loss_coef × aux_loss,
and `aux_loss`), `grad.<name>`
of every parameter; `autocast.logits`, `autocast.loss`, `autocast.aux_loss` and
`autocast.grad.<name>` the same under CPU bfloat16 autocast. <case>.parameters.json is
`named_parameters()`'s order. <case>.generate.safetensors: greedy and beam search from the
batch left-padded, as models.py's `record_generate`, with `output_router_logits` off (upstream's
generate fails with it on).

OUT_DIR/trainer_<case>/: each case at trainer_parity.py's FAMILY_VOCAB trained 20 steps by the
Trainer as trainer_families.py trains its families, on the Hamlet blocks with their ids modulo
that vocabulary (initial/, blocks.json, log_history.json, train_output.json).

OUT_DIR/qwen3_moe_smollm2/: the qwen3_moe case at SmolLM2's vocabulary (49152), seeded and
saved untrained: the base of examples/tests' expert adapters, which run_clm tokenizes with
SmolLM2's tokenizer.
"""

import importlib.util
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf

HERE = Path(__file__).resolve().parent


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMALL = dict(
    num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=96, max_position_embeddings=256, vocab_size=1000,
    output_router_logits=True, router_aux_loss_coef=0.05, num_experts_per_tok=2,
)


def cases(vocab=1000):
    small = dict(SMALL, vocab_size=vocab)
    return [
        ("qwen3_moe", tf.Qwen3MoeConfig(
            **small, head_dim=32, num_experts=4, moe_intermediate_size=32, norm_topk_prob=True,
            mlp_only_layers=[1],
        ), tf.Qwen3MoeForCausalLM),
        ("qwen2_moe", tf.Qwen2MoeConfig(
            **small, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            mlp_only_layers=[2], use_sliding_window=True, sliding_window=3, max_window_layers=2,
        ), tf.Qwen2MoeForCausalLM),
        ("mixtral", tf.MixtralConfig(
            **dict(small, intermediate_size=32), num_local_experts=4, sliding_window=3,
        ), tf.MixtralForCausalLM),
        ("olmoe", tf.OlmoeConfig(
            **dict(small, intermediate_size=32), num_experts=4, clip_qkv=0.5,
        ), tf.OlmoeForCausalLM),
        ("gpt_oss", tf.GptOssConfig(
            **dict(small, intermediate_size=32), head_dim=16, num_local_experts=4, sliding_window=3,
        ), tf.GptOssForCausalLM),
    ]


def dense_cases(vocab=1000):
    small = {k: v for k, v in SMALL.items() if k not in ("output_router_logits", "router_aux_loss_coef", "num_experts_per_tok")}
    small["vocab_size"] = vocab
    return [
        ("granite", tf.GraniteConfig(
            **small, embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2,
            logits_scaling=2.5, attention_bias=True,
        ), tf.GraniteForCausalLM),
        ("smollm3", tf.SmolLM3Config(
            **small, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=3,
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
        ), tf.SmolLM3ForCausalLM),
        ("olmo2", tf.Olmo2Config(**small, attention_bias=True), tf.Olmo2ForCausalLM),
        ("olmo3", tf.Olmo3Config(
            **small, sliding_window=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            },
        ), tf.Olmo3ForCausalLM),
        ("gemma3", tf.Gemma3Config(
            text_config=tf.Gemma3TextConfig(
                **small, head_dim=16, query_pre_attn_scalar=20, sliding_window=3,
                sliding_window_pattern=2, final_logit_softcapping=0.3,
            ),
            vision_config=tf.SiglipVisionConfig(
                hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                image_size=28, patch_size=14,
            ),
            mm_tokens_per_image=4,
        ), tf.Gemma3ForConditionalGeneration),
    ]


def run(model, kwargs, labels, prefix, tensors):
    model.eval()
    with torch.no_grad():
        tensors[f"{prefix}logits"] = model(**kwargs).logits.float().contiguous()
    model.zero_grad()
    out = model(**kwargs, labels=labels)
    loss = out.loss.float()
    loss.backward()
    tensors[f"{prefix}loss"] = loss.detach().reshape(1)
    if getattr(out, "aux_loss", None) is not None:
        tensors[f"{prefix}aux_loss"] = out.aux_loss.detach().float().reshape(1)
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"{prefix}grad.{name}"] = p.grad.detach().contiguous()


def models(out, models_ref):
    for case, config, cls in cases() + dense_cases():
        torch.manual_seed(0)
        m = cls(config)
        m.save_pretrained(out / case)
        ids, mask = models_ref.batch(config.get_text_config().vocab_size)
        labels = ids.masked_fill(mask == 0, -100)
        kwargs = dict(input_ids=ids, attention_mask=mask)
        tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        run(m, kwargs, labels, "", tensors)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            run(m, kwargs, labels, "autocast.", tensors)
        save_file(tensors, str(out / f"{case}.safetensors"))
        # Upstream's generate fails with router logits on (the load-balancing loss meets the
        # whole attention mask but one step's logits): decode with them off.
        m.config.output_router_logits = False
        models_ref.record_generate(case, m, ids, mask)
        names = [name for name, _ in m.named_parameters()]
        (out / f"{case}.parameters.json").write_text(json.dumps(names))
        print(case, float(tensors["loss"]))


def trainer(parity):
    for case, config, cls in cases(vocab=parity.FAMILY_VOCAB) + dense_cases(vocab=parity.FAMILY_VOCAB):
        train(parity, case, config, cls)
    _, config, cls = cases(vocab=49152)[0]
    torch.manual_seed(0)
    cls(config).save_pretrained(parity.OUT / "qwen3_moe_smollm2")


def train(parity, case, config, cls):
    """`case` trained by the Trainer into OUT_DIR/trainer_<case>/ (`config` at FAMILY_VOCAB)."""
    assert config.get_text_config().vocab_size == parity.FAMILY_VOCAB, case
    blocks = parity.family_blocks()
    train_rows, eval_rows = blocks[:48], blocks[48:56]
    name = f"trainer_{case}"
    folder = parity.OUT / name
    folder.mkdir()
    (folder / "blocks.json").write_text(json.dumps({"train": train_rows, "eval": eval_rows}))
    torch.manual_seed(0)
    cls(config).save_pretrained(folder / "initial")
    model = cls.from_pretrained(folder / "initial")
    args = parity.common_args(
        name,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=20,
        learning_rate=2e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        weight_decay=0.1,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=10,
    )

    def rows(part):
        return parity.Rows([{"input_ids": r, "labels": list(r)} for r in part])

    t = tf.Trainer(
        model=model, args=args, train_dataset=rows(train_rows), eval_dataset=rows(eval_rows),
        data_collator=tf.default_data_collator,
    )
    result = t.train()
    parity.write_run(name, t, result, model)
    print(name, t.state.log_history[-1])


def main():
    parity = sibling("trainer_parity")
    models(parity.OUT, sibling("models"))
    trainer(parity)


if __name__ == "__main__":
    main()
