"""Reference for trainer/tests/fp16.rs: upstream's Trainer (transformers 5.23, accelerate
1.15) with float16 mixed precision as accelerate runs it on a GPU (float16 autocast and a
`GradScaler`), here on the CPU.

Usage: python trainer_fp16.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

On the CPU accelerate leaves `fp16=True` in fp32 (`native_amp` is off, no scaler). These runs
turn on what it does on a GPU: `accelerator.native_amp = True` (float16 autocast of the
forward, `unscale_` before clipping) and `accelerator.scaler = torch.amp.GradScaler("cpu",
init_scale=2**20, growth_interval=4)`, set before `train()` prepares the optimizer. The start
scale overflows float16 gradients, so the first steps are skipped while it backs off, and it
grows every 4 clean steps.

Data and starting model are trainer_mixed.py's (tiny GPT-2, dropouts 0, hamlet.txt in blocks
of 64, 90 train / 14 eval blocks), cut to trainer_clm.py's SMALL_VOCAB tokens (float16 GEMMs
are slow on a CPU; the ids are mapped with id % SMALL_VOCAB), saved here as gpt2_initial/ and
gpt2_blocks.json. Every run: seed 42, per-device batch 4,
gradient_accumulation_steps 2, max_steps 12, learning_rate 1e-3, cosine schedule,
warmup_steps 3, weight_decay 0.01, max_grad_norm 1.0, logging_steps 1, evaluation every 6
steps, save_strategy no.

Runs (each writes log_history.json, non-finite numbers as the strings "nan" / "inf", and
train_output.json with the scaler's final state_dict):
  gpt2_fp16/        optim adamw_torch: a skipped step also holds the LR scheduler back
                    (accelerate's `optimizer_step_was_skipped`).
  gpt2_fp16_fused/  optim adamw_torch_fused (the default): torch hands the fused kernel the
                    inf check and calls its step anyway, so accelerate counts the step as
                    taken and the scheduler moves on although the weights did not.
"""

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import torch

import transformers as tf

OUT = Path(sys.argv[1])
HERE = Path(__file__).resolve().parent
torch.set_num_threads(2)
INIT_SCALE = 2.0**20
GROWTH_INTERVAL = 4


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MIXED = sibling("trainer_mixed")


def finite_or_name(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def run(name, train_rows, eval_rows, optim):
    model = tf.GPT2LMHeadModel.from_pretrained(OUT / "gpt2_initial")
    args = MIXED.training_args(name, fp16=True, optim=optim)
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=MIXED.Rows(train_rows),
        eval_dataset=MIXED.Rows(eval_rows),
        data_collator=tf.default_data_collator,
    )
    # What accelerate sets up for fp16 on a GPU.
    trainer.accelerator.native_amp = True
    trainer.accelerator.scaler = torch.amp.GradScaler(
        "cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL
    )
    result = trainer.train()
    folder = OUT / name
    folder.mkdir()
    history = [{k: finite_or_name(v) for k, v in e.items()} for e in trainer.state.log_history]
    (folder / "log_history.json").write_text(json.dumps(history, indent=1, allow_nan=False))
    (folder / "train_output.json").write_text(
        json.dumps(
            {
                "global_step": result.global_step,
                "training_loss": result.training_loss,
                "scaler": trainer.accelerator.scaler.state_dict(),
            },
            indent=1,
        )
    )
    shutil.rmtree(args.output_dir, ignore_errors=True)


def main():
    # trainer_mixed.py's start, already cut to SMALL_VOCAB tokens.
    train, evaluation = MIXED.gpt2_setup()
    (OUT / "gpt2_blocks.json").write_text(json.dumps({"train": train, "eval": evaluation}))
    run("gpt2_fp16", train, evaluation, "adamw_torch")
    run("gpt2_fp16_fused", train, evaluation, "adamw_torch_fused")


if __name__ == "__main__":
    main()
