"""Reference for callbacks/tests/it/clearml.rs: what upstream's ClearMLCallback writes through
clearml 2.1 in ClearML's offline mode (`CLEARML_OFFLINE_MODE=1`: a session folder
`<cache>/offline/offline-<task id>/` holding `task.json` (the task: hyperparameters,
configuration objects) and `metrics.jsonl` (the reported scalars and single values), zipped
beside it at the end, that `Task.import_offline_session` uploads to a ClearML server), and what
the server receives when clearml imports it (a stand-in ClearML API server,
_clearml_server.py).

Each case runs in its own Python process (clearml keeps one task per process): transformers'
ClearMLCallback driven through on_train_begin (a model with a config), on_log for a sequence
of Trainer-like logs (eval_ and test_ keys, the single-value keys, a NaN, an infinity, a bool,
an int, a string and a list, which upstream drops with a warning), on_train_end (which closes
the task and zips the session). The `log_model_offline` case keeps CLEARML_LOG_MODEL at its
default (TRUE) and calls on_save: clearml's offline mode cannot upload model weights, and the
error it raises is recorded.

Writes OUT_DIR/clearml_callback.json: {"cases": [...], "hocon": [[dict, text], ...]} (HOCON
below: clearml's `config_dict_to_text` of each), each case with
  name, env      the CLEARML_* environment variables set;
  args           the TrainingArguments keyword arguments (the Rust test builds the same);
  model_config   model.config.to_dict();
  logs           [[global_step, epoch, logs], ...] passed to on_log; predict (empty: upstream's
                 callback has no on_predict);
  session        the session as written (_clearml_server.read_session): the zip's file names,
                 task.json (without its id and folder, which are per run; `script`, which
                 describes the Python process, by its keys), the metric events in order
                 (without their timestamps and task id);
  imported       _clearml_server.fold of what the stand-in server received from
                 Task.import_offline_session;
  error          (log_model_offline) the exception on_save raised.

Usage: python clearml_callback.py OUT_DIR
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
    output_dir="clearml_out",
    run_name="clearml reference run",
    learning_rate=3e-4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=2.0,
    logging_steps=5,
    seed=7,
    lr_scheduler_type="cosine_with_restarts",
    lr_scheduler_kwargs={"num_cycles": 2, "note": "x"},
    optim="adamw_torch",
    debug="underflow_overflow",
    label_names=["labels", "extra"],
    report_to=["clearml"],
    use_cpu=True,
)

LOGS = [
    [5, 0.25, {"loss": 2.5, "grad_norm": float("nan"), "learning_rate": 0.0003, "epoch": 0.25}],
    [10, 0.5, {"loss": 2.25, "grad_norm": float("inf"), "learning_rate": 0.00015, "epoch": 0.5,
               "num_input_tokens_seen": 1280}],
    [10, 0.5, {"eval_loss": 2.0, "eval_accuracy": 0.75, "eval_runtime": 0.5, "eval_samples_per_second": 64.0,
               "eval_steps_per_second": 8.0, "eval_per_class": [0.5, 1.0], "eval_note": "ok", "eval_none": None,
               "eval_flag": True, "epoch": 0.5}],
    [15, 0.75, {"loss": 0.0, "grad_norm": -0.0, "learning_rate": 5e-05, "epoch": 0.75}],
    [20, 1.0, {"train_runtime": 12.5, "train_samples_per_second": 6.4, "train_steps_per_second": 1.6,
               "total_flos": 12345678.0, "train_loss": 2.3, "epoch": 1.0}],
    [20, 1.0, {"test_loss": 1.75, "test_runtime": 0.25, "test_samples_per_second": 32.0}],
]

# Dicts whose text clearml's config_dict_to_text (pyhocon) writes, for the HOCON writer:
# `id2label`'s keys are integers (as in model.config.to_dict()); the second holds keys that
# send clearml to its JSON fallback.
HOCON = [
    {"id2label": {"0": "A", "1": "B"}, "l": [1, 2.5, "s", None, True], "e": {}, "n": {"q": [{"a": 1}, {"b": []}]},
     "f": 1e-12, "big": 1e20, "neg": -0.0, "s": "a\"b\\c\t", "m": "multi\nline", "nl": "end\n", "long": list(range(40)),
     "1": 2, "1,x": 3, "0x5": 4, "ls": ["x" * 50, "y" * 50], "deep": {"x": {"y": [[1, 2], [3]]}, "z": None}, "u": "\u00e9\u2713",
     "nan": float("nan"), "inf": float("-inf"), "space key": "v", "empty_list": [], "short": [{}]},
    {"id2label": {"0": "A"}, "x.y": 1, "nan": float("nan"), "inf": float("inf"), "s": "t\n", "lst": [1, {"a:b": 2}],
     "1": 1.5, "space key": "a\tb\\c\"d", "u": "\u00e9\U0001f600", "ctl": "\b\f\x01", "neg": -0.0, "big": 1e20,
     "l": [None, True, "s"]},
]

CASES = [
    {"name": "offline_defaults", "env": {"CLEARML_OFFLINE_MODE": "1", "CLEARML_LOG_MODEL": "FALSE"},
     "args": ARGS},
    {"name": "named_task_in_a_cache_dir",
     "env": {"CLEARML_OFFLINE_MODE": "true", "CLEARML_LOG_MODEL": "no", "CLEARML_PROJECT": "tchtrain/reference",
             "CLEARML_TASK": "fine-tune #2", "CLEARML_CACHE_DIR": "clearml-cache"},
     "args": {**{k: v for k, v in ARGS.items() if k not in ("debug", "label_names", "lr_scheduler_kwargs")},
              "eval_strategy": "steps", "eval_steps": 10, "save_strategy": "no", "hub_strategy": "end"}},
    {"name": "log_model_offline", "env": {"CLEARML_OFFLINE_MODE": "1"}, "args": ARGS},
]


def sibling(stem):
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case):
    """In this process: the callback's events; on_train_end closes the task."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import ClearMLCallback

    model_module = sibling("_logger_model")
    args = TrainingArguments(**case["args"])
    model = model_module.Model(model_module.model_config(), 0)
    callback = ClearMLCallback()
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    if case["name"] == "log_model_offline":
        state.global_step = 5
        os.makedirs(os.path.join(args.output_dir, "checkpoint-5"))
        Path(args.output_dir, "checkpoint-5", "config.json").write_text("{}")
        try:
            callback.on_save(args, state, control)
        except Exception as e:  # noqa: BLE001 - recorded for the test
            Path("error.txt").write_text(f"{type(e).__name__}: {e}")
        callback.on_train_end(args, state, control, model=model)
        return
    for step, epoch, logs in LOGS:
        state.global_step, state.epoch = step, epoch
        callback.on_log(args, state, control, model=model, logs=dict(logs))
    callback.on_train_end(args, state, control, model=model)


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("CLEARML_", "TRAINS_"))}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--case":
    run_case(next(c for c in CASES if c["name"] == sys.argv[2]))
elif __name__ == "__main__":
    OUT = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    TMP = Path(tempfile.mkdtemp(prefix="tchtrain-clearml-reference-"))
    server = sibling("_clearml_server")
    # Each case runs from a copy outside this repository: clearml's Task.init analyses the
    # repository its script is in (every Python file's imports, up to 300 s).
    for stem in ("clearml_callback", "_logger_model"):
        shutil.copy(HERE / f"{stem}.py", TMP / f"{stem}.py")
    procs = []
    for case in CASES:  # in parallel: each mostly waits for clearml's threads at close
        work = TMP / case["name"]
        work.mkdir()
        env = {**clean_env(), **case["env"], "HOME": str(work)}
        procs.append(subprocess.Popen([sys.executable, str(TMP / "clearml_callback.py"), "--case", case["name"]],
                                      cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for proc in procs:
        assert proc.wait() == 0, proc.args
    results = []
    for case in CASES:
        work = TMP / case["name"]
        cache = work / case["env"].get("CLEARML_CACHE_DIR", ".clearml/cache")
        (session_zip,) = (cache / "offline").glob("offline-*.zip")
        result = {"name": case["name"], "env": case["env"], "args": case["args"],
                  "model_config": sibling("_logger_model").model_config().to_dict(), "logs": LOGS, "predict": {},
                  "session": server.read_session(session_zip)}
        if (work / "error.txt").exists():
            result["error"] = (work / "error.txt").read_text()
        else:
            result["imported"] = server.fold(server.import_session(session_zip))
        results.append(result)
    from clearml.utilities.config import config_dict_to_text

    def with_int_labels(d):
        return {**d, "id2label": {int(k): v for k, v in d["id2label"].items()}}

    hocon = [[d, config_dict_to_text(with_int_labels(d))] for d in HOCON]
    (OUT / "clearml_callback.json").write_text(json.dumps({"cases": results, "hocon": hocon}, indent=1))
    shutil.rmtree(TMP, ignore_errors=True)
