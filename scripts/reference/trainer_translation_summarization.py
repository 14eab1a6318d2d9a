"""Reference for examples/tests/it/examples_seq2seq.rs: upstream's run_translation.py and
run_summarization.py (transformers 5.23) on small offline data, their steps re-implemented
here verbatim around `Seq2SeqTrainer` (the `datasets` and `evaluate` packages are not
installed): the preprocessing, `DataCollatorForSeq2Seq`, the metrics (sacreBLEU's
`corpus_bleu`, which `evaluate`'s sacrebleu calls; ROUGE by rouge-score with the per-pair
mean instead of `evaluate`'s bootstrap median, as examples/src/rouge.rs does), the final
evaluation / prediction with the scripts' generation options and
`generated_predictions.txt`.

Usage: python trainer_translation_summarization.py OUT_DIR
(TCHTRAIN_ASSETS names the assets folder; nltk's punkt_tab comes from its nltk_data/.)

Data: the speeches of assets/text/hamlet.txt (the lines after a speaker's name).
translation/  train.json (64 rows, JSON lines), validation.jsonl (16), test.json (16):
              {"id", "translation": {"en": a line, "ro": toy(line)}} (toy: lowercased, a
              few words mapped); flags as the run below with
              --source_prefix "translate English to Romanian: ".
summarization/ train.csv (48 rows, one with an empty summary), validation.csv (12), test.csv
              (12): columns text (2-4 lines of a speech) and summary (its first one or two
              sentences by nltk); --source_prefix "summarize: ".
Each folder: initial/ (a WordLevel tokenizer over every word of the data, `<pad>` 0, `</s>` 1,
`<unk>` 2, a Whitespace pre-tokenizer, `$A </s>` post-processing; a tiny T5 with dropout 0
made after `torch.manual_seed(0)`, saved and reloaded), ids.json (the tokenized splits;
translation also with --pad_to_max_length and with --ignore_pad_token_for_loss false),
log_history.json, train_output.json, train_results.json, eval_results.json,
predict_results.json, all_results.json, generated_predictions.txt.
Training flags: per_device_train_batch_size 8, per_device_eval_batch_size 8, 2 epochs, lr 3e-3
linear with 2 warm-up steps, weight_decay 0.01, eval_strategy epoch, predict_with_generate,
max_source_length 32, max_target_length 32, val_max_target_length 16, num_beams 2,
logging_steps 1, save_strategy no, seed 42, use_cpu.
punkt.json: [[text, nltk.sent_tokenize(text)], ...] for the summarization texts and some
edge cases.
"""

import csv
import json
import os
import shutil
import sys
from pathlib import Path

import nltk
import numpy as np
import sacrebleu
import torch
from rouge_score import rouge_scorer
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing
from torch.utils.data import Dataset

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
os.environ.setdefault("NLTK_DATA", str(ASSETS / "nltk_data"))
nltk.data.path.insert(0, str(ASSETS / "nltk_data"))
torch.set_num_threads(2)

WORDS = {
    "the": "le", "and": "si", "of": "de", "to": "la", "i": "eu", "you": "tu", "my": "meu",
    "is": "este", "it": "el", "not": "nu", "that": "ca", "in": "in", "a": "un", "me": "mie",
    "with": "cu", "lord": "domn", "what": "ce", "his": "lui", "this": "acest", "be": "fi",
}


class Rows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return dict(self.rows[i])


def speeches():
    lines = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8").splitlines()
    out, current = [], None
    for line in lines:
        s = line.strip()
        if s and s.upper() == s and any(c.isalpha() for c in s):
            if current:
                out.append(current)
            current = []
        elif not s:
            if current:
                out.append(current)
            current = None
        elif current is not None:
            current.append(s)
    if current:
        out.append(current)
    return out


def toy(line):
    words = line.lower().split()
    return " ".join(WORDS.get(w, w) for w in words)


def make_tokenizer(texts, folder):
    tmp = Tokenizer(WordLevel(vocab={"<pad>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    tmp.pre_tokenizer = Whitespace()
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for text in texts:
        for word, _ in tmp.pre_tokenizer.pre_tokenize_str(text):
            vocab.setdefault(word, len(vocab))
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(folder / "initial")
    return len(vocab)


def make_model(vocab_size, folder):
    config = tf.T5Config(
        vocab_size=vocab_size, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=12, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(config)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(config.vocab_size, config.d_model))
    model.save_pretrained(folder / "initial")


def training_args(name, **kw):
    return tf.Seq2SeqTrainingArguments(
        output_dir=str(OUT / f".tmp-{name}"), per_device_train_batch_size=8,
        per_device_eval_batch_size=8, num_train_epochs=2, learning_rate=3e-3,
        lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.01, eval_strategy="epoch",
        predict_with_generate=True, logging_steps=1, save_strategy="no", seed=42, use_cpu=True,
        report_to="none", disable_tqdm=True, **kw,
    )


def tokenize(tokenizer, inputs, targets, max_source_length, max_target_length, padding, ignore_pad):
    """The scripts' preprocess_function after the inputs / targets are picked."""
    model_inputs = tokenizer(inputs, max_length=max_source_length, padding=padding, truncation=True)
    labels = tokenizer(text_target=targets, max_length=max_target_length, padding=padding, truncation=True)
    if padding == "max_length" and ignore_pad:
        labels["input_ids"] = [
            [(l if l != tokenizer.pad_token_id else -100) for l in label] for label in labels["input_ids"]
        ]
    model_inputs["labels"] = labels["input_ids"]
    keys = list(model_inputs.keys())
    return [{k: model_inputs[k][i] for k in keys} for i in range(len(inputs))]


def write_json(path, value):
    path.write_text(json.dumps(value, indent=1))


def finish(folder, name, trainer, result, train_samples, eval_gen, predict_rows, predict_gen, tokenizer, train_extra):
    """The scripts' train / evaluate / predict steps and files."""
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    write_json(
        folder / "train_output.json",
        {"global_step": result.global_step, "training_loss": result.training_loss},
    )
    metrics = result.metrics
    metrics["train_samples"] = train_samples
    all_results = {**metrics}
    write_json(folder / "train_results.json", metrics)
    metrics = trainer.evaluate(metric_key_prefix="eval", **eval_gen)
    metrics["eval_samples"] = len(trainer.eval_dataset)
    all_results.update(metrics)
    write_json(folder / "eval_results.json", metrics)
    predict_results = trainer.predict(predict_rows, metric_key_prefix="predict", **predict_gen)
    metrics = predict_results.metrics
    metrics["predict_samples"] = len(predict_rows)
    all_results.update(metrics)
    write_json(folder / "predict_results.json", metrics)
    write_json(folder / "all_results.json", all_results)
    predictions = predict_results.predictions
    predictions = np.where(predictions != -100, predictions, tokenizer.pad_token_id)
    predictions = tokenizer.batch_decode(
        predictions, skip_special_tokens=True, clean_up_tokenization_spaces=True
    )
    predictions = [pred.strip() for pred in predictions]
    (folder / "generated_predictions.txt").write_text("\n".join(predictions), encoding="utf-8")
    shutil.rmtree(trainer.args.output_dir, ignore_errors=True)


def translation(all_speeches):
    folder = OUT / "translation"
    folder.mkdir()
    lines = [l for sp in all_speeches for l in sp if len(l.split()) >= 3][:96]
    rows = [{"id": str(i), "translation": {"en": l, "ro": toy(l)}} for i, l in enumerate(lines)]
    splits = {"train": rows[:64], "validation": rows[64:80], "test": rows[80:96]}
    files = {"train": "train.json", "validation": "validation.jsonl", "test": "test.json"}
    for split, part in splits.items():
        with open(folder / files[split], "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    prefix = "translate English to Romanian: "
    texts = [prefix] + [r["translation"][k] for r in rows for k in ("en", "ro")]
    make_tokenizer(texts, folder)
    tokenizer = tf.AutoTokenizer.from_pretrained(folder / "initial")
    make_model(len(tokenizer), folder)
    model = tf.AutoModelForSeq2SeqLM.from_pretrained(folder / "initial")
    assert len(tokenizer) <= model.get_input_embeddings().weight.shape[0]
    assert model.config.decoder_start_token_id is not None

    def preprocess(part, max_target_length, padding=False, ignore_pad=True):
        inputs = [prefix + ex["translation"]["en"] for ex in part]
        targets = [ex["translation"]["ro"] for ex in part]
        return tokenize(tokenizer, inputs, targets, 32, max_target_length, padding, ignore_pad)

    data = {
        "train": preprocess(splits["train"], 32),
        "validation": preprocess(splits["validation"], 16),
        "test": preprocess(splits["test"], 16),
    }
    padded = preprocess(splits["train"], 32, "max_length")
    padded_keep = preprocess(splits["train"], 32, "max_length", ignore_pad=False)
    write_json(
        folder / "ids.json",
        {
            **{f"{s}_{k}": [r[k] for r in rows] for s, rows in data.items() for k in ("input_ids", "attention_mask", "labels")},
            "train_padded_input_ids": [r["input_ids"] for r in padded],
            "train_padded_attention_mask": [r["attention_mask"] for r in padded],
            "train_padded_labels": [r["labels"] for r in padded],
            "train_padded_keep_pad_labels": [r["labels"] for r in padded_keep],
        },
    )

    def postprocess_text(preds, labels):
        preds = [pred.strip() for pred in preds]
        labels = [[label.strip()] for label in labels]
        return preds, labels

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = tokenizer.batch_decode(preds, skip_special_tokens=True)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
        decoded_preds, decoded_labels = postprocess_text(decoded_preds, decoded_labels)
        # evaluate's sacrebleu: references transposed into streams, then corpus_bleu.
        refs = [[r[i] for r in decoded_labels] for i in range(len(decoded_labels[0]))]
        result = {"bleu": sacrebleu.corpus_bleu(decoded_preds, refs).score}
        prediction_lens = [np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds]
        result["gen_len"] = np.mean(prediction_lens)
        result = {k: round(v, 4) for k, v in result.items()}
        return result

    args = training_args("translation")
    trainer = tf.Seq2SeqTrainer(
        model=model, args=args, train_dataset=Rows(data["train"]),
        eval_dataset=Rows(data["validation"]), processing_class=tokenizer,
        data_collator=tf.DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=compute_metrics,
    )
    result = trainer.train()
    trainer.save_model()
    gen = {"max_length": 16, "num_beams": 2}
    finish(folder, "translation", trainer, result, len(data["train"]), gen, Rows(data["test"]), gen, tokenizer, None)


def summarization(all_speeches):
    folder = OUT / "summarization"
    folder.mkdir()
    rows = []
    for sp in all_speeches:
        if 2 <= len(sp) <= 4 and len(rows) < 72:
            text = " ".join(sp)
            sentences = nltk.sent_tokenize(text)
            summary = " ".join(sentences[: 1 + len(rows) % 2])
            rows.append({"text": text, "summary": summary})
    rows[5]["summary"] = ""
    splits = {"train": rows[:48], "validation": rows[48:60], "test": rows[60:72]}
    for split, part in splits.items():
        with open(folder / f"{split}.csv", "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["text", "summary"])
            w.writeheader()
            w.writerows(part)
    prefix = "summarize: "
    texts = [prefix] + [r[k] for r in rows for k in ("text", "summary")]
    make_tokenizer(texts, folder)
    tokenizer = tf.AutoTokenizer.from_pretrained(folder / "initial")
    make_model(len(tokenizer), folder)
    model = tf.AutoModelForSeq2SeqLM.from_pretrained(folder / "initial")

    def preprocess(part, max_target_length):
        inputs, targets = [], []
        for ex in part:
            # the csv loader reads an empty cell as None
            if ex["text"] and ex["summary"]:
                inputs.append(ex["text"])
                targets.append(ex["summary"])
        inputs = [prefix + inp for inp in inputs]
        return tokenize(tokenizer, inputs, targets, 32, max_target_length, False, True)

    data = {
        "train": preprocess(splits["train"], 32),
        "validation": preprocess(splits["validation"], 16),
        "test": preprocess(splits["test"], 16),
    }
    write_json(
        folder / "ids.json",
        {f"{s}_{k}": [r[k] for r in rows] for s, rows in data.items() for k in ("input_ids", "labels")},
    )
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)

    def postprocess_text(preds, labels):
        preds = [pred.strip() for pred in preds]
        labels = [label.strip() for label in labels]
        preds = ["\n".join(nltk.sent_tokenize(pred)) for pred in preds]
        labels = ["\n".join(nltk.sent_tokenize(label)) for label in labels]
        return preds, labels

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = tokenizer.batch_decode(preds, skip_special_tokens=True)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
        decoded_preds, decoded_labels = postprocess_text(decoded_preds, decoded_labels)
        # evaluate's rouge with the per-pair mean in place of the bootstrap median.
        scores = [scorer.score(r, p) for p, r in zip(decoded_preds, decoded_labels)]
        result = {k: float(np.mean([s[k].fmeasure for s in scores])) for k in scores[0]}
        result = {k: round(v * 100, 4) for k, v in result.items()}
        prediction_lens = [np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds]
        result["gen_len"] = np.mean(prediction_lens)
        return result

    # run_summarization sets these before building the trainer.
    args = training_args("summarization", generation_max_length=16, generation_num_beams=2)
    trainer = tf.Seq2SeqTrainer(
        model=model, args=args, train_dataset=Rows(data["train"]),
        eval_dataset=Rows(data["validation"]), processing_class=tokenizer,
        data_collator=tf.DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=compute_metrics,
    )
    result = trainer.train()
    trainer.save_model()
    finish(folder, "summarization", trainer, result, len(data["train"]), {}, Rows(data["test"]), {}, tokenizer, None)
    return [r["text"] for r in rows] + [r["summary"] for r in rows]


EDGE_CASES = [
    "Mr. Smith went to Washington. He arrived at 3 p.m. on Monday.",
    "J. R. R. Tolkien wrote it. It is long.",
    "The price rose 3.5 percent. Analysts were surprised.",
    "Wait... what happened? Nobody knows!",
    '"Stop." she said. "Go."',
    "He left at 5 a.m. and the rest stayed. it was late.",
    "Dr. Who? No. The U.S. army arrived. then it left.",
    "Hello world",
    "",
    "  Leading spaces. Trailing spaces.  ",
    "One.Two. Three (four.) Five! [Six.] Seven?",
    "Line one.\nLine two.\n\nLine three",
    "It's 1. Then 2. Then 3.",
    "Ask Prof. Brown, Mrs. Green and Mr. White. They know.",
    "Ha! Ha. ha. Ho.",
    "The 1990s. The 2000s. Etc. and so on.",
    "(Sent one.) Sent two.",
    'He said "hi." Then he left.',
    "The U.S.A. is big. It is.",
    "Mr. and Mrs. Smith arrived. They sat.",
    "It was 5 p.m. Tomorrow we go.",
    "Hello!!! Are you there?? Yes!?",
    "'Tis strange. 'Tis true.",
    "Go -- now. Stay.--Yes.",
    "Wait.\tTab follows.",
    "i.e. this is it. e.g. that one.",
    "No. 5 is next. No. 6 too.",
    "\u201cQuoted.\u201d Next one. \u00abAlso.\u00bb Done.",
    "Dr. J. Smith met Prof. K. Lee. They talked.",
]


def main():
    all_speeches = speeches()
    translation(all_speeches)
    texts = summarization(all_speeches)
    punkt = [[t, nltk.sent_tokenize(t)] for t in EDGE_CASES + texts]
    write_json(OUT / "punkt.json", punkt)


if __name__ == "__main__":
    main()
