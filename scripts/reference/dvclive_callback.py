"""Reference for callbacks/tests/it/dvclive.rs: what upstream's DVCLiveCallback writes through
dvclive 3.49 (`Live()` in a working directory outside any DVC repository).

Drives transformers' DVCLiveCallback (on_train_begin, on_log for a sequence of Trainer-like
logs, on_train_end) twice in one fresh working directory, as two Trainers would: the second
run replaces the first's files (`Live()` removes them) and rewrites its own `dvc.yaml`. The
logs hold a NaN and an infinity (written as the strings dvclive makes of them), a string
value, and a list (dropped with upstream's warning).

Writes OUT_DIR/dvclive_callback.json: {"args": the TrainingArguments keyword arguments (the
Rust test builds the same), "runs": [[[global_step, logs], ...], ...], "files": {path relative
to the working directory: text} after the second run, and "params": params.yaml as
dvclive's own `load_yaml` reads it}.

Usage: python dvclive_callback.py OUT_DIR
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
WORK = Path(tempfile.mkdtemp(prefix="tchtrain-dvclive-reference-"))
os.chdir(WORK)
for name in ("DVC_ROOT", "DVC_EXP_BASELINE_REV", "DVC_STUDIO_TOKEN", "STUDIO_TOKEN", "DVCLIVE_RESUME",
             "HF_DVCLIVE_LOG_MODEL"):
    os.environ.pop(name, None)

from dvclive.serialize import load_yaml  # noqa: E402
from transformers import TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.integrations import DVCLiveCallback  # noqa: E402

ARGS = dict(
    output_dir="dvclive_out",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    seed=7,
    run_name="dvc: run #1",
    report_to=["dvclive"],
    use_cpu=True,
)

LOGS = [
    [5, {"loss": 2.5, "grad_norm": 0.123456789, "learning_rate": 0.0003, "epoch": 0.25}],
    [10, {"loss": 2.25, "grad_norm": float("nan"), "learning_rate": 0.00015, "epoch": 0.5,
          "num_input_tokens_seen": 1280}],
    [10, {"eval_loss": 2.0, "eval_accuracy": 0.75, "eval_runtime": 0.5, "eval_samples_per_second": 64.0,
          "eval_steps_per_second": 8.0, "eval_per_class": [0.5, 1.0], "eval_note": "ok\tfine", "epoch": 0.5}],
    [15, {"loss": 1.5, "grad_norm": float("inf"), "learning_rate": 1e-4, "epoch": 0.75}],
    [20, {"train_runtime": 12.5, "train_samples_per_second": 6.4, "train_steps_per_second": 1.6,
          "total_flos": 12345678.0, "train_loss": 2.3, "epoch": 1.0}],
]
RUNS = [LOGS[:3], LOGS]

args = TrainingArguments(**ARGS)
for logs_of_run in RUNS:
    callback = DVCLiveCallback()
    state = TrainerState()
    control = TrainerControl()
    callback.on_train_begin(args, state, control)
    for step, logs in logs_of_run:
        state.global_step = step
        callback.on_log(args, state, control, logs=dict(logs))
    callback.on_train_end(args, state, control)

files = {
    p.relative_to(WORK).as_posix(): p.read_text(encoding="utf-8")
    for p in sorted(WORK.rglob("*"))
    if p.is_file() and p.relative_to(WORK).parts[0] in ("dvclive", "dvc.yaml")
}
out = {
    "args": ARGS,
    "runs": RUNS,
    "files": files,
    "params": load_yaml(WORK / "dvclive" / "params.yaml"),
}
(OUT / "dvclive_callback.json").write_text(json.dumps(out, indent=1))
os.chdir(OUT)
shutil.rmtree(WORK, ignore_errors=True)
print("files:", ", ".join(files))
