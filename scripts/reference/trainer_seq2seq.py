"""Reference for trainer/tests: a tiny T5 trained and evaluated by transformers 5.23's Seq2SeqTrainer.

Usage: python trainer_seq2seq.py OUT_DIR

OUT_DIR/t5/initial/ holds a tiny T5 v1.1-style model (gated GELU, untied head, dropout 0.1,
made after `torch.manual_seed(0)`) and a word-level tokenizer of its 99 ids (`<pad>` 0,
`</s>` 1, `<unk>` 2, `t3`..`t98`). The task: reverse a 4-9 token sequence (at most 6 tokens
kept), each side ending with `</s>`; OUT_DIR/t5/rows.json holds 64 training and 16
evaluation rows of `input_ids` / `labels`.

The run: Seq2SeqTrainingArguments with batch 4, gradient accumulation 2 (T5's loss is a
per-batch mean although its forward takes loss kwargs: upstream does not divide it by the
accumulation steps), 20 steps, lr 3e-3 linear after 2 warm-up steps, weight decay 0.01,
clipping at 1.0, evaluation every 10 steps with predict_with_generate, generation_max_length
10 and generation_num_beams 2, padded by DataCollatorForSeq2Seq given the model;
compute_metrics as run_summarization's `gen_len` (mean count of non-pad predicted ids) plus
`exact_match` (rows whose non-pad predicted ids after the decoder start equal the non-pad
labels). OUT_DIR/t5/log_history.json is the run; then `predict` on the evaluation rows with
`max_new_tokens=6, num_beams=1`: OUT_DIR/t5/predict.safetensors holds predictions and
label_ids (-100 padding across batches), predict_metrics.json its metrics.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

import transformers as tf

HERE = Path(__file__).resolve().parent


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(n, g):
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 10, (1,), generator=g))
        src = torch.randint(3, 99, (length,), generator=g).tolist()
        out.append({"input_ids": src + [1], "labels": list(reversed(src))[:6] + [1]})
    return out


def main():
    parity = sibling("trainer_parity")
    folder = parity.OUT / "t5"
    (folder / "initial").mkdir(parents=True)
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, 99)}}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(folder / "initial")
    config = tf.T5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=12, dropout_rate=0.1,
        decoder_start_token_id=0, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(config)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(config.vocab_size, config.d_model))
    model.save_pretrained(folder / "initial")
    model = tf.T5ForConditionalGeneration.from_pretrained(folder / "initial")
    g = torch.Generator().manual_seed(7)
    data = {"train": rows(64, g), "eval": rows(16, g)}
    (folder / "rows.json").write_text(json.dumps(data))

    def compute_metrics(p):
        preds = np.where(p.predictions != -100, p.predictions, tokenizer.pad_token_id)
        labels = np.where(p.label_ids != -100, p.label_ids, tokenizer.pad_token_id)
        lens = [np.count_nonzero(r != tokenizer.pad_token_id) for r in preds]
        exact = [
            list(pr[1:][pr[1:] != 0]) == list(lb[lb != 0]) for pr, lb in zip(preds, labels)
        ]
        return {"gen_len": float(np.mean(lens)), "exact_match": float(np.mean(exact))}

    kw = dict(
        output_dir=str(parity.OUT / ".tmp-t5"), logging_steps=1, save_strategy="no", seed=42,
        use_cpu=True, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=4, per_device_eval_batch_size=8, gradient_accumulation_steps=2,
        max_steps=20, learning_rate=3e-3, lr_scheduler_type="linear", warmup_steps=2,
        weight_decay=0.01, max_grad_norm=1.0, eval_strategy="steps", eval_steps=10,
        predict_with_generate=True, generation_max_length=10, generation_num_beams=2,
    )
    args = tf.Seq2SeqTrainingArguments(**kw)
    trainer = tf.Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=parity.Rows(data["train"]),
        eval_dataset=parity.Rows(data["eval"]),
        data_collator=tf.DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
    )
    result = trainer.train()
    parity.write_run("t5", trainer, result, model)
    pred = trainer.predict(parity.Rows(data["eval"]), max_new_tokens=6, num_beams=1)
    save_file(
        {
            "predictions": np.ascontiguousarray(pred.predictions.astype(np.int64)),
            "label_ids": np.ascontiguousarray(pred.label_ids.astype(np.int64)),
        },
        str(folder / "predict.safetensors"),
    )
    (folder / "predict_metrics.json").write_text(json.dumps(pred.metrics, indent=1))
    print(json.dumps(trainer.state.log_history[-3:], indent=1))
    print(pred.metrics, pred.predictions.shape)


if __name__ == "__main__":
    main()
