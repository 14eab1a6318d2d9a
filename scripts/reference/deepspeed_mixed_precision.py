"""Reference for trainer/tests/it/deepspeed_half.rs: upstream's Trainer (transformers 5.23 +
accelerate 1.15) under DeepSpeed 0.19.8's own engine, on 2 CPU ranks (gloo, launched here with
`torch.distributed.run`), in DeepSpeed's bf16 and fp16 regimes.

Usage: python deepspeed_mixed_precision.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

The job (every case): trainer_clm.py's tiny GPT-2 (dropouts 0; OUT_DIR/initial/) on its first 32
train and 12 eval blocks of 64 tokens (OUT_DIR/blocks.json); the fp16 case cuts the model to
trainer_clm.py's SMALL_VOCAB tokens and maps the ids into them (OUT_DIR/small_vocab/initial/,
blocks.json), as float16 GEMMs are slow on a CPU (the bf16 cases keep the full vocabulary, on
which ZeRO-2 matches DeepSpeed to the bit); row j's last (j * 13) % 40 labels are -100 (the Rust
tests' `blocks`);
per_device_train_batch_size 2 on each rank, gradient_accumulation_steps 1, 8 steps, lr 1e-3,
linear schedule with warmup_steps 2, weight_decay 0.01, max_grad_norm 1.0, evaluation every
4 steps, seed 42, use_cpu, `--deepspeed` a dict config with "auto" sizes.

Cases (OUT_DIR/<case>/log_history.json, from rank 0):
  zero2_bf16/  `"bf16": {"enabled": "auto"}`, ZeRO-2, --bf16.
  zero3_bf16/  the same at ZeRO-3.
  zero2_fp16/  `"fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 17,
               "loss_scale_window": 2, "hysteresis": 2, "min_loss_scale": 1}`, ZeRO-2, --fp16:
               the first steps overflow and are skipped, the scale then rises every 2 stable
               steps. DeepSpeed's engine refuses fp16 on a CPU without mkldnn fp16 kernels
               (`is_fp16_supported`); that check alone is patched to pass, everything else
               is DeepSpeed's own fp16 path (the model cast to half, fp32 masters, its
               DynamicLossScaler, the overflow check and skipped steps).
  zero2_bf16_comm_fp32/  zero2_bf16 with `"communication_data_type": "fp32"`: the bf16 gradients
               are reduced in float32 (DeepSpeed's IPG bucket of that dtype).
Each case also writes loss_scales.json: DeepSpeed's loss scale after every optimizer step.

All cases run in one launch (each rank runs them one after another): a launch's process starts
and imports of torch, transformers and DeepSpeed cost more than a case's training. Between cases
the ranks drop the Trainer and reset accelerate's shared state (the process group stays); ZeRO-3
runs last, as a live ZeRO-3 config makes `from_pretrained` partition the next model. The numbers
are those of one launch per case, bit for bit (checked by regenerating both ways).

DeepSpeed's TorchBackend would JIT-build its shared-memory all-reduce op (`deepspeed_shm_comm`,
~1.5 min of ninja on 2 cores) on the first run; only `inference_all_reduce` uses it (training
reduces through torch.distributed), so the ranks skip the build (`build_shm_op` returns None,
as it does where the op is not compatible). Any other op would build into TORCH_EXTENSIONS_DIR
(the per-user cache beside the assets).
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

CASES = {
    "zero2_bf16": ({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}, "bf16"),
    "zero2_fp16": ({"fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 17, "loss_scale_window": 2,
                             "hysteresis": 2, "min_loss_scale": 1},
                    "zero_optimization": {"stage": 2}}, "fp16"),
    "zero2_bf16_comm_fp32": ({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2},
                              "communication_data_type": "fp32"}, "bf16"),
    # Last: see the module's docstring.
    "zero3_bf16": ({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3,
                    "stage3_gather_16bit_weights_on_model_save": True}}, "bf16"),
}
AUTO = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto", "gradient_clipping": "auto"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, Path(__file__).resolve().parent / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launch(out):
    import transformers as tf

    clm = sibling("trainer_clm")
    model = tf.GPT2LMHeadModel.from_pretrained(
        clm.ASSETS / "tiny-gpt2", attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, summary_first_dropout=0.0
    )
    model.save_pretrained(out / "initial")
    all_blocks = clm.blocks()
    (out / "blocks.json").write_text(json.dumps({"train": all_blocks[:32], "eval": all_blocks[90:102]}))
    small = out / "small_vocab"
    clm.small_vocab_model(model).save_pretrained(small / "initial")
    small_blocks = clm.small_vocab_rows(all_blocks)
    (small / "blocks.json").write_text(json.dumps({"train": small_blocks[:32], "eval": small_blocks[90:102]}))
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # ninja
    assets = Path(env["TCHTRAIN_ASSETS"]).resolve()
    env.setdefault("TORCH_EXTENSIONS_DIR", str(assets.parent / "torch_extensions"))
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), __file__, str(out), ",".join(CASES)]
    subprocess.run(cmd, env=env, check=True)


def rank_main(out, cases):
    import gc
    import logging

    from accelerate.state import AcceleratorState, GradientState
    from deepspeed.accelerator import get_accelerator

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    # The module itself: `deepspeed.comm.torch` as an attribute is the torch library that
    # deepspeed.comm re-exports.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    accelerator = type(get_accelerator())
    fp16_supported = accelerator.is_fp16_supported
    for case in cases:
        if CASES[case][1] == "fp16":
            accelerator.is_fp16_supported = lambda self: True
        try:
            run_case(out, case)
        finally:
            accelerator.is_fp16_supported = fp16_supported
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        gc.collect()
        print(f"{case}: done", flush=True)


def run_case(out, case):
    import torch
    from torch.utils.data import Dataset

    import transformers as tf

    config, precision = CASES[case]
    config = {**AUTO, **config}
    job = out / "small_vocab" if precision == "fp16" else out
    blocks = json.loads((job / "blocks.json").read_text())

    class Rows(Dataset):
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, j):
            ids = self.rows[j]
            labels = list(ids)
            ignored = (j * 13) % 40
            for k in range(len(labels) - ignored, len(labels)):
                labels[k] = -100
            return {"input_ids": ids, "labels": labels}

    model = tf.GPT2LMHeadModel.from_pretrained(job / "initial")
    folder = out / case
    args = tf.TrainingArguments(
        output_dir=str(folder / ".tmp"),
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        gradient_accumulation_steps=1,
        max_steps=8,
        learning_rate=1e-3,
        warmup_steps=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=4,
        save_strategy="no",
        seed=42,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        deepspeed=config,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
    )
    trainer = tf.Trainer(model=model, args=args, train_dataset=Rows(blocks["train"]),
                         eval_dataset=Rows(blocks["eval"]), data_collator=tf.default_data_collator)
    scales = []

    class Scales(tf.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            scales.append(float(trainer.model_wrapped.optimizer.loss_scale))

    trainer.add_callback(Scales())
    trainer.train()
    if torch.distributed.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        (folder / "loss_scales.json").write_text(json.dumps(scales))
        first = next(p for p in trainer.model_wrapped.module.parameters())
        (folder / "model_dtype.json").write_text(json.dumps(str(first.dtype)))


if __name__ == "__main__":
    if len(sys.argv) == 3:
        rank_main(Path(sys.argv[1]), sys.argv[2].split(","))
    else:
        launch(Path(sys.argv[1]))
