"""Reference for callbacks/tests/it/wandb.rs: what upstream's WandbCallback writes in W&B's
offline mode (`WANDB_MODE=offline`: a run folder `wandb/offline-run-<time>-<id>/` whose
`run-<id>.wandb` transaction log `wandb sync` uploads later), and what it sends online.

Drives transformers' WandbCallback (on_train_begin with a model that has a config and a
parameter count, on_log for a sequence of Trainer-like logs, on_predict, on_train_end, then
`wandb.finish()` as the interpreter's exit does) with wandb 0.31, one case per set of
environment variables, and folds each run's log with _wandb_records.py.

The `log_model_*` cases set `WANDB_LOG_MODEL` and hand the callback a real model (a tiny Llama
drawn after `torch.manual_seed(0)`): the initial model's architecture is logged at setup,
`on_save` logs `<output_dir>/checkpoint-10/` (written here: the model's `save_pretrained` and a
`trainer_state.json`) with `checkpoint`, `on_train_end` the final model (upstream saves it
through a throwaway Trainer); with `load_best_model_at_end` its metadata is the best metric.
Each such case's folder OUT_DIR/<case>/ holds what the Rust test hands its callback: the
checkpoint (`checkpoint-10/`), the files upstream's final-model artifact staged from its save
(`final_model/`) and `print(model)` (`architecture.txt`).

The `online` cases run in wandb's online mode against the stand-in W&B server
(_wandb_server.py, in a thread of this process): the requests wandb-core made are folded into
the case's `requests` (run, config, history lines, summary, end of the file stream, uploaded
files; with `WANDB_LOG_MODEL`, the artifacts created, uploaded and committed), which the Rust
test's run against the same stand-in must equal.

Writes OUT_DIR/wandb_callback.json: {"cases": [...]}, each case with
  name, env        the W&B environment variables set;
  args             the TrainingArguments keyword arguments (the Rust test builds the same);
  model_config     model.config.to_dict(), num_parameters the model's count;
  logs             [[global_step, logs], ...] passed to on_log; predict the metrics passed to
                   on_predict;
  run              the folded run (_wandb_records.fold): run fields, config, summary, metric
                   definitions, history rows, exit record;
  requests         (online) _wandb_server.fold of what the server received.

Usage: python wandb_callback.py OUT_DIR
"""

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
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
server = sibling("_wandb_server")

import torch  # noqa: E402
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

API_KEY = "0123456789abcdef0123456789abcdef01234567"

CASES = [
    {"name": "project_and_run_name", "env": {"WANDB_PROJECT": "tchtrain-reference"}, "args": ARGS},
    {"name": "default_project_no_run_name", "env": {}, "args": {k: v for k, v in ARGS.items() if k != "run_name"}},
    {"name": "log_model_checkpoint", "env": {"WANDB_LOG_MODEL": "checkpoint"}, "args": ARGS,
     "log_model": {"save_at": 10, "epoch": 0.5}},
    {"name": "log_model_end_best", "env": {"WANDB_LOG_MODEL": "end"},
     "args": {**{k: v for k, v in ARGS.items() if k != "run_name"}, "load_best_model_at_end": True,
              "eval_strategy": "steps", "save_strategy": "steps", "eval_steps": 10, "save_steps": 10},
     "log_model": {"save_at": 10, "epoch": 0.5, "best_metric": 2.0, "total_flos": 12345678.0}},
    {"name": "online", "env": {"WANDB_MODE": "online", "WANDB_API_KEY": API_KEY, "WANDB_PROJECT": "tchtrain-reference",
                               "WANDB_RUN_GROUP": "group-a", "WANDB_TAGS": "x,y"},
     "args": ARGS, "online": True},
    {"name": "online_log_model", "env": {"WANDB_MODE": "online", "WANDB_API_KEY": API_KEY, "WANDB_PROJECT": "tchtrain-reference",
                                         "WANDB_LOG_MODEL": "checkpoint"},
     "args": ARGS, "online": True, "log_model": {"save_at": 10, "epoch": 0.5}},
]


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def wait_for_exit(run_file):
    """`wandb.finish()` returns before wandb-core has written the whole log: waits (up to a
    minute) until the exit record is in it."""
    for _ in range(600):
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in records.records(run_file)):
                return
        except ValueError:  # a record cut short while it is written
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{run_file}: no exit record")


def keep_final_model(run_file, folder):
    """Copies the files upstream's final-model artifact staged (its save) into `folder`."""
    for r in records.records(run_file):
        if r.WhichOneof("record_type") == "artifact" and "final_model" in r.artifact.aliases:
            for e in r.artifact.manifest.contents:
                if e.path == "model_architecture.txt":
                    (folder / "architecture.txt").write_text(Path(e.local_path).read_text()[:-1])
                else:
                    (folder / "final_model").mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(e.local_path, folder / "final_model" / e.path)

results = []
for case in CASES:
    for name, v in case["env"].items():
        os.environ[name] = v
    work = TMP / case["name"]
    os.environ["WANDB_DIR"] = str(work)
    os.environ["WANDB_DATA_DIR"] = str(work / "data")
    work.mkdir()
    if case.get("online"):  # the stand-in W&B server, recording what the run sends
        wandb.teardown()  # wandb.setup() keeps the first run's settings (offline) otherwise
        stand_in = server.start(work / "requests.jsonl")
        os.environ["WANDB_BASE_URL"] = f"http://127.0.0.1:{stand_in.server_address[1]}"
    os.chdir(work)  # the relative output_dir's checkpoints
    args = TrainingArguments(**case["args"])
    log_model = case.get("log_model")
    if log_model:
        model = tiny_llama()
        config, n = model.config, model.num_parameters()
    else:
        config, n = model_config(), 123456
        model = Model(config, n)
    config_dict = config.to_dict()  # as the callback sees it (saving adds `architectures`)
    callback = WandbCallback()
    state = TrainerState()
    control = TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    run_dir = Path(wandb.run.dir).parent
    for step, logs in LOGS:
        state.global_step = step
        callback.on_log(args, state, control, model=model, logs=dict(logs))
        if log_model and step == log_model["save_at"] and "eval_loss" in logs:
            state.epoch = log_model["epoch"]
            checkpoint = Path(args.output_dir) / f"checkpoint-{step}"
            model.save_pretrained(checkpoint)
            (checkpoint / "trainer_state.json").write_text('{"global_step": 10}\n')
            shutil.copytree(checkpoint, OUT / case["name"] / checkpoint.name)
            callback.on_save(args, state, control)
    if log_model and "best_metric" in log_model:
        state.best_metric, state.total_flos = log_model["best_metric"], log_model["total_flos"]
    callback.on_predict(args, state, control, metrics=dict(PREDICT))
    callback.on_train_end(args, state, control, model=model)
    wandb.finish()
    run_file = next(run_dir.glob("run-*.wandb"))
    wait_for_exit(run_file)
    if log_model and case.get("online"):
        # wandb-core deletes the staged files once uploaded: the final model is the same
        # seeded, untrained model as log_model_checkpoint's (the uploads' MD5s say so).
        for name in ("architecture.txt", "final_model"):
            src, dst = OUT / "log_model_checkpoint" / name, OUT / case["name"] / name
            shutil.copytree(src, dst) if src.is_dir() else shutil.copyfile(src, dst)
    elif log_model:
        keep_final_model(run_file, OUT / case["name"])
    requests = None
    if case.get("online"):
        for _ in range(600):  # until the file stream's last post has come
            if '"complete": true' in (work / "requests.jsonl").read_text():
                break
            time.sleep(0.1)
        stand_in.shutdown()
        del os.environ["WANDB_BASE_URL"]
        requests = server.fold(work / "requests.jsonl")
    results.append({
        "name": case["name"], "env": case["env"], "args": case["args"], "model_config": config_dict,
        "num_parameters": n, "logs": LOGS, "predict": PREDICT, "run": records.fold(run_file),
        "run_dir_name": run_dir.name.split("-")[0] + "-" + run_dir.name.split("-")[1],
        "log_model": log_model, "requests": requests,
    })
    for name in case["env"]:
        del os.environ[name]
    os.environ["WANDB_MODE"] = "offline"
    os.chdir(HERE)

(OUT / "wandb_callback.json").write_text(json.dumps({"cases": results}, indent=1, sort_keys=True))
shutil.rmtree(TMP, ignore_errors=True)
print("wandb_callback:", len(results), "cases")
