"""Reference for trainer/tests/sampling.rs: upstream's Trainer (transformers 5.23,
accelerate 1.15) with `train_sampling_strategy="group_by_length"`, and with dropout on.

Usage: python trainer_sampling.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Data: the first 40 (train) and next 8 (eval) fresh / rotten rows of Rotten Tomatoes
(assets/text), tokenized with assets/minilm's tokenizer (truncation, max_length 48, no
padding), label fresh = 0 / rotten = 1, batched by `DataCollatorWithPadding`; written to
rows.json (`train`, `eval`: input_ids, token_type_ids, attention_mask, labels).
Model: assets/tiny-bert (BERT, 2 layers, 64 wide) under a 2-label
`BertForSequenceClassification` head initialised after `torch.manual_seed(0)`, saved with
its dropouts (hidden 0.1, attention 0.1) into initial/.
Arguments: CPU, seed 42, per_device_train_batch_size 4, gradient_accumulation_steps 2,
2 epochs (10 steps), lr 1e-3, linear schedule, warmup_steps 1, max_grad_norm 1.0,
logging_steps 1, evaluation at the end of each epoch (per_device_eval_batch_size 4),
save_strategy no, report_to none.

Runs (log_history.json and order.json: dataset indices in the order the train loader read
them, eval reads excluded):
  group_by_length/   `train_sampling_strategy="group_by_length"`, dropout on: the
                     LengthGroupedSampler draws `torch.randperm` from the global generator
                     after torch's DataLoader iterator drew its base seed from it.
  random_dropout/    the default random sampler, dropout on: the global generator feeds
                     only the dropout masks (and the loaders' base seeds).
"""

import bz2
import csv
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
torch.set_num_threads(2)


class Rows(Dataset):
    def __init__(self, rows, order=None):
        self.rows = rows
        self.order = order

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        if self.order is not None:
            self.order.append(int(i))
        return dict(self.rows[i])


def data():
    with bz2.open(ASSETS / "text" / "rotten_tomatoes_corpus.csv.bz2", "rt", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["category"] in ("fresh", "rotten")][:48]
    tok = tf.AutoTokenizer.from_pretrained(ASSETS / "minilm")
    out = []
    for r in rows:
        enc = tok(r["text"], truncation=True, max_length=48)
        out.append({**{k: list(v) for k, v in enc.items()}, "labels": ["fresh", "rotten"].index(r["category"])})
    return tok, {"train": out[:40], "eval": out[40:]}


def run(name, tok, rows, **kw):
    model = tf.BertForSequenceClassification.from_pretrained(OUT / "initial")
    args = tf.TrainingArguments(
        output_dir=str(OUT / f".tmp-{name}"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=1,
        max_grad_norm=1.0,
        logging_steps=1,
        eval_strategy="epoch",
        save_strategy="no",
        seed=42,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        **kw,
    )
    order = []
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Rows(rows["train"], order),
        eval_dataset=Rows(rows["eval"]),
        data_collator=tf.DataCollatorWithPadding(tok),
    )
    trainer.train()
    folder = OUT / name
    folder.mkdir()
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "order.json").write_text(json.dumps(order))
    shutil.rmtree(args.output_dir, ignore_errors=True)


def main():
    tok, rows = data()
    (OUT / "rows.json").write_text(json.dumps(rows))
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification.from_pretrained(ASSETS / "tiny-bert", num_labels=2)
    model.save_pretrained(OUT / "initial")
    run("group_by_length", tok, rows, train_sampling_strategy="group_by_length")
    run("random_dropout", tok, rows)


if __name__ == "__main__":
    main()
