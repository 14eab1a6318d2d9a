"""Reference for packed sequences (padding-free batches) in transformers 5.23.

Usage: python packed_sequences.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Upstream's masking_utils detects packed rows from `position_ids` when no 2D attention
mask is given and no cache is used (`find_packed_sequence_indices`): a position that does
not follow its predecessor by 1 starts a new document, and the causal (or sliding-window)
mask is rebuilt so that each document attends only to itself, on its own positions.

Models (OUT_DIR/<case>/ the tiny model, seeded, saved for Rust; OUT_DIR/<case>.safetensors):
The forwards pass `use_cache=False`, as the Trainer sets it (`args.use_cache`): a model
whose config asks for a cache builds one in a plain forward, and with a cache upstream does
not look for packed rows.

  input_ids, position_ids, labels    a [rows, T] batch of packed documents, labels as
                                     DataCollatorWithFlattening makes them (-100 at each
                                     document's first token); no attention mask
  logits                             evaluation-mode forward, fp32
  logits_use_cache                   (qwen2) the same forward under the config's
                                     `use_cache=True`: no packed detection
  loss, grad.<name>                  the loss with labels and every parameter's gradient
  doc_loss                           the token-weighted mean of the documents' losses, each
                                     document run alone (the check of the claim itself;
                                     not Phi-3's, whose LongRoPE factors follow the
                                     batch's largest position)
Cases: the Llama-shaped families of models.py (Qwen2 and Mistral sliding over 3 tokens,
Gemma 2 eager soft-capped attention, Gemma 3 sliding layers, Phi-3 LongRoPE, Qwen3,
Llama) with one row of documents 5, 7, 4 and 6 tokens long, Qwen2 again with two rows
(`qwen2_rows`), and the tiny GPT-2 from the assets.

Trainer (OUT_DIR/trainer_qwen2/): the tiny Qwen2 of trainer_families.py (trainer_parity.py's FAMILY_VOCAB)
trained 12 steps by upstream's Trainer with `DataCollatorWithFlattening` on documents cut
from trainer_parity.py's Hamlet blocks to 12..60 tokens (4 per step, lr 2e-3, cosine after
2 warm-up steps, clipping at 1.0, evaluation every 6 steps on 8 documents):
log_history.json, train_output.json, docs.json, initial/.

run_clm --packing (OUT_DIR/run_clm_packing/): what examples/run_clm does with `--packing`,
as TRL's SFTTrainer packs: hamlet.txt's lines (line breaks kept; the first 5 % held out for
evaluation, as run_clm's `--validation_split_percentage`), each tokenized by the GPT-2
tokenizer, packed into rows of at most 64 tokens by TRL's `pack_dataset` (bfd, trl 1.16.0),
collated by TRL's `DataCollatorForLanguageModeling(padding_free=True)` (one flattened row,
positions restarting per document); the tiny GPT-2 of the assets (dropout 0.1) trained 8
steps by upstream's Trainer (batch 4, lr 1e-3, evaluation every 4 steps on the first 8
packed evaluation rows; `remove_unused_columns=False` keeps `seq_lengths`, as SFTTrainer's
signature columns do): log_history.json, train_output.json.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
HERE = Path(__file__).resolve().parent
torch.set_num_threads(2)

DOC_LENGTHS = [5, 7, 4, 6]


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documents(vocab, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g) for n in lengths]


def flatten(rows):
    """DataCollatorWithFlattening's tensors for each row of documents, rows stacked (every
    row the same total length)."""
    collator = tf.DataCollatorWithFlattening()
    out = [collator([{"input_ids": d.tolist()} for d in docs]) for docs in rows]
    return {k: torch.cat([o[k] for o in out]) for k in ("input_ids", "position_ids", "labels")}


def record(case, model, rows):
    batch = flatten(rows)
    model.eval()
    tensors = {k: v.contiguous() for k, v in batch.items()}
    with torch.no_grad():
        tensors["logits"] = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
        if case == "qwen2":
            # The config's `use_cache` (true): the plain forward builds a cache, and upstream
            # then does not look for packed rows: the documents see each other.
            tensors["logits_use_cache"] = model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"]
            ).logits
    model.zero_grad()
    out = model(**batch, use_cache=False)
    out.loss.backward()
    tensors["loss"] = out.loss.detach().reshape(1)
    for name, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"grad.{name}"] = p.grad.detach().contiguous()
    # Each document alone: the packed loss is the token-weighted mean of theirs.
    total, count = 0.0, 0
    with torch.no_grad():
        for docs in rows:
            for d in docs:
                loss = model(input_ids=d[None], labels=d[None]).loss
                total += loss.double().item() * (len(d) - 1)
                count += len(d) - 1
    tensors["doc_loss"] = torch.tensor([total / count], dtype=torch.float64)
    rel = abs(out.loss.item() - total / count) / (total / count)
    # Phi-3's LongRoPE picks its short or long factors by the batch's largest position:
    # packed with longer ones, the 4-token document gets the long factors it would not alone.
    assert case == "phi3" or rel < 1e-6, (case, out.loss.item(), total / count)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT / f"{case}.safetensors"))
    print(f"{case}: loss {out.loss.item():.8f}, per-document {total / count:.8f}, rel {rel:.2e}")


def models():
    small = dict(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=256, vocab_size=1000,
    )
    cases = [
        ("qwen2", tf.Qwen2Config(**small, use_sliding_window=True, sliding_window=3, max_window_layers=1), tf.Qwen2ForCausalLM),
        ("qwen3", tf.Qwen3Config(**small, head_dim=32, tie_word_embeddings=True), tf.Qwen3ForCausalLM),
        ("mistral", tf.MistralConfig(**small, head_dim=24, sliding_window=3), tf.MistralForCausalLM),
        ("llama", tf.LlamaConfig(**small), tf.LlamaForCausalLM),
        ("gemma2", tf.Gemma2Config(
            **small, head_dim=24, query_pre_attn_scalar=20, sliding_window=3,
            attn_logit_softcapping=0.05, final_logit_softcapping=0.3,
        ), tf.Gemma2ForCausalLM),
        ("gemma3", tf.Gemma3TextConfig(
            **small, head_dim=32, query_pre_attn_scalar=20, sliding_window=3, sliding_window_pattern=2,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            },
        ), tf.Gemma3ForCausalLM),
        ("phi3", tf.Phi3Config(
            **small, pad_token_id=999, original_max_position_embeddings=4, sliding_window=5,
            rope_parameters={
                "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [1.5, 2.0, 3.0, 4.0],
            },
        ), tf.Phi3ForCausalLM),
    ]
    for case, config, cls in cases:
        torch.manual_seed(0)
        m = cls(config)
        m.save_pretrained(OUT / case)
        record(case, m, [documents(config.vocab_size, DOC_LENGTHS, 7)])
        if case == "qwen2":
            # Two rows of 22 tokens, the second's documents in another order.
            rows = [documents(config.vocab_size, DOC_LENGTHS, 7), documents(config.vocab_size, [6, 9, 7], 8)]
            record("qwen2_rows", m, rows)
    m = tf.GPT2LMHeadModel.from_pretrained(ASSETS / "tiny-gpt2")
    record("gpt2", m, [documents(m.config.vocab_size, DOC_LENGTHS, 7)])


def trainer_run():
    families = sibling("trainer_families")
    parity = families.sibling("trainer_parity")
    parity.OUT = OUT
    _, config, cls = families.CASES[0]
    blocks = parity.family_blocks()
    docs = [b[: 12 + (7 * i) % 49] for i, b in enumerate(blocks[:56])]
    train_docs, eval_docs = docs[:48], docs[48:]
    folder = OUT / "trainer_qwen2"
    folder.mkdir()
    (folder / "docs.json").write_text(json.dumps({"train": train_docs, "eval": eval_docs}))
    torch.manual_seed(0)
    cls(config).save_pretrained(folder / "initial")
    model = cls.from_pretrained(folder / "initial")
    args = parity.common_args(
        "trainer_qwen2",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=12,
        learning_rate=2e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=6,
    )
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=parity.Rows([{"input_ids": d} for d in train_docs]),
        eval_dataset=parity.Rows([{"input_ids": d} for d in eval_docs]),
        data_collator=tf.DataCollatorWithFlattening(),
    )
    result = trainer.train()
    parity.write_run("trainer_qwen2", trainer, result, model)
    print("trainer_qwen2", trainer.state.log_history[-1])


def run_clm_packing():
    from datasets import Dataset as HfDataset
    from trl import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TrlCollator

    parity = sibling("trainer_parity")
    parity.OUT = OUT
    tok = tf.GPT2TokenizerFast(
        vocab=str(ASSETS / "gpt2-tokenizer" / "vocab.json"),
        merges=str(ASSETS / "gpt2-tokenizer" / "merges.txt"),
    )
    lines = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    # `train[:5%]` / `train[5%:]`: datasets rounds the boundary half to even, as round().
    cut = round(len(lines) * 5 / 100)

    def packed(rows):
        ids = [tok(line)["input_ids"] for line in rows]
        out = pack_dataset(HfDataset.from_dict({"input_ids": ids}), 64, strategy="bfd")[:]
        return [{"input_ids": i, "seq_lengths": s} for i, s in zip(out["input_ids"], out["seq_lengths"])]

    train, evaluation = packed(lines[cut:]), packed(lines[:cut])[:8]
    model = tf.GPT2LMHeadModel.from_pretrained(ASSETS / "tiny-gpt2")
    args = parity.common_args(
        "run_clm_packing",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=8,
        learning_rate=1e-3,
        eval_strategy="steps",
        eval_steps=4,
        remove_unused_columns=False,
    )
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=parity.Rows(train),
        eval_dataset=parity.Rows(evaluation),
        data_collator=TrlCollator(pad_token_id=tok.eos_token_id, padding_free=True),
    )
    result = trainer.train()
    (OUT / "run_clm_packing").mkdir()
    parity.write_run("run_clm_packing", trainer, result, model)
    print("run_clm_packing", len(train), "packed rows", trainer.state.log_history[-1])


def main():
    models()
    trainer_run()
    run_clm_packing()


if __name__ == "__main__":
    main()
