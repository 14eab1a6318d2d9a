"""Reference for trainer/tests/parity.rs: upstream's Trainer (transformers 5.23) on a
sequence-classification job (MiniLM) and a causal-LM job with weight decay (tiny Llama).

Usage: python trainer_parity.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Both runs: CPU, fp32, dropout off, the default random sampler (accelerate's
SeedableRandomSampler, seed 42), logging_steps 1, save_strategy no, report_to none.

minilm_cls/  assets/minilm under a fresh 2-label head (`BertForSequenceClassification`,
             `torch.manual_seed(0)` before the head is initialised; hidden and attention
             dropout 0), saved with `save_pretrained` into minilm_cls/initial/ so that the
             Rust side starts from the same weights. Data: the first 48 (train) and next 16
             (eval) fresh / rotten rows of Rotten Tomatoes (assets/text), written as
             train.jsonl / eval.jsonl with columns `sentence`, `label` ("fresh" / "rotten";
             sorted label list, fresh = 0). Tokenized with assets/minilm's tokenizer
             (truncation, max_length 64, no padding: `ids.json` holds the ids), batched by
             `DataCollatorWithPadding`. per_device_train_batch_size 8,
             gradient_accumulation_steps 2 (3 update steps per epoch), 3 epochs, lr 5e-5,
             linear schedule, warmup_steps 2, weight_decay 0.01, evaluation every epoch.
llama_wd/    assets/tiny-llama (LlamaForCausalLM, tied embeddings), hamlet.txt tokenized with
             assets/smollm2-135m's tokenizer and grouped into blocks of 64 as run_clm does
             (blocks.json: 48 train, 8 eval blocks), default_data_collator,
             per_device_train_batch_size 4, gradient_accumulation_steps 2 (6 update steps per
             epoch), 2 epochs, lr 2e-3, linear schedule, warmup_steps 2, weight_decay 0.1,
             max_grad_norm 1.0, evaluation every 6 steps. `decay_parameters.json` holds
             upstream's `get_decay_parameter_names(model)`.
llama_neftune/  llama_wd's job (its initial weights and blocks) for one epoch with
             `neftune_noise_alpha` 5: upstream's NEFTune hook on `embed_tokens` adds
             uniform noise drawn from the global generator (seeded 42 by the Trainer) in
             training mode only; evaluation (every 3 steps) runs without it.
minilm_weighted/  the documentation's custom `compute_loss` (a `Trainer` subclass whose loss
             is `nn.CrossEntropyLoss(weight=...)` on the logits, the labels popped from the
             inputs) with class weights [1.0, 3.0] on minilm_cls's job (same initial weights
             and rows, reused from minilm_cls/).
Each run writes log_history.json and train_output.json.
"""

import bz2
import csv
import io
import json
import os
import shutil
import sys
from itertools import chain
from pathlib import Path

import torch
from torch.utils.data import Dataset

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
torch.set_num_threads(2)


class Rows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return dict(self.rows[i])


def common_args(name, **kw):
    return tf.TrainingArguments(
        output_dir=str(OUT / f".tmp-{name}"),
        logging_steps=1,
        save_strategy="no",
        seed=42,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        **kw,
    )


def write_run(name, trainer, result, model):
    folder = OUT / name
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "train_output.json").write_text(
        json.dumps(
            {
                "global_step": result.global_step,
                "training_loss": result.training_loss,
                "total_flos": trainer.state.total_flos,
                "num_parameters_exclude_embeddings": model.num_parameters(exclude_embeddings=True),
            },
            indent=1,
        )
    )
    shutil.rmtree(trainer.args.output_dir, ignore_errors=True)


def minilm_args(name):
    return common_args(
        name,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=2,
        num_train_epochs=3,
        learning_rate=5e-5,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.01,
        eval_strategy="epoch",
    )


def minilm_cls():
    folder = OUT / "minilm_cls"
    folder.mkdir()
    with bz2.open(ASSETS / "text" / "rotten_tomatoes_corpus.csv.bz2", "rt", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["category"] in ("fresh", "rotten")][:64]
    splits = {"train": rows[:48], "eval": rows[48:]}
    for split, part in splits.items():
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps({"sentence": r["text"], "label": r["category"]}) + "\n")
    labels = sorted({r["category"] for r in splits["train"]})
    tok = tf.AutoTokenizer.from_pretrained(ASSETS / "minilm")
    data, ids = {}, {}
    for split, part in splits.items():
        enc = [tok(r["text"], truncation=True, max_length=64) for r in part]
        ids[split] = [e["input_ids"] for e in enc]
        data[split] = [
            {**{k: list(v) for k, v in e.items()}, "labels": labels.index(r["category"])}
            for e, r in zip(enc, part)
        ]
    (folder / "ids.json").write_text(json.dumps({"labels": labels, **ids}))
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification.from_pretrained(
        ASSETS / "minilm", num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    model.save_pretrained(folder / "initial")
    model = tf.BertForSequenceClassification.from_pretrained(folder / "initial")
    args = minilm_args("minilm_cls")
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Rows(data["train"]),
        eval_dataset=Rows(data["eval"]),
        data_collator=tf.DataCollatorWithPadding(tok),
    )
    result = trainer.train()
    (folder / "decay_parameters.json").write_text(json.dumps(sorted(trainer.get_decay_parameter_names(model))))
    write_run("minilm_cls", trainer, result, model)
    return data, tok


class WeightedLossTrainer(tf.Trainer):
    """The documentation's example of a custom loss (class weights in the cross entropy)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        loss_fct = torch.nn.CrossEntropyLoss(weight=torch.tensor([1.0, 3.0], device=model.device))
        loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
        return (loss, outputs) if return_outputs else loss


def minilm_weighted(data, tok):
    folder = OUT / "minilm_weighted"
    folder.mkdir()
    model = tf.BertForSequenceClassification.from_pretrained(OUT / "minilm_cls" / "initial")
    args = minilm_args("minilm_weighted")
    trainer = WeightedLossTrainer(
        model=model,
        args=args,
        train_dataset=Rows(data["train"]),
        eval_dataset=Rows(data["eval"]),
        data_collator=tf.DataCollatorWithPadding(tok),
    )
    result = trainer.train()
    write_run("minilm_weighted", trainer, result, model)


# The vocabulary of the families' Trainer runs (trainer_families.py, decoder_families.py,
# qwen3_5.py, gemma4.py, packed_sequences.py): tiny models of FAMILY_VOCAB tokens trained on the
# Hamlet blocks with SmolLM2's token ids taken modulo FAMILY_VOCAB. At SmolLM2's 49152 tokens
# the LM head, its AdamW state and the cross-entropy were ~90% of each step of these hidden-64
# models (20 steps of a tiny OLMo 2: 8.5 s of one core; at 1024 tokens 1.2 s), on both sides.
FAMILY_VOCAB = 1024


def family_blocks():
    """`llama_blocks()` with every id taken modulo FAMILY_VOCAB."""
    return [[i % FAMILY_VOCAB for i in b] for b in llama_blocks()]


def llama_blocks(block=64):
    tok = tf.PreTrainedTokenizerFast(tokenizer_file=str(ASSETS / "smollm2-135m" / "tokenizer.json"))
    lines = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    out = []
    for start in range(0, len(lines), 1000):
        cat = list(chain(*(tok(line)["input_ids"] for line in lines[start : start + 1000])))
        total = (len(cat) // block) * block
        out.extend(cat[i : i + block] for i in range(0, total, block))
    return out


def llama_wd():
    folder = OUT / "llama_wd"
    folder.mkdir()
    blocks = llama_blocks()
    train_rows, eval_rows = blocks[:48], blocks[48:56]
    (folder / "blocks.json").write_text(json.dumps({"train": train_rows, "eval": eval_rows}))
    model = tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama", attention_dropout=0.0)
    model.save_pretrained(folder / "initial")
    model = tf.LlamaForCausalLM.from_pretrained(folder / "initial")
    args = common_args(
        "llama_wd",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.1,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=6,
    )

    def rows(part):
        return Rows([{"input_ids": r, "labels": list(r)} for r in part])

    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=rows(train_rows),
        eval_dataset=rows(eval_rows),
        data_collator=tf.default_data_collator,
    )
    result = trainer.train()
    (folder / "decay_parameters.json").write_text(json.dumps(sorted(trainer.get_decay_parameter_names(model))))
    write_run("llama_wd", trainer, result, model)


def llama_neftune():
    folder = OUT / "llama_neftune"
    folder.mkdir()
    blocks = json.loads((OUT / "llama_wd" / "blocks.json").read_text())
    model = tf.LlamaForCausalLM.from_pretrained(OUT / "llama_wd" / "initial")
    args = common_args(
        "llama_neftune",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.1,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=3,
        neftune_noise_alpha=5.0,
    )

    def rows(part):
        return Rows([{"input_ids": r, "labels": list(r)} for r in part])

    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=rows(blocks["train"]),
        eval_dataset=rows(blocks["eval"]),
        data_collator=tf.default_data_collator,
    )
    result = trainer.train()
    write_run("llama_neftune", trainer, result, model)


def main():
    data, tok = minilm_cls()
    minilm_weighted(data, tok)
    llama_wd()
    llama_neftune()


if __name__ == "__main__":
    main()
