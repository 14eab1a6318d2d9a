"""Reference for callbacks/tests/it/comet.rs: what upstream's CometCallback writes through
comet_ml 3.58 in Comet's offline mode (`COMET_START_ONLINE=false`: an archive
`<experiment key>[-<suffix>].zip` in the offline directory, which `comet upload` sends).

Each case runs in its own Python process (comet_ml.start() returns a running experiment
where one exists, and the archive is written when the process exits, as after a Trainer
run): transformers' CometCallback driven through on_train_begin (a model with a config),
on_log for a sequence of Trainer-like logs (a NaN, an infinity, a string, a list of one
number, a list of two, a None), on_train_end and on_predict. The archive is read with
_comet_read.py (comet_ml's own schemas, message classes and `comet offline --csv`).

Writes OUT_DIR/comet_callback.json: {"cases": [...]}, each case with
  name, env      the COMET_* environment variables set (the offline directory aside);
  args           the TrainingArguments keyword arguments (the Rust test builds the same);
  model_config   model.config.to_dict();
  logs           [[global_step, epoch, logs], ...] passed to on_log; predict the metrics
                 passed to on_predict (after on_train_end);
  read           the archive as _comet_read.py reads it.

Usage: python comet_callback.py OUT_DIR
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

ARGS = dict(
    output_dir="comet_out",
    run_name="comet: run #1",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    seed=7,
    lr_scheduler_kwargs={"power": 2.0, "lr_end": 1e-7},
    report_to=["comet_ml"],
    use_cpu=True,
)

LOGS = [
    [5, 0.25, {"loss": 2.5, "grad_norm": float("nan"), "learning_rate": 0.0003, "epoch": 0.25}],
    [10, 0.5, {"loss": 2.25, "grad_norm": float("inf"), "learning_rate": 0.00015, "epoch": 0.5,
               "num_input_tokens_seen": 1280}],
    [10, 0.5, {"eval_loss": 2.0, "eval_accuracy": 0.75, "eval_runtime": 0.5, "eval_samples_per_second": 64.0,
               "eval_steps_per_second": 8.0, "eval_per_class": [0.5, 1.0], "eval_one": [0.125],
               "eval_note": "ok\tfine", "eval_none": None, "epoch": 0.5}],
    [20, 1.0, {"train_runtime": 12.5, "train_samples_per_second": 6.4, "train_steps_per_second": 1.6,
               "total_flos": 12345678.0, "train_loss": 2.3, "epoch": 1.0}],
]
PREDICT = {"test_loss": 1.75, "test_runtime": 0.25, "test_samples_per_second": 32.0}

CASES = [
    {"name": "create_in_a_project", "env": {"COMET_MODE": "create", "COMET_PROJECT_NAME": "tchtrain-reference",
                                            "COMET_WORKSPACE": "team"}, "args": ARGS},
    {"name": "defaults_no_run_name", "env": {}, "args": {k: v for k, v in ARGS.items() if k != "run_name"}},
]


def sibling(stem):
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case, offline_dir):
    """In this process: the callback's events; the archive is written at exit."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import CometCallback

    model_module = sibling("_logger_model")
    args = TrainingArguments(**case["args"])
    model = model_module.Model(model_module.model_config(), 123456)
    callback = CometCallback()
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    for step, epoch, logs in LOGS:
        state.global_step, state.epoch = step, epoch
        callback.on_log(args, state, control, model=model, logs=dict(logs))
    callback.on_train_end(args, state, control, model=model)
    callback.on_predict(args, state, control, metrics=dict(PREDICT))


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMET_")}
    env["COMET_START_ONLINE"] = "false"
    return env


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--case":
    run_case(next(c for c in CASES if c["name"] == sys.argv[2]), sys.argv[3])
elif __name__ == "__main__":
    OUT = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    TMP = Path(tempfile.mkdtemp(prefix="tchtrain-comet-reference-"))
    reader = sibling("_comet_read")
    results = []
    for case in CASES:
        work = TMP / case["name"]
        work.mkdir()
        env = {**clean_env(), **case["env"]}
        if case["name"] != "defaults_no_run_name":
            env["COMET_OFFLINE_DIRECTORY"] = str(work / "archives")
        subprocess.run([sys.executable, __file__, "--case", case["name"], str(work)], cwd=work, env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        archive_dir = work / "archives" if "COMET_OFFLINE_DIRECTORY" in env else work / ".cometml-runs"
        (archive,) = archive_dir.glob("*.zip")
        from transformers import TrainingArguments  # noqa: F401  (the model config below)
        model_config = sibling("_logger_model").model_config().to_dict()
        results.append({"name": case["name"], "env": case["env"], "args": case["args"], "model_config": model_config,
                        "logs": LOGS, "predict": PREDICT, "read": reader.read(str(archive))})
    (OUT / "comet_callback.json").write_text(json.dumps({"cases": results}, indent=1, sort_keys=True))
    shutil.rmtree(TMP, ignore_errors=True)
