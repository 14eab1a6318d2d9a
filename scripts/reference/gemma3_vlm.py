"""Reference for Gemma 3's vision-language model (models/tests/it/vlm.rs): transformers 5.23's
Gemma3ForConditionalGeneration.

Usage: python gemma3_vlm.py OUT_DIR

Two tiny models drawn after `torch.manual_seed(0)` (text: vocabulary 64, hidden 32, 2 layers —
layer 0 sliding over 6 tokens, layer 1 full —, 2 heads, 1 key / value head, head_dim 16; vision:
SigLIP hidden 32, 2 layers, 2 heads, 28x28 images in 7x7 patches, no pooling head; 4 tokens per
image, so the 4x4 patch grid is average-pooled by 2), the projector's weight and norm redrawn
(upstream initialises them to zeros and ones):

  inside/   the image token (62) inside the text vocabulary, as in Gemma 3's checkpoints
  outside/  the image token (70) past it (embedded as token 0)

For each: <case>/model/ (saved), <case>/forward.safetensors on a batch of 3 rows of 24 tokens
(row 0: one image, row 1: two images and its last 5 tokens padded, row 2: text only) with
`pixel_values` [3, 3, 28, 28] (normal draws): `input_ids`, `attention_mask`, `token_type_ids`
(1 on the image tokens), `pixel_values`, `labels` (padding at -100; the image tokens too when past the vocabulary), and in training mode with
`token_type_ids`: `logits`, `loss`, `grad.<name>` of every parameter (checkpoint names as
`named_parameters()` gives them); `causal.logits` without `token_type_ids` (plain causal masks);
`autocast.loss` and `autocast.grad.<name>` under CPU bfloat16 autocast. <case>/parameters.json is
`named_parameters()`'s order.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf

OUT = Path(sys.argv[1])
torch.set_num_threads(2)


def config(image_token):
    return tf.Gemma3Config(
        text_config=dict(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
            sliding_window=6, layer_types=["sliding_attention", "full_attention"],
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
            image_size=28, patch_size=7, vision_use_head=False,
        ),
        mm_tokens_per_image=4, boi_token_index=60, eoi_token_index=61, image_token_index=image_token,
    )


def batch(image_token):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 60, (3, 24), generator=g)
    tt = torch.zeros_like(ids)

    def image(row, at):
        ids[row, at] = 60
        ids[row, at + 1:at + 5] = image_token
        ids[row, at + 5] = 61
        tt[row, at + 1:at + 5] = 1

    image(0, 3)
    image(1, 2)
    image(1, 10)
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    ids[1, -5:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    if image_token >= 64:
        labels = labels.masked_fill(ids == image_token, -100)
    pixel_values = torch.randn(3, 3, 28, 28, generator=g)
    return ids, mask, tt, labels, pixel_values


def main():
    for case, image_token in [("inside", 62), ("outside", 70)]:
        torch.manual_seed(0)
        m = tf.Gemma3ForConditionalGeneration(config(image_token))
        with torch.no_grad():
            proj = m.model.multi_modal_projector
            proj.mm_input_projection_weight.normal_(0, 0.2)
            proj.mm_soft_emb_norm.weight.normal_(0, 0.2)
        m.save_pretrained(OUT / case / "model")
        ids, mask, tt, labels, pixel_values = batch(image_token)
        t = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt, "labels": labels,
             "pixel_values": pixel_values}
        kwargs = dict(input_ids=ids, attention_mask=mask, pixel_values=pixel_values)
        m.train()
        m.zero_grad()
        out = m(**kwargs, token_type_ids=tt, labels=labels)
        out.loss.backward()
        t["logits"] = out.logits.detach().contiguous()
        t["loss"] = out.loss.detach().reshape(1)
        for name, p in m.named_parameters():
            if p.grad is not None:
                t[f"grad.{name}"] = p.grad.detach().contiguous()
        with torch.no_grad():
            t["causal.logits"] = m(**kwargs).logits.contiguous()
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(**kwargs, token_type_ids=tt, labels=labels)
        out.loss.float().backward()
        t["autocast.loss"] = out.loss.detach().float().reshape(1)
        for name, p in m.named_parameters():
            if p.grad is not None:
                t[f"autocast.grad.{name}"] = p.grad.detach().contiguous()
        save_file(t, str(OUT / case / "forward.safetensors"))
        names = [name for name, _ in m.named_parameters()]
        (OUT / case / "parameters.json").write_text(json.dumps(names))
        print(case, float(t["loss"]), float(t["autocast.loss"]))


if __name__ == "__main__":
    main()
