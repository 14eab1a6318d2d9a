"""Reference for trainer/tests: upstream's Trainer (transformers 5.23) on a causal-LM job.

Usage: python trainer_clm.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

The job: tiny GPT-2 with every dropout set to 0, trained on hamlet.txt grouped into blocks
of 64 tokens exactly as upstream's examples/pytorch/language-modeling/run_clm.py does
(`datasets`' text loader keeps line breaks; `tokenize_function` per line; `group_texts`
over `map(batched=True)` chunks of 1000 lines, each chunk's remainder dropped;
labels = input_ids).
The first 90 blocks train, the next 14 evaluate; default_data_collator; CPU, fp32.

Arguments: per_device_train_batch_size 4 (23 batches, the last of 2 rows),
gradient_accumulation_steps 2 (12 update steps per epoch, the last over one batch),
num_train_epochs 2 (24 steps), learning_rate 1e-3, cosine schedule, warmup_steps 3,
weight_decay 0.01, max_grad_norm 1.0, logging_steps 1, eval every 10 steps with
per_device_eval_batch_size 4, seed 42, save_strategy no, report_to none.

Runs:
  random_ga4/  as random/ but gradient_accumulation_steps 4 (6 update steps per epoch, the last
               over 3 batches; 12 steps).
  sequential/  `train_sampling_strategy="sequential"` (upstream's own switch: `_get_train_sampler`
               returns a SequentialSampler).
  random/      the default `train_sampling_strategy="random"`: a RandomSampler that accelerate
               (`use_seedable_sampler=True`, the default) turns into a SeedableRandomSampler,
               i.e. `torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))`.
`order.json` records the dataset indices in the order the train loader fetched them.
Each run writes log_history.json (state.log_history), train_output.json (global_step,
training_loss, total_flos, the returned metrics' keys) and order.json. OUT_DIR/initial/ holds the starting model
(config with dropouts 0, weights as assets/tiny-gpt2) and OUT_DIR/blocks.json the train and
eval blocks.
"""

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
BLOCK = 64
N_TRAIN = 90
N_EVAL = 14
# The jobs that compute in float16 (trainer_fp16.py, trainer_interop.py,
# deepspeed_mixed_precision.py, fsdp_mixed_precision.py) cut tiny GPT-2 to its first
# SMALL_VOCAB tokens: on a CPU without float16 instructions libtorch's half GEMM takes ~6 s for
# the LM head's weight gradient at GPT-2's 50257 tokens and 256 positions (fp32: 0.2 s), which
# made those jobs (and their Rust tests) the longest of the suite.
SMALL_VOCAB = 1024


def small_vocab_model(model):
    """`model` (GPT-2, tied embeddings) cut to its first SMALL_VOCAB tokens, in place."""
    model.resize_token_embeddings(SMALL_VOCAB)
    model.config.bos_token_id = model.config.eos_token_id = SMALL_VOCAB - 1
    return model


def small_vocab_rows(rows):
    """Token rows with each id mapped into the first SMALL_VOCAB tokens (id % SMALL_VOCAB)."""
    return [[i % SMALL_VOCAB for i in row] for row in rows]


def blocks():
    tok = tf.GPT2TokenizerFast(
        vocab=str(ASSETS / "gpt2-tokenizer" / "vocab.json"),
        merges=str(ASSETS / "gpt2-tokenizer" / "merges.txt"),
    )
    text = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8")
    # datasets' "text" builder with keep_linebreaks=True: lines with their "\n".
    lines = text.splitlines(keepends=True)
    out = []
    for start in range(0, len(lines), 1000):  # map(batched=True), batch_size=1000
        ids = [tok(line)["input_ids"] for line in lines[start : start + 1000]]
        cat = list(chain(*ids))
        total = (len(cat) // BLOCK) * BLOCK
        out.extend(cat[i : i + BLOCK] for i in range(0, total, BLOCK))
    return out


class Rows(Dataset):
    def __init__(self, rows):
        self.rows = rows
        self.order = []

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        self.order.append(int(i))
        return {"input_ids": self.rows[i], "labels": list(self.rows[i])}


def run(name, sampling, train_rows, eval_rows, gradient_accumulation_steps=2):
    model = tf.GPT2LMHeadModel.from_pretrained(OUT / "initial")
    args = tf.TrainingArguments(
        output_dir=str(OUT / f".tmp-{name}"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=gradient_accumulation_steps,
        num_train_epochs=2,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=3,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=10,
        save_strategy="no",
        seed=42,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        train_sampling_strategy=sampling,
    )
    train = Rows(train_rows)
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=Rows(eval_rows),
        data_collator=tf.default_data_collator,
    )
    result = trainer.train()
    folder = OUT / name
    folder.mkdir()
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "train_output.json").write_text(
        json.dumps(
            {
                "global_step": result.global_step,
                "training_loss": result.training_loss,
                "total_flos": trainer.state.total_flos,
                "num_parameters_exclude_embeddings": model.num_parameters(exclude_embeddings=True),
                # The keys of the metrics train() returns: PrinterCallback (disable_tqdm) pops
                # total_flos from that very dict when it is logged.
                "metrics_keys": sorted(result.metrics),
            },
            indent=1,
        )
    )
    (folder / "order.json").write_text(json.dumps(train.order))
    shutil.rmtree(args.output_dir, ignore_errors=True)


def main():
    model = tf.GPT2LMHeadModel.from_pretrained(
        ASSETS / "tiny-gpt2", attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, summary_first_dropout=0.0
    )
    model.save_pretrained(OUT / "initial")
    all_blocks = blocks()
    train_rows, eval_rows = all_blocks[:N_TRAIN], all_blocks[N_TRAIN : N_TRAIN + N_EVAL]
    (OUT / "blocks.json").write_text(
        json.dumps({"block_size": BLOCK, "num_blocks": len(all_blocks), "train": train_rows, "eval": eval_rows})
    )
    run("sequential", "sequential", train_rows, eval_rows)
    run("random", "random", train_rows, eval_rows)
    run("random_ga4", "random", train_rows, eval_rows, gradient_accumulation_steps=4)


if __name__ == "__main__":
    main()
