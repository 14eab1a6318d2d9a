"""Reference for trainer/tests/mixed_precision.rs: upstream's Trainer (transformers 5.23,
accelerate 1.15) with bf16 autocast on CPU and with label smoothing.

Usage: python trainer_mixed.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Data and starting models are those of trainer_clm.py (tiny GPT-2, dropouts 0, hamlet.txt in
blocks of 64 with the GPT-2 tokenizer: the first 90 blocks train, the next 14 evaluate) and
trainer_parity.py (tiny Llama, attention dropout 0, hamlet.txt in blocks of 64 with the
SmolLM2 tokenizer: 48 train, 8 eval blocks), rebuilt here by the same functions, each cut to
its first 1024 tokens with the ids mapped into them (trainer_clm.py's `small_vocab_model` /
`small_vocab_rows`, trainer_parity.py's `family_blocks`): on a CPU without bfloat16
instructions the bfloat16 GEMMs of a 50257- or 49152-token head made this script ~300 s and
its Rust tests as long.
Every run: CPU (`use_cpu=True`), seed 42, the default random sampler, per-device batch 4,
gradient_accumulation_steps 2, max_steps 12, learning_rate 1e-3, cosine schedule,
warmup_steps 3, weight_decay 0.01, max_grad_norm 1.0, logging_steps 1, evaluation every
6 steps, save_strategy no, report_to none, default_data_collator.

Runs (each writes log_history.json and train_output.json):
  gpt2_bf16/        `bf16=True`: accelerate wraps the model's forward in
                    `torch.autocast("cpu", dtype=torch.bfloat16)` and converts its outputs to
                    fp32; weights, gradients and the optimizer stay fp32.
  llama_bf16/       the same on tiny Llama (RMSNorm and RoPE upcast inside the model).
  gpt2_smoothing/   fp32, `label_smoothing_factor=0.1`: the Trainer pops the labels and applies
                    its LabelSmoother (shift_labels=True for a causal LM) to the logits.
"""

import importlib.util
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
HERE = Path(__file__).resolve().parent
torch.set_num_threads(2)


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Rows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": list(self.rows[i])}


def training_args(name, **kw):
    """The arguments every run shares (see above), plus `kw`."""
    return tf.TrainingArguments(
        output_dir=str(OUT / f".tmp-{name}"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=12,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=3,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=6,
        save_strategy="no",
        seed=42,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        **kw,
    )


def gpt2_setup():
    """Tiny GPT-2 with dropouts 0, saved as OUT/gpt2_initial, and its (train, eval) blocks."""
    clm = sibling("trainer_clm")
    gpt2 = tf.GPT2LMHeadModel.from_pretrained(
        ASSETS / "tiny-gpt2", attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, summary_first_dropout=0.0
    )
    clm.small_vocab_model(gpt2).save_pretrained(OUT / "gpt2_initial")
    blocks = clm.small_vocab_rows(clm.blocks())
    return blocks[: clm.N_TRAIN], blocks[clm.N_TRAIN : clm.N_TRAIN + clm.N_EVAL]


def run(name, model_cls, initial, train_rows, eval_rows, **kw):
    model = model_cls.from_pretrained(initial)
    args = training_args(name, **kw)
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Rows(train_rows),
        eval_dataset=Rows(eval_rows),
        data_collator=tf.default_data_collator,
    )
    result = trainer.train()
    folder = OUT / name
    folder.mkdir()
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "train_output.json").write_text(
        json.dumps({"global_step": result.global_step, "training_loss": result.training_loss}, indent=1)
    )
    shutil.rmtree(args.output_dir, ignore_errors=True)


def main():
    gpt2_train, gpt2_eval = gpt2_setup()
    (OUT / "gpt2_blocks.json").write_text(json.dumps({"train": gpt2_train, "eval": gpt2_eval}))

    parity = sibling("trainer_parity")
    llama = tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama", attention_dropout=0.0)
    llama.resize_token_embeddings(parity.FAMILY_VOCAB)
    llama.save_pretrained(OUT / "llama_initial")
    blocks = parity.family_blocks()
    llama_train, llama_eval = blocks[:48], blocks[48:56]
    (OUT / "llama_blocks.json").write_text(json.dumps({"train": llama_train, "eval": llama_eval}))

    run("gpt2_bf16", tf.GPT2LMHeadModel, OUT / "gpt2_initial", gpt2_train, gpt2_eval, bf16=True)
    run("llama_bf16", tf.LlamaForCausalLM, OUT / "llama_initial", llama_train, llama_eval, bf16=True)
    run(
        "gpt2_smoothing",
        tf.GPT2LMHeadModel,
        OUT / "gpt2_initial",
        gpt2_train,
        gpt2_eval,
        label_smoothing_factor=0.1,
    )


if __name__ == "__main__":
    main()
