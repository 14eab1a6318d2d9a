"""Reference for trainer/tests/examples_mlm_ner.rs: upstream's Trainer (transformers 5.23)
on the jobs of upstream's run_mlm.py and run_ner.py, with their data preparation done here
step by step as the scripts do it (the `datasets` package is not installed).

Usage: python trainer_mlm_ner.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Both runs: CPU, fp32, assets/tiny-bert with every dropout 0, assets/minilm's tokenizer,
the default random sampler (seed 42), logging_steps 1, save_strategy no, report_to none.

mlm/  `hamlet_400.txt`: the first 400 lines of hamlet.txt. As run_mlm.py with
      `--validation_split_percentage 10 --max_seq_length 32 --max_train_samples 32
      --max_eval_samples 12`: the text loader's lines (line breaks dropped), the first 10 %
      (40 lines) for validation, each line tokenized with its special tokens
      (`return_special_tokens_mask=True`), `group_texts` into blocks of 32 tokens, the
      first 32 / 12 blocks kept (`blocks.json`). BertForMaskedLM from `mlm/initial/`
      (tiny-bert, dropout 0), `DataCollatorForLanguageModeling(mlm_probability=0.15,
      seed=1234)` shared by training and evaluation, the script's
      preprocess_logits_for_metrics (argmax) and masked-token accuracy.
      per_device_train_batch_size 4, gradient_accumulation_steps 2 (4 update steps per
      epoch), 3 epochs, lr 1e-3, linear schedule, warmup_steps 2, weight_decay 0.01,
      max_grad_norm 1.0, evaluation every epoch (the masks the evaluation draws come from
      the same generator, between the epochs), per_device_eval_batch_size 4; then the
      script's final `trainer.evaluate()` (`eval_results.json`, with perplexity).
ner/  `train.json` (64 rows) and `validation.json` (16 rows): JSON lines with columns
      `id`, `tokens`, `ner_tags` (string IOB2 tags of PER / LOC / ORG), sentences made by a
      seeded `random.Random(0)` from fixed word lists, some words split into several
      word pieces. As run_ner.py: the sorted label list, the words tokenized as pre-split
      input (`is_split_into_words=True`, truncation), labels aligned (-100 for special
      tokens and later sub-words; `ids.json` also holds the labels with
      `label_all_tokens`), `DataCollatorForTokenClassification`. BertForTokenClassification
      from `ner/initial/` (tiny-bert's encoder, a 7-label head initialised after
      `torch.manual_seed(0)`, id2label = the label list, dropout 0).
      per_device_train_batch_size 8 (8 steps per epoch), 3 epochs, lr 2e-3, linear
      schedule, warmup_steps 3, weight_decay 0.01, evaluation every epoch; then
      `trainer.predict` on the validation rows: `predictions.txt` as run_ner.py writes it.
Each run writes log_history.json (state.log_history after train()) and train_output.json.
"""

import json
import math
import os
import random
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


def write_run(folder, trainer, result):
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "train_output.json").write_text(
        json.dumps(
            {
                "global_step": result.global_step,
                "training_loss": result.training_loss,
                "total_flos": trainer.state.total_flos,
            },
            indent=1,
        )
    )


def tiny_bert(cls, folder, **kw):
    torch.manual_seed(0)
    model = cls.from_pretrained(
        ASSETS / "tiny-bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw
    )
    model.save_pretrained(folder / "initial")
    return cls.from_pretrained(folder / "initial")


def mlm():
    folder = OUT / "mlm"
    folder.mkdir()
    lines = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8").splitlines()[:400]
    (folder / "hamlet_400.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    # datasets' text loader (keep_linebreaks=False), split train[:10%] / train[10%:].
    text = (folder / "hamlet_400.txt").read_text(encoding="utf-8").splitlines()
    cut = round(10 * len(text) / 100)
    splits = {"validation": text[:cut], "train": text[cut:]}
    tok = tf.AutoTokenizer.from_pretrained(ASSETS / "minilm")
    block = 32

    def group(part):
        enc = tok(part, return_special_tokens_mask=True)
        out = []
        for start in range(0, len(part), 1000):  # map(batched=True), batch_size=1000
            cat = {k: list(chain(*enc[k][start : start + 1000])) for k in enc.keys()}
            total = (len(cat["input_ids"]) // block) * block
            out.extend(
                {k: v[i : i + block] for k, v in cat.items()} for i in range(0, total, block)
            )
        return out

    train_rows = group(splits["train"])[:32]
    eval_rows = group(splits["validation"])[:12]
    (folder / "blocks.json").write_text(
        json.dumps({"train": [r["input_ids"] for r in train_rows], "eval": [r["input_ids"] for r in eval_rows]})
    )
    model = tiny_bert(tf.BertForMaskedLM, folder)
    args = common_args(
        "mlm",
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=3,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        eval_strategy="epoch",
    )

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        labels = labels.reshape(-1)
        preds = preds.reshape(-1)
        mask = labels != -100
        return {"accuracy": float((preds[mask] == labels[mask]).mean())}

    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Rows(train_rows),
        eval_dataset=Rows(eval_rows),
        processing_class=tok,
        data_collator=tf.DataCollatorForLanguageModeling(tokenizer=tok, mlm_probability=0.15, seed=1234),
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    result = trainer.train()
    write_run(folder, trainer, result)
    metrics = trainer.evaluate()
    metrics["perplexity"] = math.exp(metrics["eval_loss"])
    (folder / "eval_results.json").write_text(json.dumps(metrics, indent=1))
    shutil.rmtree(args.output_dir, ignore_errors=True)


FIRST = ["John", "Maria", "Olufemi", "Chen", "Rasmussen", "Aleksandra", "Tom", "Ingrid"]
LAST = ["Smith", "Okonkwo", "Vanderbilt", "Kowalczyk", "Lee", "Thorvaldsen", "Brown"]
CITY = [["Paris"], ["New", "York"], ["Reykjavik"], ["Ouagadougou"], ["Berlin"], ["San", "Francisco"]]
ORG = [["Acme", "Corp"], ["Unicef"], ["Globex"], ["Initech", "Systems"], ["Zorblatt", "Industries"]]
VERBS = ["visited", "joined", "left", "praised", "met", "called"]
FILLER = ["yesterday", "today", "quietly", "again", "with", "friends", "."]


def sentence(rng):
    words, tags = [], []

    def add(span, kind):
        for i, w in enumerate(span):
            words.append(w)
            tags.append(("B-" if i == 0 else "I-") + kind if kind else "O")

    n_people = rng.randint(1, 2)
    person = [rng.choice(FIRST)] + ([rng.choice(LAST)] if rng.random() < 0.6 else [])
    add(person, "PER")
    add([rng.choice(VERBS)], None)
    if rng.random() < 0.5:
        add(rng.choice(CITY), "LOC")
    else:
        add(rng.choice(ORG), "ORG")
    for _ in range(rng.randint(0, 2)):
        add([rng.choice(FILLER)], None)
    if n_people == 2:
        add(["and"], None)
        add([rng.choice(FIRST)], "PER")
    add(["."], None)
    return words, tags


def ner():
    folder = OUT / "ner"
    folder.mkdir()
    rng = random.Random(0)
    rows = [sentence(rng) for _ in range(80)]
    splits = {"train": rows[:64], "validation": rows[64:]}
    for split, part in splits.items():
        with open(folder / f"{split}.json", "w", encoding="utf-8") as f:
            for i, (words, tags) in enumerate(part):
                f.write(json.dumps({"id": str(i), "tokens": words, "ner_tags": tags}) + "\n")
    label_list = sorted(set(chain(*(t for _, t in splits["train"]))))
    label_to_id = {l: i for i, l in enumerate(label_list)}
    b_to_i = [
        label_list.index(l.replace("B-", "I-")) if l.startswith("B-") and l.replace("B-", "I-") in label_list else i
        for i, l in enumerate(label_list)
    ]
    tok = tf.AutoTokenizer.from_pretrained(ASSETS / "minilm")

    def tokenize_and_align_labels(part, label_all_tokens):
        enc = tok([w for w, _ in part], truncation=True, max_length=None, is_split_into_words=True)
        rows = []
        for i, (_, tags) in enumerate(part):
            previous, labels = None, []
            for word in enc.word_ids(batch_index=i):
                if word is None:
                    labels.append(-100)
                elif word != previous:
                    labels.append(label_to_id[tags[word]])
                else:
                    labels.append(b_to_i[label_to_id[tags[word]]] if label_all_tokens else -100)
                previous = word
            rows.append({**{k: enc[k][i] for k in enc.keys()}, "labels": labels})
        return rows

    data = {split: tokenize_and_align_labels(part, False) for split, part in splits.items()}
    all_tokens = {split: tokenize_and_align_labels(part, True) for split, part in splits.items()}
    (folder / "ids.json").write_text(
        json.dumps(
            {
                "labels": label_list,
                **{f"{s}_input_ids": [r["input_ids"] for r in rows] for s, rows in data.items()},
                **{f"{s}_labels": [r["labels"] for r in rows] for s, rows in data.items()},
                **{f"{s}_labels_all_tokens": [r["labels"] for r in rows] for s, rows in all_tokens.items()},
            }
        )
    )
    model = tiny_bert(
        tf.BertForTokenClassification,
        folder,
        num_labels=len(label_list),
        id2label=dict(enumerate(label_list)),
        label2id=label_to_id,
    )
    args = common_args(
        "ner",
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_train_epochs=3,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        warmup_steps=3,
        weight_decay=0.01,
        eval_strategy="epoch",
    )
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Rows(data["train"]),
        eval_dataset=Rows(data["validation"]),
        processing_class=tok,
        data_collator=tf.DataCollatorForTokenClassification(tok),
    )
    result = trainer.train()
    write_run(folder, trainer, result)
    predictions, labels, _ = trainer.predict(Rows(data["validation"]), metric_key_prefix="predict")
    predictions = predictions.argmax(axis=2)
    lines = [
        " ".join(label_list[p] for p, l in zip(prediction, label) if l != -100) + "\n"
        for prediction, label in zip(predictions, labels)
    ]
    (folder / "predictions.txt").write_text("".join(lines))
    shutil.rmtree(args.output_dir, ignore_errors=True)


def main():
    mlm()
    ner()


if __name__ == "__main__":
    main()
