"""Reference for trainer/tests/it/interop.rs: checkpoints passed between upstream's Trainer
(transformers 5.23, accelerate 1.15) and ours, in torch's own files (`optimizer.pt`,
`scheduler.pt`, `rng_state.pth`, `scaler.pt`).

Usage: python trainer_interop.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)
       python trainer_interop.py resume OUT_DIR CHECKPOINT RUN [OUT_DIR CHECKPOINT RUN ...]
The second form is what the Rust test runs on checkpoints our Trainer wrote: for each
triple, upstream's Trainer, set up as RUN below, resumes CHECKPOINT
(`train(resume_from_checkpoint=...)`) and writes OUT_DIR/log_history.json. The triples run
one after another in one process (one import of torch and transformers).

Model: assets/tiny-gpt2 with its dropouts on (attn / embd / resid 0.1), cut to trainer_clm.py's
SMALL_VOCAB tokens (float16 GEMMs are slow on a CPU), saved into initial/.
Data: the first 24 hamlet blocks of 64 tokens (trainer_clm.py's `blocks`, ids mapped with
id % SMALL_VOCAB), labels = input_ids, default_data_collator; written to blocks.json (`train`).
Arguments: CPU, seed 42, per_device_train_batch_size 4 (6 batches an epoch), max_steps 10
(step 5 is mid-epoch, the run crosses an epoch boundary after it), learning_rate 1e-3,
cosine schedule, warmup_steps 2, weight_decay 0.01, max_grad_norm 1.0, logging_steps 1,
save_steps 5, the default random sampler, report_to none.

Runs (each: log_history.json of the uninterrupted 10 steps, and checkpoint-5/ with every file
upstream wrote there, which is what a run stopped after step 5 leaves):
  adamw_torch/        optim adamw_torch.
  adamw_torch_fused/  optim adamw_torch_fused.
  bf16_fused/         adamw_torch_fused with bf16 autocast (as trainer_mixed.py).
  fp16/               adamw_torch with fp16 as accelerate runs it on a GPU, on the CPU
                      (trainer_fp16.py): `native_amp = True` and `torch.amp.GradScaler("cpu",
                      init_scale=2**20, growth_interval=4)`; checkpoint-5 holds scaler.pt.
"""

import importlib.util
import json
import math
import os
import shutil
import sys
from pathlib import Path

import torch

import transformers as tf

HERE = Path(__file__).resolve().parent
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
torch.set_num_threads(2)
N_TRAIN = 24
INIT_SCALE = 2.0**20
GROWTH_INTERVAL = 4

RUNS = {
    "adamw_torch": dict(optim="adamw_torch"),
    "adamw_torch_fused": dict(optim="adamw_torch_fused"),
    "bf16_fused": dict(optim="adamw_torch_fused", bf16=True),
    "fp16": dict(optim="adamw_torch", fp16=True),
}


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": list(self.rows[i])}


def finite_or_name(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def trainer_for(run, output_dir, initial, rows):
    kw = RUNS[run]
    args = tf.TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        max_steps=10,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps",
        save_steps=5,
        seed=42,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        **kw,
    )
    model = tf.GPT2LMHeadModel.from_pretrained(initial)
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Rows(rows),
        data_collator=tf.default_data_collator,
    )
    if kw.get("fp16"):
        # What accelerate sets up for fp16 on a GPU (trainer_fp16.py).
        trainer.accelerator.native_amp = True
        trainer.accelerator.scaler = torch.amp.GradScaler(
            "cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL
        )
    return trainer


def write_log(trainer, path):
    history = [{k: finite_or_name(v) for k, v in e.items()} for e in trainer.state.log_history]
    Path(path).write_text(json.dumps(history, indent=1, allow_nan=False))


def resume(out_dir, checkpoint, run):
    ref = ASSETS / "reference" / "trainer_interop"
    rows = json.loads((ref / "blocks.json").read_text())["train"]
    out_dir = Path(out_dir)
    trainer = trainer_for(run, out_dir / "python-run", ref / "initial", rows)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    write_log(trainer, out_dir / "log_history.json")
    shutil.rmtree(out_dir / "python-run", ignore_errors=True)


def main(out):
    clm = sibling("trainer_clm")
    model = clm.small_vocab_model(tf.GPT2LMHeadModel.from_pretrained(ASSETS / "tiny-gpt2"))
    model.save_pretrained(out / "initial")
    rows = clm.small_vocab_rows(clm.blocks()[:N_TRAIN])
    (out / "blocks.json").write_text(json.dumps({"train": rows}))
    for run in RUNS:
        tmp = out / f".tmp-{run}"
        trainer = trainer_for(run, tmp, out / "initial", rows)
        trainer.train()
        folder = out / run
        folder.mkdir()
        write_log(trainer, folder / "log_history.json")
        shutil.copytree(tmp / "checkpoint-5", folder / "checkpoint-5")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "resume":
        jobs = sys.argv[2:]
        if not jobs or len(jobs) % 3:
            sys.exit("resume takes OUT_DIR CHECKPOINT RUN triples")
        for i in range(0, len(jobs), 3):
            resume(*jobs[i : i + 3])
    else:
        main(Path(sys.argv[1]))
