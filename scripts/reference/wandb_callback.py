"""Reference for callbacks/tests/it/wandb.rs: what upstream's WandbCallback writes in W&B's
offline mode (`WANDB_MODE=offline`: a run folder `wandb/offline-run-<time>-<id>/` whose
`run-<id>.wandb` transaction log `wandb sync` uploads later).

Drives transformers' WandbCallback (on_train_begin with a model that has a config and a
parameter count, on_log for a sequence of Trainer-like logs, on_predict, on_train_end, then
`wandb.finish()` as the interpreter's exit does) with wandb 0.31, one case per set of
environment variables, and folds each run's log with _wandb_records.py.

Writes OUT_DIR/wandb_callback.json: {"cases": [...]}, each case with
  name, env        the W&B environment variables set;
  args             the TrainingArguments keyword arguments (the Rust test builds the same);
  model_config     model.config.to_dict(), num_parameters the model's count;
  logs             [[global_step, logs], ...] passed to on_log; predict the metrics passed to
                   on_predict;
  run              the folded run (_wandb_records.fold): run fields, config, summary, metric
                   definitions, history rows, exit record.

Usage: python wandb_callback.py OUT_DIR
"""

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
HERE = Path(__file__).resolve().parent
TMP = Path(tempfile.mkdtemp(prefix="tchtrain-wandb-reference-"))
for name in list(os.environ):
    if name.startswith("WANDB_"):
        del os.environ[name]
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"


def sibling(stem):
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


records = sibling("_wandb_records")

import transformers  # noqa: E402
import wandb  # noqa: E402
from transformers import TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.integrations import WandbCallback  # noqa: E402

transformers.logging.set_verbosity_warning()

ARGS = dict(
    output_dir="wandb_out",
    run_name="reference-run",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    seed=7,
    report_to=["wandb"],
    use_cpu=True,
)


_model = sibling("_logger_model")
Model, model_config = _model.Model, _model.model_config


LOGS = [
    [5, {"loss": 2.5, "grad_norm": 0.123456789, "learning_rate": 0.0003, "epoch": 0.25}],
    [10, {"loss": 2.25, "grad_norm": 1.5, "learning_rate": 0.00015, "epoch": 0.5, "num_input_tokens_seen": 1280}],
    [10, {"eval_loss": 2.0, "eval_accuracy": 0.75, "eval_runtime": 0.5, "eval_samples_per_second": 64.0,
          "eval_steps_per_second": 8.0, "epoch": 0.5}],
    [20, {"train_runtime": 12.5, "train_samples_per_second": 6.4, "train_steps_per_second": 1.6,
          "total_flos": 12345678.0, "train_loss": 2.3, "epoch": 1.0}],
]
PREDICT = {"test_loss": 1.75, "test_runtime": 0.25, "test_samples_per_second": 32.0}

CASES = [
    {"name": "project_and_run_name", "env": {"WANDB_PROJECT": "tchtrain-reference"}, "args": ARGS},
    {"name": "default_project_no_run_name", "env": {}, "args": {k: v for k, v in ARGS.items() if k != "run_name"}},
]

results = []
for case in CASES:
    for name, v in case["env"].items():
        os.environ[name] = v
    os.environ["WANDB_DIR"] = str(TMP / case["name"])
    (TMP / case["name"]).mkdir()
    args = TrainingArguments(**case["args"])
    config = model_config()
    model = Model(config, 123456)
    callback = WandbCallback()
    state = TrainerState()
    control = TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    run_dir = Path(wandb.run.dir).parent
    for step, logs in LOGS:
        state.global_step = step
        callback.on_log(args, state, control, model=model, logs=dict(logs))
    callback.on_predict(args, state, control, metrics=dict(PREDICT))
    callback.on_train_end(args, state, control, model=model)
    wandb.finish()
    run_file = next(run_dir.glob("run-*.wandb"))
    results.append({
        "name": case["name"], "env": case["env"], "args": case["args"], "model_config": config.to_dict(),
        "num_parameters": 123456, "logs": LOGS, "predict": PREDICT, "run": records.fold(run_file),
        "run_dir_name": run_dir.name.split("-")[0] + "-" + run_dir.name.split("-")[1],
    })
    for name in case["env"]:
        del os.environ[name]

(OUT / "wandb_callback.json").write_text(json.dumps({"cases": results}, indent=1, sort_keys=True))
shutil.rmtree(TMP, ignore_errors=True)
print("wandb_callback:", len(results), "cases")
