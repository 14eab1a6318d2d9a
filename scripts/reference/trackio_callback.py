"""Reference for callbacks/tests/it/trackio.rs: what upstream's TrackioCallback writes into
trackio's local store (trackio 0.43: the project's SQLite database under TRACKIO_DIR).

Drives transformers' TrackioCallback (on_train_begin with a model that has a config and a
parameter count, on_log for a sequence of Trainer-like logs, on_predict, on_train_end) in
sessions, each a new callback as a new Trainer would make:
  named    project "tchtrain-reference", run_name "reference-run": a session with every log
           and the prediction, then a second that resumes the run (trackio's
           resume="allow") and logs once more;
  unnamed  the default project, no run_name: two sessions, so trackio names two runs.
Then reads each project back with trackio's own API (_trackio_read.py).

Writes OUT_DIR/trackio_callback.json: {"cases": [...]}, each case with
  name, args     the TrainingArguments keyword arguments (the Rust test builds the same);
  sessions       per session, [[global_step, logs], ...] passed to on_log, and the predict
                 metrics (or null);
  model_config, num_parameters;
  read           what _trackio_read.read(project) finds.

Usage: python trackio_callback.py OUT_DIR
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
TMP = Path(tempfile.mkdtemp(prefix="tchtrain-trackio-reference-"))
os.environ["TRACKIO_DIR"] = str(TMP / "store")
# No Hub: trackio asks it for the user name; offline it gets none.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HF_TOKEN", None)


def sibling(stem):
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reader = sibling("_trackio_read")

import transformers  # noqa: E402
from transformers import TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.integrations import TrackioCallback  # noqa: E402

transformers.logging.set_verbosity_warning()

ARGS = dict(
    output_dir="trackio_out",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    seed=7,
    report_to=["trackio"],
    use_cpu=True,
)


_model = sibling("_logger_model")
Model, model_config = _model.Model, _model.model_config


LOGS = [
    [5, {"loss": 2.5, "grad_norm": 0.123456789, "learning_rate": 0.0003, "epoch": 0.25}],
    [10, {"loss": 2.25, "grad_norm": float("nan"), "learning_rate": 0.00015, "epoch": 0.5,
          "num_input_tokens_seen": 1280}],
    [10, {"eval_loss": 2.0, "eval_accuracy": 0.75, "eval_runtime": 0.5, "eval_samples_per_second": 64.0,
          "eval_steps_per_second": 8.0, "epoch": 0.5}],
    [20, {"train_runtime": 12.5, "train_samples_per_second": 6.4, "train_steps_per_second": 1.6,
          "total_flos": 12345678.0, "train_loss": 2.3, "epoch": 1.0}],
]
PREDICT = {"test_loss": 1.75, "test_runtime": 0.25, "test_samples_per_second": 32.0}
RESUMED = [[25, {"loss": 1.5, "grad_norm": float("inf"), "learning_rate": 1e-4, "epoch": 1.25}]]

CASES = [
    {
        "name": "named",
        "args": {**ARGS, "run_name": "reference-run", "project": "tchtrain-reference"},
        "sessions": [{"logs": LOGS, "predict": PREDICT}, {"logs": RESUMED, "predict": None}],
    },
    {
        "name": "unnamed",
        "args": ARGS,
        "sessions": [{"logs": LOGS[:2], "predict": None}, {"logs": LOGS[2:3], "predict": None}],
    },
]




results = []
for case in CASES:
    args = TrainingArguments(**case["args"])
    config = model_config()
    for session in case["sessions"]:
        model = Model(config, 123456)
        callback = TrackioCallback()
        state = TrainerState()
        control = TrainerControl()
        callback.on_train_begin(args, state, control, model=model)
        for step, logs in session["logs"]:
            state.global_step = step
            callback.on_log(args, state, control, model=model, logs=dict(logs))
        if session["predict"] is not None:
            callback.on_predict(args, state, control, metrics=dict(session["predict"]))
        callback.on_train_end(args, state, control, model=model)
    results.append({
        "name": case["name"], "args": case["args"], "sessions": case["sessions"],
        "model_config": config.to_dict(), "num_parameters": 123456,
        "read": reader.read(args.project),
    })

(OUT / "trackio_callback.json").write_text(json.dumps({"cases": results}, indent=1, sort_keys=True))
shutil.rmtree(TMP, ignore_errors=True)
print("trackio_callback:", len(results), "cases")
