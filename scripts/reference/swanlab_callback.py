"""Reference for callbacks/tests/it/swanlab.rs: what upstream's SwanLabCallback writes through
swanlab 0.10 in SwanLab's offline mode (`SWANLAB_MODE=offline`: a run folder
`<log dir>/run-<time>-<id>/` holding the record log `run-<id>.swanlab` that `swanlab sync`
uploads, and files/config.yaml).

Each case runs in its own Python process (swanlab keeps one run per process, finished when
the process exits, as after a Trainer run): transformers' SwanLabCallback driven through
on_train_begin (a model with a config and num_parameters()), on_log for a sequence of
Trainer-like logs (a NaN, an infinity, a bool, numeric and other strings, lists, a None, a
key ending in a dot, repeated steps), on_train_end and on_predict. The run folder is read with
_swanlab_read.py (swanlab's own reader, protobuf records and sync check, PyYAML).

transformers 5.23's callback asks `swanlab.get_run() is None` before `swanlab.init()`; since
swanlab 0.9.2 `get_run()` raises when no run is active instead, so upstream's callback fails at
setup unless the user called swanlab.init() first. The reference gives the callback the
behaviour it was written against (None when no run is active), as swanlab's own transformers
integration and LlamaFactory do; everything else is upstream's code.

Writes OUT_DIR/swanlab_callback.json: {"cases": [...]}, each case with
  name, env      the SWANLAB_* environment variables set;
  args           the TrainingArguments keyword arguments (the Rust test builds the same);
  model_config   model.config.to_dict(); num_parameters what model.num_parameters() returns;
  logs           [[global_step, epoch, logs], ...] passed to on_log (the file keeps their key
                 order, which is the logging order); predict the metrics
                 passed to on_predict (after on_train_end);
  read           the run folder as _swanlab_read.py reads it.

Usage: python swanlab_callback.py OUT_DIR
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
NUM_PARAMETERS = 123456

ARGS = dict(
    output_dir="swanlab_out",
    run_name="swanlab: run #1, with a name long enough that PyYAML folds it over two lines of config.yaml",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    seed=7,
    lr_scheduler_kwargs={"power": 2.0, "lr_end": 1e-7},
    report_to=["swanlab"],
    use_cpu=True,
)

LOGS = [
    [5, 0.25, {"loss": 2.5, "grad_norm": float("nan"), "learning_rate": 0.0003, "epoch": 0.25}],
    [10, 0.5, {"loss": 2.25, "grad_norm": float("inf"), "learning_rate": 0.00015, "epoch": 0.5,
               "num_input_tokens_seen": 1280}],
    [10, 0.5, {"eval_loss": 2.0, "eval_accuracy": 0.75, "eval_runtime": 0.5, "eval_samples_per_second": 64.0,
               "eval_steps_per_second": 8.0, "eval_per_class": [0.5, 1.0], "eval_one": [0.125],
               "eval_note": "ok\tfine", "eval_none": None, "eval_flag": True, "eval_half": " 0.5 ",
               "eval_big": "1_000", "eval_text_inf": "-Infinity", "eval_dot.": 3, "epoch": 0.5}],
    [15, 0.75, {"loss": 0.0, "grad_norm": -0.0, "learning_rate": 5e-05, "epoch": 0.75}],
    [20, 1.0, {"train_runtime": 12.5, "train_samples_per_second": 6.4, "train_steps_per_second": 1.6,
               "total_flos": 12345678.0, "train_loss": 2.3, "epoch": 1.0}],
]
PREDICT = {"test_loss": 1.75, "test_runtime": 0.25, "test_samples_per_second": 32.0}

CASES = [
    {"name": "offline_in_a_project",
     "env": {"SWANLAB_MODE": "offline", "SWANLAB_PROJ_NAME": "tchtrain-reference", "SWANLAB_WORKSPACE": "team",
             "SWANLAB_LOG_DIR": "logs"},
     "args": ARGS},
    {"name": "defaults_no_run_name",
     "env": {"SWANLAB_MODE": "offline"},
     "args": {**{k: v for k, v in ARGS.items() if k != "run_name"}, "resume_from_checkpoint": "swanlab_out/checkpoint-5"}},
]


def sibling(stem):
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case):
    """In this process: the callback's events; the run finishes at exit."""
    import swanlab
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import SwanLabCallback

    get_run = swanlab.get_run

    def get_run_or_none():
        try:
            return get_run()
        except RuntimeError:
            return None

    swanlab.get_run = get_run_or_none
    model_module = sibling("_logger_model")
    args = TrainingArguments(**case["args"])
    model = model_module.Model(model_module.model_config(), NUM_PARAMETERS)
    callback = SwanLabCallback()
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    for step, epoch, logs in LOGS:
        state.global_step, state.epoch = step, epoch
        callback.on_log(args, state, control, model=model, logs=dict(logs))
    callback.on_train_end(args, state, control, model=model)
    callback.on_predict(args, state, control, metrics=dict(PREDICT))


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("SWANLAB_")}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--case":
    run_case(next(c for c in CASES if c["name"] == sys.argv[2]))
elif __name__ == "__main__":
    OUT = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    TMP = Path(tempfile.mkdtemp(prefix="tchtrain-swanlab-reference-"))
    reader = sibling("_swanlab_read")
    results = []
    for case in CASES:
        work = TMP / case["name"]
        work.mkdir()
        env = {**clean_env(), **case["env"], "HOME": str(work)}
        subprocess.run([sys.executable, __file__, "--case", case["name"]], cwd=work, env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (run_dir,) = (work / case["env"].get("SWANLAB_LOG_DIR", "swanlog")).glob("run-*")
        model_config = sibling("_logger_model").model_config().to_dict()
        results.append({"name": case["name"], "env": case["env"], "args": case["args"], "model_config": model_config,
                        "num_parameters": NUM_PARAMETERS, "logs": LOGS, "predict": PREDICT,
                        "read": reader.read(run_dir, work)})
    (OUT / "swanlab_callback.json").write_text(json.dumps({"cases": results}, indent=1))
    shutil.rmtree(TMP, ignore_errors=True)
