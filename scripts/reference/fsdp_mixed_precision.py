"""Reference for trainer/tests/it/fsdp_half.rs: upstream's Trainer (transformers 5.23 +
accelerate 1.15) under torch 2.13's FSDP2 (`fully_shard` with accelerate's
`MixedPrecisionPolicy`), on 2 CPU ranks (gloo, launched here with `torch.distributed.run`).

Usage: python fsdp_mixed_precision.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

The job (every case) is deepspeed_mixed_precision.py's: trainer_clm.py's tiny GPT-2 (dropouts 0)
cut to its SMALL_VOCAB tokens (OUT_DIR/initial/), on its first 32 train and 12 eval blocks of 64
tokens with the ids mapped into them (OUT_DIR/blocks.json), row j's last
(j * 13) % 40 labels -100; per_device_train_batch_size 2 on each rank, 8 steps, lr 1e-3,
linear schedule with warmup_steps 2, weight_decay 0.01, max_grad_norm 1.0, evaluation every
4 steps, seed 42, use_cpu; `fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]}`.

Cases (OUT_DIR/<case>/log_history.json, from rank 0):
  full_shard_bf16/     --fsdp "full_shard auto_wrap" --bf16: accelerate's
                       `set_mixed_precision("bf16")` gives FSDP2
                       `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16,
                       output_dtype=bf16)`, and the forward also runs under bf16 autocast
                       (accelerate's `native_amp` on the CPU).
  shard_grad_op_bf16/  the same with "shard_grad_op" (reshard_after_forward False).
  full_shard_fp16/     --fp16: the policy in float16; on the CPU accelerate has no autocast
                       and no gradient scaler for fp16 (`native_amp` is off there), so the
                       float16 parameters compute without either.
  full_shard_fp16_scaler/  --fp16 as accelerate runs it on a GPU: `native_amp` on (float16
                       autocast) and `get_fsdp2_grad_scaler`'s GradScaler (init_scale 2**20,
                       growth_interval 2), set before `train()`: the scaler unscales the
                       DTensor gradients, DTensor's handler reduces its inf flag with MAX
                       over the ranks, and the first steps overflow and are skipped.
                       loss_scales.json holds the scale after every optimizer step.
accelerate turns FSDP on only for accelerator devices (on the CPU its Trainer silently runs
DDP); `fsdp_on_the_cpu` applies its GPU branch to the CPU run, so each case is the FSDP2 run a
GPU user gets, computed on CPU gloo.
Each case also writes loss_dtype.json: the dtype of the loss the Trainer's training_step
returned (FSDP2 casts the root module's outputs to `output_dtype`).

All cases run in one launch (each rank runs them one after another): a launch's process starts
and imports cost more than a case's training. Between cases the ranks drop the Trainer and reset
accelerate's shared state (the process group stays). The numbers are those of one launch per
case, bit for bit (checked by regenerating both ways).
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

CASES = {
    "full_shard_bf16": ("full_shard auto_wrap", "bf16"),
    "shard_grad_op_bf16": ("shard_grad_op auto_wrap", "bf16"),
    "full_shard_fp16": ("full_shard auto_wrap", "fp16"),
    "full_shard_fp16_scaler": ("full_shard auto_wrap", "fp16"),
}
# full_shard_fp16_scaler's GradScaler (what accelerate builds for FSDP2 on a GPU:
# `get_fsdp2_grad_scaler`, a plain torch.amp.GradScaler).
INIT_SCALE = 2.0**20
GROWTH_INTERVAL = 2


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
    clm.small_vocab_model(model).save_pretrained(out / "initial")
    all_blocks = clm.small_vocab_rows(clm.blocks())
    (out / "blocks.json").write_text(json.dumps({"train": all_blocks[:32], "eval": all_blocks[90:102]}))
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    only = os.environ.get("FSDP_REFERENCE_CASES")
    cases = [case for case in CASES if not only or case in only.split(",")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), __file__, str(out), ",".join(cases)]
    subprocess.run(cmd, env=env, check=True)


def fsdp_on_the_cpu():
    """accelerate enables FSDP only for accelerator devices: on the CPU (`MULTI_CPU`) its
    `AcceleratorState` drops the plugin and the Trainer runs DDP. This applies what
    `AcceleratorState.__init__` does for a GPU run (state.py: `distributed_type = FSDP`,
    `fsdp_plugin.set_mixed_precision(mixed_precision)`, `self.fsdp_plugin = fsdp_plugin`) to
    the CPU run, so that the rest is upstream's own FSDP2 path on gloo."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def patched(self, *args, fsdp_plugin=None, **kwargs):
        fresh = not self._shared_state
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fresh and fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

    AcceleratorState.__init__ = patched


def rank_main(out, cases):
    import gc

    from accelerate.state import AcceleratorState, GradientState

    fsdp_on_the_cpu()
    for case in cases:
        run_case(out, case)
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        gc.collect()
        print(f"{case}: done", flush=True)


def run_case(out, case):
    import torch
    from torch.utils.data import Dataset

    import transformers as tf

    fsdp, precision = CASES[case]
    blocks = json.loads((out / "blocks.json").read_text())

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

    model = tf.GPT2LMHeadModel.from_pretrained(out / "initial")
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
        fsdp=fsdp,
        fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]},
        bf16=precision == "bf16",
        fp16=precision == "fp16",
    )
    trainer = tf.Trainer(model=model, args=args, train_dataset=Rows(blocks["train"]),
                         eval_dataset=Rows(blocks["eval"]), data_collator=tf.default_data_collator)
    if case.endswith("_scaler"):
        trainer.accelerator.native_amp = True
        trainer.accelerator.scaler = torch.amp.GradScaler(
            "cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL
        )
    scales = []

    class Scales(tf.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if trainer.accelerator.scaler is not None:
                scales.append(float(trainer.accelerator.scaler.get_scale()))

    trainer.add_callback(Scales())
    losses = []
    step = trainer.training_step

    def training_step(*a, **k):
        loss = step(*a, **k)
        losses.append(str(loss.dtype))
        return loss

    trainer.training_step = training_step
    trainer.train()
    if torch.distributed.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        (folder / "loss_dtype.json").write_text(json.dumps(sorted(set(losses))))
        if scales:
            (folder / "loss_scales.json").write_text(json.dumps(scales))


if __name__ == "__main__":
    if len(sys.argv) == 3:
        rank_main(Path(sys.argv[1]), sys.argv[2].split(","))
    else:
        launch(Path(sys.argv[1]))
