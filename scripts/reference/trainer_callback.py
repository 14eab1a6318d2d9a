"""Reference for callbacks/tests: trainer_callback.py decisions and a real trainer_state.json.

Writes into OUT_DIR:
  default_flow.json       DefaultFlowCallback decisions for a grid of TrainingArguments, driven
                          through CallbackHandler the way Trainer's loop drives it (on_step_end,
                          then log/evaluate/save events when their flag is set, on_epoch_end).
  early_stopping.json     EarlyStoppingCallback counter and should_training_stop for metric
                          sequences, with best_metric updated as Trainer._determine_best_metric does.
  trainer_state.json      a real checkpoint state from a seconds-long CPU Trainer run of a tiny
                          model (logging, evaluation, saving, best model, EarlyStoppingCallback).
  trainer_state_final.json the same run's last checkpoint (with its stateful_callbacks).
  control_state.json      TrainerControl.state() of a control with mixed flags.

Usage: python trainer_callback.py OUT_DIR
"""

import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import (
    DefaultFlowCallback,
    EarlyStoppingCallback,
    Trainer,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_callback import CallbackHandler

transformers.logging.set_verbosity_error()
logging.disable(logging.WARNING)

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
TMP = Path(tempfile.mkdtemp(prefix="tchtrain-trainer-callback-"))


def flags(control):
    return {
        "should_log": control.should_log,
        "should_evaluate": control.should_evaluate,
        "should_save": control.should_save,
        "should_training_stop": control.should_training_stop,
        "should_epoch_stop": control.should_epoch_stop,
    }


# ----------------------------------------------------------------------------- DefaultFlowCallback grid


def simulate(cfg):
    """Drive CallbackHandler([DefaultFlowCallback]) as Trainer._inner_training_loop does."""
    kwargs = dict(
        output_dir=str(TMP / "flow"),
        logging_strategy=cfg["logging_strategy"],
        logging_steps=cfg["logging_steps"],
        logging_first_step=cfg["logging_first_step"],
        eval_strategy=cfg["eval_strategy"],
        eval_steps=cfg["eval_steps"],
        eval_delay=cfg["eval_delay"],
        save_strategy=cfg["save_strategy"],
        save_steps=cfg["save_steps"],
        max_steps=cfg["max_steps"],
        num_train_epochs=cfg["num_train_epochs"],
        report_to="none",
        use_cpu=True,
    )
    try:
        args = TrainingArguments(**kwargs)
    except ValueError as e:
        return {"config": cfg, "error": str(e)}
    steps_per_epoch = cfg["steps_per_epoch"]
    if args.max_steps > 0:
        max_steps = args.max_steps
        num_train_epochs = max_steps // steps_per_epoch + int(max_steps % steps_per_epoch > 0)
    else:
        max_steps = math.ceil(args.num_train_epochs * steps_per_epoch)
        num_train_epochs = math.ceil(args.num_train_epochs)

    handler = CallbackHandler([DefaultFlowCallback()], None, None, None, None)
    control = TrainerControl()
    state = TrainerState()
    state.compute_steps(args, max_steps)
    state.max_steps = max_steps
    state.num_train_epochs = num_train_epochs
    events = []
    control = handler.on_train_begin(args, state, control)
    for epoch in range(num_train_epochs):
        control = handler.on_epoch_begin(args, state, control)
        for step in range(steps_per_epoch):
            control = handler.on_step_begin(args, state, control)
            state.global_step += 1
            state.epoch = epoch + (step + 1) / steps_per_epoch
            control = handler.on_step_end(args, state, control)
            events.append({"event": "on_step_end", "global_step": state.global_step, "epoch": state.epoch, **flags(control)})
            # _maybe_log_save_evaluate: each action resets its flag through its event.
            if control.should_log:
                control = handler.on_log(args, state, control, {})
            if control.should_evaluate:
                control = handler.on_evaluate(args, state, control, {})
            if control.should_save:
                control = handler.on_save(args, state, control)
            if control.should_epoch_stop or control.should_training_stop:
                break
        control = handler.on_epoch_end(args, state, control)
        events.append({"event": "on_epoch_end", "global_step": state.global_step, "epoch": state.epoch, **flags(control)})
        if control.should_log:
            control = handler.on_log(args, state, control, {})
        if control.should_evaluate:
            control = handler.on_evaluate(args, state, control, {})
        if control.should_save:
            control = handler.on_save(args, state, control)
        if control.should_training_stop:
            break
    return {
        "config": cfg,
        # The arguments after TrainingArguments.__post_init__ (eval_steps fallback, int conversion).
        "args": {
            "logging_steps": args.logging_steps,
            "eval_steps": args.eval_steps,
            "save_steps": args.save_steps,
            "eval_delay": args.eval_delay,
        },
        "max_steps": max_steps,
        "num_train_epochs": num_train_epochs,
        "state_steps": {
            "logging_steps": state.logging_steps,
            "eval_steps": state.eval_steps,
            "save_steps": state.save_steps,
        },
        "events": events,
    }


def grid():
    rng = random.Random(0)
    configs = []
    base = dict(
        logging_strategy="steps", logging_steps=500, logging_first_step=False, eval_strategy="no",
        eval_steps=None, eval_delay=0, save_strategy="steps", save_steps=500, max_steps=-1,
        num_train_epochs=3.0, steps_per_epoch=4,
    )
    # Hand-picked cases first: defaults, ratios, final step handling, eval_delay.
    configs.append(dict(base))
    configs.append(dict(base, logging_steps=0.1, save_steps=0.25, eval_strategy="steps", eval_steps=0.2, max_steps=23))
    configs.append(dict(base, logging_steps=2, eval_strategy="steps", eval_steps=3, save_steps=5, max_steps=10,
                        eval_delay=4, logging_first_step=True))
    configs.append(dict(base, logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch",
                        num_train_epochs=2.5, eval_delay=2))
    configs.append(dict(base, logging_strategy="no", eval_strategy="no", save_strategy="no", logging_first_step=True))
    configs.append(dict(base, save_strategy="best", eval_strategy="steps", eval_steps=2, max_steps=9))
    configs.append(dict(base, eval_strategy="steps", eval_steps=None, logging_steps=3, max_steps=8))
    configs.append(dict(base, eval_strategy="steps", eval_steps=None, logging_steps=0.3, max_steps=8))
    configs.append(dict(base, logging_steps=1, save_steps=1, eval_strategy="steps", eval_steps=1, max_steps=5))
    for _ in range(240):
        cfg = dict(
            logging_strategy=rng.choice(["no", "steps", "epoch"]),
            logging_steps=rng.choice([1, 2, 3, 5, 0.1, 0.25, 0.5]),
            logging_first_step=rng.choice([False, True]),
            eval_strategy=rng.choice(["no", "steps", "epoch"]),
            eval_steps=rng.choice([None, 1, 2, 4, 7, 0.2, 0.3]),
            eval_delay=rng.choice([0, 0, 1, 3, 1.5]),
            save_strategy=rng.choice(["no", "steps", "epoch", "best"]),
            save_steps=rng.choice([1, 2, 4, 6, 0.25, 0.4]),
            max_steps=rng.choice([-1, -1, 5, 9, 13, 20]),
            num_train_epochs=rng.choice([1.0, 2.0, 2.5, 3.0]),
            steps_per_epoch=rng.choice([3, 4, 5]),
        )
        configs.append(cfg)
    return configs


cases = [simulate(cfg) for cfg in grid()]
cases = [c for c in cases if "error" not in c]
(OUT / "default_flow.json").write_text(json.dumps({"cases": cases}, separators=(",", ":")) + "\n")

# ----------------------------------------------------------------------------- EarlyStoppingCallback


def early_stopping_case(metric_for_best_model, greater_is_better, patience, threshold, values, metric_key=None):
    args = TrainingArguments(
        output_dir=str(TMP / "es"), eval_strategy="steps", eval_steps=1, save_steps=1,
        metric_for_best_model=metric_for_best_model, greater_is_better=greater_is_better,
        load_best_model_at_end=True, report_to="none", use_cpu=True,
    )
    cb = EarlyStoppingCallback(early_stopping_patience=patience, early_stopping_threshold=threshold)
    handler = CallbackHandler([cb], None, None, None, None)
    state = TrainerState()
    control = TrainerControl()
    control = handler.on_train_begin(args, state, control)
    key = metric_key or (metric_for_best_model if metric_for_best_model.startswith("eval_")
                         else f"eval_{metric_for_best_model}")
    steps = []
    for i, v in enumerate(values):
        state.global_step = i + 1
        metrics = {key: v, "eval_runtime": 0.5}
        control = handler.on_evaluate(args, state, control, metrics)
        steps.append({
            "value": v,
            "counter": cb.early_stopping_patience_counter,
            "should_training_stop": control.should_training_stop,
            "best_metric_before": state.best_metric,
        })
        # Trainer._determine_best_metric, run after on_evaluate.
        metric_to_check = args.metric_for_best_model
        if not metric_to_check.startswith("eval_"):
            metric_to_check = f"eval_{metric_to_check}"
        if metric_to_check in metrics:
            mv = metrics[metric_to_check]
            if state.best_metric is None:
                state.best_metric = float("-inf") if args.greater_is_better else float("inf")
            if (mv > state.best_metric) if args.greater_is_better else (mv < state.best_metric):
                state.best_metric = mv
                state.best_global_step = state.global_step
    return {
        "metric_for_best_model": metric_for_best_model,
        "greater_is_better": args.greater_is_better,
        "patience": patience,
        "threshold": threshold,
        "metric_key": key,
        "steps": steps,
        "state": cb.state(),
    }


es_cases = [
    early_stopping_case("loss", None, 2, 0.0, [1.0, 0.9, 0.95, 0.91, 0.8, 0.85, 0.86, 0.87]),
    early_stopping_case("eval_loss", False, 1, 0.05, [1.0, 0.97, 0.9, 0.89, 0.5]),
    early_stopping_case("accuracy", None, 3, 0.01, [0.5, 0.6, 0.605, 0.61, 0.7, 0.7, 0.69, 0.71, 0.7]),
    early_stopping_case("f1", True, 2, 0.0, [0.5, float("nan"), 0.6, 0.6, 0.59]),
    early_stopping_case("loss", False, 1, 0.0, [1.0, 0.5], metric_key="eval_other"),
]
(OUT / "early_stopping.json").write_text(json.dumps({"cases": es_cases}, indent=2) + "\n")

control = TrainerControl(should_training_stop=True, should_save=True)
(OUT / "control_state.json").write_text(json.dumps(control.state(), indent=2, sort_keys=True) + "\n")

# ----------------------------------------------------------------------------- a real Trainer run


class TinyRegressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


torch.manual_seed(0)
# A relative output_dir keeps best_model_checkpoint ("run/checkpoint-N") the same on every machine.
os.chdir(TMP)
run_dir = TMP / "run"
args = TrainingArguments(
    output_dir="run",
    per_device_train_batch_size=4,
    per_device_eval_batch_size=8,
    max_steps=12,
    learning_rate=1e-1,
    logging_steps=2,
    logging_first_step=True,
    eval_strategy="steps",
    eval_steps=3,
    save_steps=3,
    load_best_model_at_end=True,
    metric_for_best_model="loss",
    report_to="none",
    use_cpu=True,
    disable_tqdm=True,
    seed=0,
)
trainer = Trainer(
    model=TinyRegressor(),
    args=args,
    train_dataset=Rows(32, 1),
    eval_dataset=Rows(16, 2),
    callbacks=[EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=1e-5)],
)
trainer.train()
checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
# A middle checkpoint (best metric fields set, training still running) and the last one.
shutil.copy(checkpoints[0] / "trainer_state.json", OUT / "trainer_state.json")
shutil.copy(checkpoints[-1] / "trainer_state.json", OUT / "trainer_state_final.json")

# ----------------------------------------------------------------------------- serializer corner cases

# A state whose values exercise Python's json formatting: float repr (1e-05, 1e+16, 0.0, -0.0),
# NaN / Infinity, ints next to floats, non-ASCII and control characters (ensure_ascii), nested
# trial_params, a list of states for two callbacks of one class, empty containers.
odd = TrainerState(
    epoch=2.0000000000000004,
    global_step=7,
    max_steps=40,
    logging_steps=1.0,
    eval_steps=3,
    save_steps=10,
    train_batch_size=None,
    num_train_epochs=5,
    num_input_tokens_seen=12345678901234,
    total_flos=1.5e16,
    log_history=[
        {"loss": float("nan"), "grad_norm": float("inf"), "learning_rate": 1e-05, "epoch": 0.1, "step": 1},
        {"eval_loss": -0.0, "eval_acc": 1, "eval_small": 1.2345e-7, "eval_big": 123456789012345678.0,
         "eval_neg": float("-inf"), "epoch": 0.0001, "step": 2},
        {"note": "caf\u00e9 \u2603 \U0001f600 tab\t nl\n quote\" back\\ \x7f \x01", "step": 3},
        {},
    ],
    best_metric=0.30000000000000004,
    best_global_step=3,
    best_model_checkpoint="out/checkpoint-3",
    is_hyper_param_search=True,
    trial_name="trial-\u00fc",
    trial_params={"lr": 3e-4, "layers": 2, "name": "x", "flag": True, "nested": [1, 2.5, None, []]},
    stateful_callbacks={
        "EarlyStoppingCallback": [
            {"args": {"early_stopping_patience": 1, "early_stopping_threshold": 0.0}, "attributes": {"early_stopping_patience_counter": 0}},
            {"args": {"early_stopping_patience": 3, "early_stopping_threshold": 0.5}, "attributes": {"early_stopping_patience_counter": 2}},
        ],
        "TrainerControl": TrainerControl().state(),
    },
)
odd.save_to_json(str(OUT / "trainer_state_odd.json"))
TrainerState().save_to_json(str(OUT / "trainer_state_default.json"))

os.chdir(OUT)
shutil.rmtree(TMP, ignore_errors=True)
print(f"trainer_callback: {len(cases)} flow cases, {len(es_cases)} early-stopping cases, "
      f"{len(checkpoints)} checkpoints")
