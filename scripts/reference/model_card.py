"""Reference for trainer/tests/it/model_card.rs: transformers 5.23's model card
(`TrainingSummary.from_trainer(trainer, ...).to_model_card()`, what `Trainer.create_model_card`
writes as README.md and `push_to_hub` uploads).

Each case gives the TrainingArguments keyword arguments, the model's class name and
`config._name_or_path`, the Trainer's `state.log_history` and `create_model_card`'s keyword
arguments; the card is made in offline mode (no license lookup on the hub), from a stand-in
trainer holding exactly those (datasets that are not `datasets` objects, as ours).

Writes OUT_DIR/model_card.json: {"cases": [{name, args, class_name, name_or_path, log_history,
kwargs, card, framework_versions}]}.

Usage: python model_card.py OUT_DIR
"""

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ["HF_HUB_OFFLINE"] = "1"

import transformers  # noqa: E402
from transformers import TrainingArguments  # noqa: E402
from transformers.modelcard import TrainingSummary  # noqa: E402

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)

CLM_LOGS = [
    {"loss": 4.1234567, "grad_norm": 2.5, "learning_rate": 5e-05, "epoch": 0.5, "step": 5},
    {"eval_loss": 3.98765432, "eval_runtime": 0.1, "eval_samples_per_second": 80.0, "eval_steps_per_second": 10.0,
     "epoch": 0.5, "step": 5},
    {"loss": 3.5, "grad_norm": 1.25, "learning_rate": 2.5e-05, "epoch": 1.0, "step": 10},
    {"eval_loss": 3.25, "eval_runtime": 0.1, "eval_samples_per_second": 80.0, "eval_steps_per_second": 10.0,
     "epoch": 1.0, "step": 10},
    {"train_runtime": 3.5, "train_samples_per_second": 11.4, "train_steps_per_second": 2.857,
     "total_flos": 1234.0, "train_loss": 3.8, "epoch": 1.0, "step": 10},
]

CLS_LOGS = [
    {"eval_loss": 0.69314718, "eval_accuracy": 0.5, "eval_f1": 0.3333333333333333, "eval_runtime": 0.2,
     "eval_samples_per_second": 40.0, "eval_steps_per_second": 5.0, "epoch": 1.0, "step": 4},
    {"loss": 0.65, "grad_norm": 0.5, "learning_rate": 1e-05, "epoch": 2.0, "step": 8},
    {"eval_loss": 0.6, "eval_accuracy": 0.75, "eval_f1": 0.7142857142857143, "eval_runtime": 0.2,
     "eval_samples_per_second": 40.0, "eval_steps_per_second": 5.0, "epoch": 2.0, "step": 8},
    {"eval_loss": 0.55, "eval_accuracy": 0.8, "eval_f1": 0.8, "eval_runtime": 0.2,
     "eval_samples_per_second": 40.0, "eval_steps_per_second": 5.0, "epoch": 3.0, "step": 12},
    {"train_runtime": 1.5, "train_samples_per_second": 64.0, "train_steps_per_second": 8.0, "total_flos": 99.0,
     "train_loss": 0.6, "epoch": 3.0, "step": 12},
]

EVAL_ONLY = [
    {"eval_loss": 1.5, "eval_wer": 0.4375, "eval_runtime": 0.2, "eval_samples_per_second": 40.0,
     "eval_steps_per_second": 5.0, "epoch": 0.0, "step": 0},
]

CASES = [
    {
        "name": "clm_from_scratch",
        "args": dict(output_dir="out/clm-run", learning_rate=5e-05, per_device_train_batch_size=4,
                     per_device_eval_batch_size=8, gradient_accumulation_steps=2, max_steps=10, warmup_steps=2.0,
                     seed=42, use_cpu=True, report_to="none"),
        "class_name": "GPT2LMHeadModel",
        "name_or_path": "/tmp",
        "log_history": CLM_LOGS,
        "kwargs": {},
    },
    {
        "name": "classifier_fine_tuned",
        "args": dict(output_dir="out/imdb-classifier", learning_rate=2e-05, per_device_train_batch_size=16,
                     num_train_epochs=3.0, optim="adafactor", lr_scheduler_type="cosine",
                     label_smoothing_factor=0.1, seed=7, use_cpu=True, report_to="none"),
        "class_name": "BertForSequenceClassification",
        "name_or_path": "org/base-model",
        "log_history": CLS_LOGS,
        "kwargs": {"language": "en", "license": "apache-2.0", "tags": "custom", "dataset_tags": "imdb",
                   "dataset": "IMDB", "dataset_args": "plain_text"},
    },
    {
        "name": "evaluation_only",
        "args": dict(output_dir="out/asr", per_device_eval_batch_size=2, optim_args="foo=1", seed=3,
                     use_cpu=True, report_to="none", fp16=False),
        "class_name": "WhisperForConditionalGeneration",
        "name_or_path": "openai/whisper-tiny",
        "log_history": EVAL_ONLY,
        "kwargs": {"model_name": "whisper-tiny-asr", "tasks": "automatic-speech-recognition"},
    },
]

results = []
for case in CASES:
    args = TrainingArguments(**case["args"])
    model = type(case["class_name"], (), {})()
    model.config = SimpleNamespace(_name_or_path=case["name_or_path"])
    trainer = SimpleNamespace(
        args=args, model=model, state=SimpleNamespace(log_history=[dict(e) for e in case["log_history"]]),
        eval_dataset=None, train_dataset=None,
    )
    card = TrainingSummary.from_trainer(trainer, **case["kwargs"]).to_model_card()
    results.append({**case, "card": card})

import datasets, tokenizers, torch  # noqa: E402,E401

(OUT / "model_card.json").write_text(json.dumps({
    "cases": results,
    "framework_versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                           "datasets": datasets.__version__, "tokenizers": tokenizers.__version__},
}, indent=1))
print(results[1]["card"])
