"""Reference for trainer/tests: the Llama-shaped families trained by transformers 5.23's Trainer.

Usage: python trainer_families.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

For each family a tiny model is made (seeded, vocabulary trainer_parity.py's FAMILY_VOCAB) and
saved into OUT_DIR/<case>/initial/, then trained 20 steps on trainer_parity.py's Hamlet
blocks with their ids modulo that vocabulary (`family_blocks`; blocks.json: 48 train, 8 eval
blocks of 64 tokens) with batch 4, lr 2e-3, a cosine
schedule after 2 warm-up steps, weight decay 0.1, clipping at 1.0, evaluation every 10
steps; OUT_DIR/<case>/log_history.json and train_output.json are the run.

  qwen2    Qwen2ForCausalLM: q/k/v biases, layers 1 and 2 (of 3) sliding over 16 tokens
  qwen3    Qwen3ForCausalLM: q/k RMSNorm, head_dim 32 (hidden 64 / 4 heads), tied head
  mistral  MistralForCausalLM: head_dim 24, every layer sliding over 16 tokens
  gemma2   Gemma2ForCausalLM: eager attention soft-capped at 50, logits at 30 (upstream's
           defaults), layers 0 and 2 sliding over 16 tokens, Gemma's norms and scaled
           embeddings, tied head

and OUT_DIR/modernbert_cls/, a tiny ModernBERT sequence classifier (see modernbert_cls), and
OUT_DIR/bert_qa/, a tiny BERT question answerer (see bert_qa).
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


# trainer_parity.py's FAMILY_VOCAB (main checks it).
VOCAB = 1024
SMALL = dict(
    num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=96, max_position_embeddings=256, vocab_size=VOCAB,
)
CASES = [
    ("qwen2", tf.Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=16, max_window_layers=1), tf.Qwen2ForCausalLM),
    ("qwen3", tf.Qwen3Config(**SMALL, head_dim=32, tie_word_embeddings=True), tf.Qwen3ForCausalLM),
    ("mistral", tf.MistralConfig(**SMALL, head_dim=24, sliding_window=16), tf.MistralForCausalLM),
    ("gemma2", tf.Gemma2Config(**SMALL, head_dim=16, query_pre_attn_scalar=16, sliding_window=16), tf.Gemma2ForCausalLM),
]


def modernbert_cls(parity):
    """A tiny ModernBERT sequence classifier (mean pooling; layers 0 and 2 global, 1 local over
    8 tokens; MiniLM's vocabulary) trained 20 steps on the first 64 fresh / rotten Rotten
    Tomatoes reviews (48 train, 16 eval) as trainer_parity.py's minilm_cls prepares them,
    without token type ids, padded by DataCollatorWithPadding."""
    import bz2
    import csv

    folder = parity.OUT / "modernbert_cls"
    folder.mkdir()
    with bz2.open(parity.ASSETS / "text" / "rotten_tomatoes_corpus.csv.bz2", "rt", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["category"] in ("fresh", "rotten")][:64]
    splits = {"train": rows[:48], "eval": rows[48:]}
    labels = sorted({r["category"] for r in splits["train"]})
    tok = tf.AutoTokenizer.from_pretrained(parity.ASSETS / "minilm")
    data, ids = {}, {}
    for split, part in splits.items():
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps({"sentence": r["text"], "label": r["category"]}) + "\n")
        enc = [tok(r["text"], truncation=True, max_length=64, return_token_type_ids=False) for r in part]
        ids[split] = [e["input_ids"] for e in enc]
        data[split] = [
            {**{k: list(v) for k, v in e.items()}, "labels": labels.index(r["category"])}
            for e, r in zip(enc, part)
        ]
    (folder / "ids.json").write_text(json.dumps({"labels": labels, **ids}))
    config = tf.ModernBertConfig(
        vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=128, global_attn_every_n_layers=2,
        local_attention=8, pad_token_id=tok.pad_token_id, classifier_pooling="mean", num_labels=2,
    )
    torch.manual_seed(0)
    tf.ModernBertForSequenceClassification(config).save_pretrained(folder / "initial")
    model = tf.ModernBertForSequenceClassification.from_pretrained(folder / "initial")
    args = parity.common_args(
        "modernbert_cls",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=20,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        weight_decay=0.1,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=10,
    )
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=parity.Rows(data["train"]),
        eval_dataset=parity.Rows(data["eval"]),
        data_collator=tf.DataCollatorWithPadding(tok),
    )
    result = trainer.train()
    parity.write_run("modernbert_cls", trainer, result, model)
    print("modernbert_cls", trainer.state.log_history[-1])


def bert_qa(parity):
    """A tiny BertForQuestionAnswering (MiniLM's vocabulary, seeded) trained 20 steps on
    modernbert_cls's reviews with made-up answer spans (start a third of the way in, end 3
    tokens later; every 7th row's start past the end, which the loss ignores), padded by
    DataCollatorWithPadding, evaluated every 10 steps; then `predict` on the eval rows:
    predict.safetensors holds its predictions (start and end logits stacked on a last axis,
    padded with -100 across batches) and label ids (start and end stacked)."""
    from safetensors.numpy import save_file
    import numpy as np

    folder = parity.OUT / "bert_qa"
    folder.mkdir()
    ids = json.loads((parity.OUT / "modernbert_cls" / "ids.json").read_text())
    rows = {}
    for split in ("train", "eval"):
        rows[split] = []
        for i, r in enumerate(ids[split]):
            start = len(r) // 3 if i % 7 else len(r) + 5
            end = min(len(r) // 3 + 3, len(r) - 1)
            rows[split].append({"input_ids": r, "start_positions": start, "end_positions": end})
    (folder / "rows.json").write_text(json.dumps(rows))
    tok = tf.AutoTokenizer.from_pretrained(parity.ASSETS / "minilm")
    config = tf.BertConfig(
        vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=128,
    )
    torch.manual_seed(0)
    tf.BertForQuestionAnswering(config).save_pretrained(folder / "initial")
    model = tf.BertForQuestionAnswering.from_pretrained(folder / "initial")
    args = parity.common_args(
        "bert_qa",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=20,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        weight_decay=0.1,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=10,
    )
    assert args.label_names is None
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=parity.Rows(rows["train"]),
        eval_dataset=parity.Rows(rows["eval"]),
        data_collator=tf.DataCollatorWithPadding(tok),
    )
    assert trainer.label_names == ["start_positions", "end_positions"], trainer.label_names
    result = trainer.train()
    pred = trainer.predict(parity.Rows(rows["eval"]))
    save_file(
        {
            "predictions": np.ascontiguousarray(np.stack(pred.predictions, -1)),
            "label_ids": np.ascontiguousarray(np.stack(pred.label_ids, -1)),
            "test_loss": np.array([pred.metrics["test_loss"]], dtype=np.float64),
        },
        str(folder / "predict.safetensors"),
    )
    parity.write_run("bert_qa", trainer, result, model)
    print("bert_qa", trainer.state.log_history[-1], pred.metrics)


def main():
    parity = sibling("trainer_parity")
    modernbert_cls(parity)
    bert_qa(parity)
    assert VOCAB == parity.FAMILY_VOCAB
    blocks = parity.family_blocks()
    train_rows, eval_rows = blocks[:48], blocks[48:56]

    def rows(part):
        return parity.Rows([{"input_ids": r, "labels": list(r)} for r in part])

    # qwen2_bf16: the Qwen2 case saved in bfloat16, loaded by dtype="auto" (bfloat16) and
    # trained in bfloat16 weights (no --bf16: the parameters, gradients and AdamW states are
    # bfloat16 themselves).
    cases = CASES + [("qwen2_bf16", CASES[0][1], CASES[0][2])]
    for case, config, cls in cases:
        folder = parity.OUT / case
        folder.mkdir()
        (folder / "blocks.json").write_text(json.dumps({"train": train_rows, "eval": eval_rows}))
        torch.manual_seed(0)
        initial = cls(config)
        if case == "qwen2_bf16":
            initial = initial.to(torch.bfloat16)
        initial.save_pretrained(folder / "initial")
        model = cls.from_pretrained(folder / "initial")
        args = parity.common_args(
            case,
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
        trainer = tf.Trainer(
            model=model,
            args=args,
            train_dataset=rows(train_rows),
            eval_dataset=rows(eval_rows),
            data_collator=tf.default_data_collator,
        )
        result = trainer.train()
        parity.write_run(case, trainer, result, model)
        print(case, trainer.state.log_history[-1])


if __name__ == "__main__":
    main()
