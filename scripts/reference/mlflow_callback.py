"""Reference for callbacks/tests/it/mlflow.rs: what upstream's MLflowCallback logs.

Drives transformers' MLflowCallback (on_train_begin with a model that has a config, on_log for a
sequence of Trainer-like logs, on_train_end) against a local MLflow store, one case per set of
environment variables, and reads back what the run holds.

Writes into OUT_DIR:
  mlflow_callback.json  {"cases": [...]}, each case with:
      name, env          the MLflow environment variables the callback read;
      args               the TrainingArguments keyword arguments (the Rust test builds the same);
      model_config       model.config.to_dict() (JSON: id2label's int keys become strings), or null;
      logs               [[global_step, logs], ...] passed to on_log;
      params             the run's params (name -> string value);
      metrics            name -> [[step, value], ...] (metric histories, by step);
      tags               the run's tags, without those that depend on the machine or script
                         (mlflow.user, mlflow.source.*);
      run_name, status   the run's name and final status;
      warnings           the warnings the callback logged, in order.

Usage: python mlflow_callback.py OUT_DIR
"""

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
TMP = Path(tempfile.mkdtemp(prefix="tchtrain-mlflow-reference-"))
# A SQL store in a file: MLflow's own server keeps runs in the same store (the Rust test starts
# one on a sqlite file), so values go through the same conversions on both sides.
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{TMP}/mlflow.db"
for name in list(os.environ):
    if name.startswith("MLFLOW_") and name != "MLFLOW_TRACKING_URI" or name == "HF_MLFLOW_LOG_ARTIFACTS":
        del os.environ[name]

import mlflow  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2Config, TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.integrations import MLflowCallback  # noqa: E402

# The default verbosity: `disable_tqdm` defaults to whether the log level is above WARNING.
transformers.logging.set_verbosity_warning()
logging.getLogger("mlflow").setLevel(logging.ERROR)
logging.getLogger("alembic").setLevel(logging.ERROR)


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


capture = Capture()
logging.getLogger("transformers.integrations.integration_utils").addHandler(capture)

ARGS = dict(
    output_dir="mlflow_out",
    run_name="reference-run",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr": 1e-06},
    label_names=["labels"],
    seed=7,
    report_to=["mlflow"],
    use_cpu=True,
)


class Model:
    """What the callback reads of a model: its `config`."""

    def __init__(self, config):
        self.config = config


def model_config():
    return GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        vocab_size=1000,
        num_labels=3,
        task_specific_params={"text-generation": {"do_sample": True, "max_length": 50}},
        long_note="y" * 6001,
    )


LOGS = [
    [5, {"loss": 2.5, "grad_norm": 0.123456789, "learning_rate": 0.0003, "epoch": 0.25}],
    [10, {"loss": 2.25, "grad_norm": 1.5, "learning_rate": 0.00015, "epoch": 0.5, "num_input_tokens_seen": 1280}],
    [
        10,
        {
            "eval_loss": 2.0,
            "eval_accuracy(top1)": 0.75,
            "eval_runtime": 0.5,
            "eval_samples_per_second": 64.0,
            "eval_steps_per_second": 8.0,
            "epoch": 0.5,
        },
    ],
    [
        20,
        {
            "train_runtime": 12.5,
            "train_samples_per_second": 6.4,
            "train_steps_per_second": 1.6,
            "total_flos": 12345678.0,
            "train_loss": 2.3,
            "epoch": 1.0,
            "note": "done",
            "flag": True,
            "not_a_number": float("nan"),
            "big": 10**12,
            "items": [1, 2],
            "none": None,
            "\u03bb": 1e-05,
        },
    ],
]

CASES = [
    {
        "name": "experiment_tags_and_model_config",
        "env": {
            "MLFLOW_EXPERIMENT_NAME": "tchtrain-reference",
            "MLFLOW_TAGS": json.dumps({"release.candidate": "RC1", "priority": 2, "flags": [1, "a"], "ok": True}),
        },
        "args": ARGS,
        "model": True,
    },
    {
        "name": "flatten_params",
        "env": {"MLFLOW_FLATTEN_PARAMS": "1"},
        "args": {k: v for k, v in ARGS.items() if k != "run_name"},
        "model": True,
    },
    {
        "name": "max_log_params_without_model",
        "env": {"MLFLOW_MAX_LOG_PARAMS": "7", "MLFLOW_EXPERIMENT_NAME": "tchtrain-reference"},
        "args": ARGS,
        "model": False,
    },
]

HIDDEN_TAGS = ("mlflow.user", "mlflow.source.")

results = []
for case in CASES:
    for name, value in case["env"].items():
        os.environ[name] = value
    capture.messages.clear()
    args = TrainingArguments(**case["args"])
    config = model_config() if case["model"] else None
    model = Model(config) if config is not None else None
    callback = MLflowCallback()
    state = TrainerState()
    control = TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    run_id = mlflow.active_run().info.run_id
    for step, logs in LOGS:
        state.global_step = step
        callback.on_log(args, state, control, dict(logs), model=model)
    callback.on_train_end(args, state, control)
    assert mlflow.active_run() is None
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    metrics = {
        key: [[m.step, m.value] for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
        for key in run.data.metrics
    }
    results.append(
        {
            "name": case["name"],
            "env": case["env"],
            "args": case["args"],
            "model_config": config.to_dict() if config is not None else None,
            "logs": LOGS,
            "params": run.data.params,
            "metrics": metrics,
            "tags": {k: v for k, v in run.data.tags.items() if not k.startswith(HIDDEN_TAGS)},
            "run_name": run.info.run_name,
            "status": run.info.status,
            "warnings": list(capture.messages),
        }
    )
    for name in case["env"]:
        del os.environ[name]

(OUT / "mlflow_callback.json").write_text(json.dumps({"mlflow_version": mlflow.__version__, "cases": results}, indent=1) + "\n")
shutil.rmtree(TMP, ignore_errors=True)
