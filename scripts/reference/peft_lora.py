"""Reference for models/tests: LoRA adapters as peft 0.21.2 makes, runs, saves and merges them.

Usage: python peft_lora.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

For each case a base model is loaded, `torch.manual_seed(0)`, `get_peft_model(base, config)`;
then OUT_DIR/<case>/ holds the adapter as peft saves it (adapter_config.json,
adapter_model.safetensors) and OUT_DIR/<case>.safetensors:
  input_ids, attention_mask, labels     the batch
  init.<key>                            every adapter tensor right after get_peft_model (the
                                        draws from the global generator), under its saved key
  logits                                eval mode (no dropout)
  train_logits, loss, grad.<key>        train mode after torch.manual_seed(1) (LoRA dropout
                                        drawn), labels as the case says; gradients of the
                                        trainable tensors under their saved keys
  merged_logits                         eval logits of merge_and_unload()'s model

  llama_all_linear   tiny Llama causal LM, "all-linear", r 4, alpha 8, dropout 0.1,
                     init_lora_weights False (lora_B drawn, so the adapter acts)
  deberta_default    tiny DeBERTa-v3 masked LM (shared attention keys: query_proj and key_proj
                     also project the relative embeddings), peft's defaults (query_proj,
                     value_proj), init False
  qwen2_default      tiny Qwen2 causal LM (made here, qwen2_base/), peft's default targets (q_proj, v_proj), r 8,
                     alpha 16, rsLoRA, "gaussian" init, then every lora_B set to seeded
                     normal values (an adapter that acts) before saving
  gpt2_conv1d        tiny GPT-2, c_attn and mlp.c_proj (Conv1D: fan_in_fan_out set by peft),
                     rank_pattern / alpha_pattern, init False
  llama_dora         tiny Llama, DoRA on q_proj, v_proj and down_proj, r 4, alpha 8, LoRA
                     dropout 0.1 (DoRA recomputes the base output on the dropped input),
                     init False (the magnitudes start from W + scaling · B A)
  bert_seqcls        tiny BERT with a new 3-label classifier, SEQ_CLS (the classifier in
                     modules_to_save), query / value in layer 1 only (layers_to_transform),
                     bias "lora_only", init False

  llama_embed        tiny Llama (tied embeddings), LoRA on embed_tokens (lora_embedding_A / B,
                     no dropout on the lookup; the base embedding saved with the adapter, as
                     peft's save_embedding_layers="auto") and q_proj, init False
  bert_embed_dora    tiny BERT masked LM (made here, bert_mlm_base/), DoRA on word_embeddings
                     (padding index 0, which every row starts with) and query, init False

OUT_DIR/multi/ and multi.safetensors: several adapters on the tiny Llama ("default" on q_proj
/ v_proj as get_peft_model makes it, "other" on q_proj / k_proj / o_proj added by
add_adapter after torch.manual_seed(2)): init.other.<key> (its draws), default_logits,
other_logits (after set_adapter("other")), other's training loss and gradients (grad.<key>,
dropout after manual_seed(1); multi.parameters.json their order), merged_logits
(merge_adapter(["default", "other"])), unmerged_logits and unmerged.<module> (the q_proj
weights after unmerge_adapter, not bit-exact with the originals), deleted_logits
(delete_adapter("other"): "default" active again); the folder is save_pretrained's (default at
the root, other/).

and OUT_DIR/trainer_llama/: upstream's Trainer on a LoRA model (tiny Llama saved as initial/,
attention dropout 0, `torch.manual_seed(0)` then get_peft_model with "all-linear", r 8,
alpha 16, LoRA dropout 0.1) for 20 steps on trainer_parity.py's Hamlet blocks (batch 4, lr
2e-3, cosine after 2 warm-up steps, weight decay 0.1, clipping at 1.0, evaluation every 10
steps): log_history.json, train_output.json, and the adapter save_model writes (adapter/).
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import transformers as tf
from peft import LoraConfig, get_peft_model

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
torch.set_num_threads(2)


def batch(vocab, seq=8):
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (2, seq), generator=g)
    mask = torch.ones(2, seq, dtype=torch.int64)
    mask[1, seq - 3:] = 0
    return ids, mask


def saved_key(name):
    """The key peft saves a PeftModel parameter under (adapter name and wrappers dropped)."""
    name = name.replace(".default", "").replace(".modules_to_save", "").replace(".original_module", "")
    return name.replace("lora_magnitude_vector.weight", "lora_magnitude_vector")


def run(case, base, config, labels_of, after_init=None, first_id=None):
    torch.manual_seed(0)
    model = get_peft_model(base, config)
    tensors = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            tensors[f"init.{saved_key(name)}"] = p.detach().clone()
    if after_init:
        after_init(model)
    ids, mask = batch(model.config.vocab_size)
    if first_id is not None:
        ids[:, 0] = first_id
    labels = labels_of(ids, mask)
    tensors.update(input_ids=ids, attention_mask=mask, labels=labels)
    model.eval()
    with torch.no_grad():
        tensors["logits"] = model(input_ids=ids, attention_mask=mask).logits.contiguous()
    model.train()
    torch.manual_seed(1)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    tensors["train_logits"] = out.logits.detach().contiguous()
    tensors["loss"] = out.loss.detach().reshape(1)
    order = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            tensors[f"grad.{saved_key(name)}"] = p.grad.detach().contiguous()
            order.append(saved_key(name))
    model.zero_grad()
    model.save_pretrained(OUT / case)
    saved = load_file(str(OUT / case / "adapter_model.safetensors"))
    # Besides the trained tensors, the base weight of an embedding named in target_modules.
    trained = sorted(k for k in saved if not k.endswith(".base_layer.weight"))
    assert trained == sorted(order), (trained, sorted(order))
    model.eval()
    merged = model.merge_and_unload()
    with torch.no_grad():
        tensors["merged_logits"] = merged(input_ids=ids, attention_mask=mask).logits.contiguous()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT / f"{case}.safetensors"))
    (OUT / f"{case}.parameters.json").write_text(json.dumps(order))
    print(case, "loss", float(tensors["loss"]))


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).resolve().parent / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trainer_llama():
    parity = sibling("trainer_parity")
    folder = OUT / "trainer_llama"
    folder.mkdir()
    blocks = parity.llama_blocks()
    train_rows, eval_rows = blocks[:48], blocks[48:56]
    (folder / "blocks.json").write_text(json.dumps({"train": train_rows, "eval": eval_rows}))
    tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama", attention_dropout=0.0).save_pretrained(folder / "initial")
    base = tf.LlamaForCausalLM.from_pretrained(folder / "initial")
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.1, target_modules="all-linear", task_type="CAUSAL_LM",
    ))
    args = parity.common_args(
        "trainer_llama",
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

    trainer = tf.Trainer(
        model=model, args=args, train_dataset=rows(train_rows), eval_dataset=rows(eval_rows),
        data_collator=tf.default_data_collator,
    )
    result = trainer.train()
    trainer.save_model(str(folder / "adapter"))
    parity.write_run("trainer_llama", trainer, result, model)
    print("trainer_llama", trainer.state.log_history[-1])


def lm_labels(ids, mask):
    return ids.masked_fill(mask == 0, -100)


def tiny(name, cls, config):
    """A tiny seeded model saved as OUT_DIR/<name>/ (the base Rust loads) and loaded back."""
    torch.manual_seed(0)
    cls(config).save_pretrained(OUT / name)
    return cls.from_pretrained(OUT / name)


def main():
    run(
        "llama_all_linear",
        tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama"),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=False),
        lm_labels,
    )

    def perturb_b(model):
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)

    run(
        "qwen2_default",
        tiny("qwen2_base", tf.Qwen2ForCausalLM, tf.Qwen2Config(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=1000,
        )),
        LoraConfig(r=8, lora_alpha=16, use_rslora=True, init_lora_weights="gaussian", task_type="CAUSAL_LM"),
        lm_labels,
        after_init=perturb_b,
    )
    run(
        "gpt2_conv1d",
        tf.GPT2LMHeadModel.from_pretrained(ASSETS / "tiny-gpt2"),
        LoraConfig(
            r=4, lora_alpha=8, target_modules=["c_attn", "mlp.c_proj"], init_lora_weights=False,
            rank_pattern={"h.0.attn.c_attn": 2}, alpha_pattern={"mlp.c_proj": 4},
        ),
        lm_labels,
    )
    run(
        "llama_dora",
        tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama"),
        LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj", "down_proj"],
            use_dora=True, init_lora_weights=False, task_type="CAUSAL_LM",
        ),
        lm_labels,
    )
    run(
        "deberta_default",
        tiny("deberta_base", tf.DebertaV2ForMaskedLM, tf.DebertaV2Config(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=96, max_position_embeddings=64, relative_attention=True,
            position_buckets=16, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
            share_att_key=True, position_biased_input=False, type_vocab_size=0, pad_token_id=0,
        )),
        LoraConfig(r=4, lora_alpha=8, init_lora_weights=False),
        lambda ids, mask: ids.masked_fill(mask == 0, -100),
    )
    torch.manual_seed(0)
    base = tf.BertForSequenceClassification.from_pretrained(ASSETS / "tiny-bert", num_labels=3)
    base.save_pretrained(OUT / "bert_seqcls_base")
    run(
        "bert_seqcls",
        base,
        LoraConfig(
            r=4, lora_alpha=4, target_modules=["query", "value"], layers_to_transform=[1],
            bias="lora_only", task_type="SEQ_CLS", init_lora_weights=False,
        ),
        lambda ids, mask: torch.tensor([1, 2]),
    )
    run(
        "llama_embed",
        tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama"),
        LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["embed_tokens", "q_proj"],
            init_lora_weights=False, task_type="CAUSAL_LM",
        ),
        lm_labels,
    )
    run(
        "bert_embed_dora",
        tiny("bert_mlm_base", tf.BertForMaskedLM, tf.BertConfig(
            vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
        )),
        LoraConfig(r=4, lora_alpha=8, target_modules=["word_embeddings", "query"], use_dora=True, init_lora_weights=False),
        lm_labels,
        first_id=0,
    )


def multi_adapter():
    model = get_peft_model(
        tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama"),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    torch.manual_seed(2)
    model.add_adapter("other", LoraConfig(r=2, lora_alpha=2, target_modules=["q_proj", "k_proj", "o_proj"], init_lora_weights=False))
    tensors = {}
    for name, p in model.named_parameters():
        if ".other" in name:
            tensors[f"init.other.{name.replace('.other', '')}"] = p.detach().clone()
    ids, mask = batch(model.config.vocab_size)
    labels = lm_labels(ids, mask)
    tensors.update(input_ids=ids, attention_mask=mask, labels=labels)

    def logits():
        model.eval()
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits.contiguous()

    tensors["default_logits"] = logits()
    model.set_adapter("other")
    tensors["other_logits"] = logits()
    model.train()
    torch.manual_seed(1)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    tensors["loss"] = out.loss.detach().reshape(1)
    order = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = name.replace(".other", "")
            tensors[f"grad.{key}"] = p.grad.detach().contiguous()
            order.append(key)
    model.zero_grad()
    model.save_pretrained(OUT / "multi")
    model.merge_adapter(["default", "other"])
    tensors["merged_logits"] = logits()
    model.unmerge_adapter()
    model.set_adapter("default")
    tensors["unmerged_logits"] = logits()
    for name, p in model.named_parameters():
        if name.endswith("q_proj.base_layer.weight"):
            tensors[f"unmerged.{name}"] = p.detach().clone()
    model.delete_adapter("other")
    tensors["deleted_logits"] = logits()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT / "multi.safetensors"))
    (OUT / "multi.parameters.json").write_text(json.dumps(order))
    print("multi", "loss", float(tensors["loss"]))


if __name__ == "__main__":
    main()
    multi_adapter()
    trainer_llama()
