"""Reference for Qwen3.5 and Qwen3.5-MoE (trainer/tests/it/decoder_families.rs): transformers 5.23,
their torch fallbacks (no flash-linear-attention, no causal-conv1d kernels).

Usage: python qwen3_5.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Tiny seeded models of the hybrid families (3 layers: Gated DeltaNet linear attention, the gated
full attention, linear attention; hidden 64, 4 heads of 16 with 2 key / value heads and
partial_rotary_factor 0.25; the linear layers with 2 key heads of 16 and 4 value heads of 8,
convolution kernel 4), saved into OUT_DIR/<case>/:

  qwen3_5_text       Qwen3_5ForCausalLM (a `qwen3_5_text` checkpoint)
  qwen3_5            Qwen3_5ForConditionalGeneration saved (a `qwen3_5` checkpoint: the
                     language model under `model.language_model.`, a tiny vision tower beside
                     it, untied head), read by AutoModelForCausalLM as upstream reads it: its
                     text config, the vision tower dropped; OUT_DIR/qwen3_5.saved/ is what that
                     model's `save_pretrained` writes
  qwen3_5_moe_text   Qwen3_5MoeForCausalLM: every layer sparse (4 experts of 32, 2 per token,
                     the gated shared expert of 48), output_router_logits on,
                     router_aux_loss_coef 0.05

OUT_DIR/<case>.safetensors holds what decoder_families.py records for its cases (the 2 × 8
batch of models.py, row 1's last 3 tokens padded: logits, loss, aux_loss, every gradient, in
float32 and under CPU bfloat16 autocast, the backward after the autocast region as the Trainer's); OUT_DIR/<case>.long.safetensors the same on a 2 × 150
batch (three of the gated delta rule's 64-token chunks; row 1's last 20 tokens padded).
<case>.parameters.json is `named_parameters()`'s order, <case>.generate.safetensors greedy and
beam search as models.py's `record_generate` (upstream's cache: the convolution and recurrent
states of the linear layers).

OUT_DIR/qwen3_5_text_seqcls/: Qwen3_5TextForSequenceClassification (3 labels, pad id 0, the
batch's padding set to it so that the last real token is pooled), recorded as the cases with the
class labels [2, 0].

OUT_DIR/trainer_<case>/: qwen3_5_text and qwen3_5_moe_text at trainer_parity.py's FAMILY_VOCAB
trained 20 steps by the Trainer as decoder_families.py trains its families.
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


TEXT = dict(
    num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=256, linear_conv_kernel_dim=4, linear_key_head_dim=16,
    linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
)


def cases(vocab=1000):
    text = dict(TEXT, vocab_size=vocab)
    return [
        ("qwen3_5_text", tf.Qwen3_5TextConfig(**text, intermediate_size=96), tf.Qwen3_5ForCausalLM),
        ("qwen3_5_moe_text", tf.Qwen3_5MoeTextConfig(
            **text, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, output_router_logits=True, router_aux_loss_coef=0.05,
        ), tf.Qwen3_5MoeForCausalLM),
    ]


def vlm_config():
    return tf.Qwen3_5Config(
        text_config=dict(TEXT, vocab_size=1000, intermediate_size=96),
        vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=64,
            patch_size=4, temporal_patch_size=2, num_position_embeddings=16,
        ),
    )


def long_batch(vocab):
    g = torch.Generator().manual_seed(4321)
    ids = torch.randint(0, vocab, (2, 150), generator=g)
    mask = torch.ones(2, 150, dtype=torch.int64)
    mask[1, -20:] = 0
    return ids, mask


def run(model, kwargs, labels, prefix, tensors, autocast):
    """decoder_families.py's `run`, the forward under `autocast` and the backward after it,
    as the Trainer runs them (the delta rule's triangular solves have matrix products in
    their backward, which autocast would change)."""
    context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    model.eval()
    with torch.no_grad(), context:
        tensors[f"{prefix}logits"] = model(**kwargs).logits.float().contiguous()
    model.zero_grad()
    with context:
        out = model(**kwargs, labels=labels)
    loss = out.loss.float()
    loss.backward()
    tensors[f"{prefix}loss"] = loss.detach().reshape(1)
    if getattr(out, "aux_loss", None) is not None:
        tensors[f"{prefix}aux_loss"] = out.aux_loss.detach().float().reshape(1)
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"{prefix}grad.{name}"] = p.grad.detach().contiguous()


def record(out, case, m, ids, mask, suffix=""):
    labels = ids.masked_fill(mask == 0, -100)
    kwargs = dict(input_ids=ids, attention_mask=mask)
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    run(m, kwargs, labels, "", tensors, autocast=False)
    run(m, kwargs, labels, "autocast.", tensors, autocast=True)
    save_file(tensors, str(out / f"{case}{suffix}.safetensors"))
    return tensors


def models(out, models_ref):
    all_cases = cases()
    torch.manual_seed(0)
    tf.Qwen3_5ForConditionalGeneration(vlm_config()).save_pretrained(out / "qwen3_5")
    for case, config, cls in all_cases + [("qwen3_5", None, None)]:
        if config is None:
            m = tf.AutoModelForCausalLM.from_pretrained(out / case)
            m.save_pretrained(out / f"{case}.saved")
        else:
            torch.manual_seed(0)
            m = cls(config)
            m.save_pretrained(out / case)
        vocab = m.config.get_text_config().vocab_size
        tensors = record(out, case, m, *models_ref.batch(vocab))
        record(out, case, m, *long_batch(vocab), suffix=".long")
        m.config.output_router_logits = False
        ids, mask = models_ref.batch(vocab)
        models_ref.record_generate(case, m, ids, mask)
        names = [name for name, _ in m.named_parameters()]
        (out / f"{case}.parameters.json").write_text(json.dumps(names))
        print(case, float(tensors["loss"]))


def seqcls(out, models_ref):
    """Qwen3_5TextForSequenceClassification (3 labels, pad id 0: the last real token pooled)
    on the 2 x 8 batch with class labels [2, 0], as `record` runs the causal LMs."""
    config = tf.Qwen3_5TextConfig(**dict(TEXT, vocab_size=1000), intermediate_size=96, num_labels=3, pad_token_id=0)
    torch.manual_seed(0)
    m = tf.Qwen3_5TextForSequenceClassification(config)
    m.save_pretrained(out / "qwen3_5_text_seqcls")
    ids, mask = models_ref.batch(1000)
    ids = ids.masked_fill(mask == 0, 0).clamp(min=0)
    ids[:, :5] = ids[:, :5].clamp(min=1)
    labels = torch.tensor([2, 0])
    kwargs = dict(input_ids=ids, attention_mask=mask)
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    run(m, kwargs, labels, "", tensors, autocast=False)
    run(m, kwargs, labels, "autocast.", tensors, autocast=True)
    save_file(tensors, str(out / "qwen3_5_text_seqcls.safetensors"))
    (out / "qwen3_5_text_seqcls.parameters.json").write_text(json.dumps([n for n, _ in m.named_parameters()]))


def main():
    parity = sibling("trainer_parity")
    families = sibling("decoder_families")
    models(parity.OUT, sibling("models"))
    seqcls(parity.OUT, sibling("models"))
    for case, config, cls in cases(vocab=parity.FAMILY_VOCAB):
        families.train(parity, case, config, cls)


if __name__ == "__main__":
    main()
