"""The upstream side of `cargo xtask e2e`'s run_classification cases: sequence classification
with the steps of transformers' examples/pytorch/text-classification/run_classification.py,
on the pinned transformers / datasets / torch, with the same flags as the Rust
`run_classification` binary.

Usage (one process, or under `python -m torch.distributed.run --nproc_per_node N`):

    python run_classification.py --model_name_or_path M --train_file train.parquet \
        --validation_file validation.parquet --max_seq_length 64 --do_train --do_eval \
        --max_steps 10 --output_dir OUT ...

The steps, in upstream's order:
  1. HfArgumentParser over (ModelArguments, DataTrainingArguments, TrainingArguments), the
     script's dataclasses with upstream's flags, names and defaults.
  2. set_seed(training_args.seed).
  3. The raw dataset: `load_dataset(dataset_name, dataset_config_name)`, or the train and
     validation files. Upstream loads "csv" files with the csv builder and everything else
     with the json builder (its __post_init__ accepts csv and json only); here the builder
     is the one the extension names ("csv", "json", "parquet"), so that the cases can give
     the Parquet files the Rust script reads.
  4. remove_splits, train/validation_split_name, remove_columns; the label column renamed
     to "label".
  5. Regression when do_regression, else when the label column is float; otherwise the
     label list: the distinct training labels as strings, extended by the validation
     split's unseen ones, -1 removed, sorted.
  6. Config (num_labels, finetuning_task, problem_type), tokenizer, model
     (AutoModelForSequenceClassification, ignore_mismatched_sizes): the new head is drawn
     after set_seed. label2id / id2label from the label list when training.
  7. preprocess_function with map(batched=True): the text columns joined into "sentence"
     with text_column_delimiter, tokenized with truncation to max_seq_length (capped at
     model_max_length), padded to it when pad_to_max_length; labels mapped to ids.
  8. shuffle_train_dataset (datasets' shuffle with shuffle_seed), max_train_samples,
     max_eval_samples; the metric (accuracy, or mse for regression); the collator
     (default_data_collator when padded to max_seq_length, else the Trainer's default).
  9. train (save_model, train metrics with train_samples, save_state); evaluate (eval
     metrics with eval_samples); predict (the label column removed, the argmax named by
     model.config.id2label, or the value as {:3.3f} for regression, into
     predict_results.txt).

Accuracy and mse are computed with numpy as `evaluate`'s metrics compute them (sklearn's
accuracy_score / mean_squared_error), without that package. Multi-label classification
(list labels) is not part of the e2e cases and is refused.
OMP_NUM_THREADS, when set, also sets torch's intra-op threads.
"""

import logging
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Optional

import datasets
import numpy as np
import torch
from datasets import load_dataset

import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    EvalPrediction,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """Which data, and how it is prepared (upstream's DataTrainingArguments)."""

    dataset_name: Optional[str] = field(default=None, metadata={"help": "Dataset repository or local folder."})
    dataset_config_name: Optional[str] = field(default=None, metadata={"help": "The dataset's configuration."})
    do_regression: bool = field(default=None, metadata={"help": "Regression instead of classification."})
    text_column_names: Optional[str] = field(
        default=None, metadata={"help": "Text columns, comma-separated (default: the 'sentence' column)."}
    )
    text_column_delimiter: Optional[str] = field(default=" ", metadata={"help": "Joins the text columns."})
    train_split_name: Optional[str] = field(default=None, metadata={"help": "The split to train on."})
    validation_split_name: Optional[str] = field(default=None, metadata={"help": "The split to evaluate on."})
    test_split_name: Optional[str] = field(default=None, metadata={"help": "The split to predict on."})
    remove_splits: Optional[str] = field(default=None, metadata={"help": "Splits to drop, comma-separated."})
    remove_columns: Optional[str] = field(default=None, metadata={"help": "Columns to drop, comma-separated."})
    label_column_name: Optional[str] = field(default=None, metadata={"help": "The label column (default: label)."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per row after truncation."})
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "Processes for map()."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the cached map results."})
    pad_to_max_length: bool = field(default=True, metadata={"help": "Pad every row to max_seq_length."})
    shuffle_train_dataset: bool = field(default=False, metadata={"help": "Shuffle the train split."})
    shuffle_seed: int = field(default=42, metadata={"help": "Seed of that shuffle."})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N training rows."})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N evaluation rows."})
    max_predict_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N test rows."})
    metric_name: Optional[str] = field(default=None, metadata={"help": "accuracy or mse."})
    train_file: Optional[str] = field(default=None, metadata={"help": "Training data file (csv, json, parquet)."})
    validation_file: Optional[str] = field(default=None, metadata={"help": "Validation data file."})
    test_file: Optional[str] = field(default=None, metadata={"help": "Test data file."})

    def __post_init__(self):
        if self.dataset_name is None:
            if self.train_file is None or self.validation_file is None:
                raise ValueError("Need either a dataset name or a training/validation file.")
            train_extension = self.train_file.split(".")[-1]
            if train_extension not in ("csv", "json", "parquet"):
                raise ValueError("`train_file` should be a csv, a json or a parquet file.")
            if self.validation_file.split(".")[-1] != train_extension:
                raise ValueError("`validation_file` should have the same extension as `train_file`.")


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune (upstream's ModelArguments)."""

    model_name_or_path: str = field(metadata={"help": "The model checkpoint."})
    config_name: Optional[str] = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "Tokenizer name or path, if not the model's."})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "Where downloads are stored."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (tokenizers-backed) tokenizer."})
    model_revision: str = field(default="main", metadata={"help": "Model revision (branch, tag or commit)."})
    token: str = field(default=None, metadata={"help": "Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the hub: refused here."})
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Re-initialise weights whose shapes differ from the checkpoint's."}
    )


def label_list_of(split):
    """The split's distinct labels, as strings (model.config.label2id's keys are strings)."""
    return [str(label) for label in split.unique("label")]


def accuracy(predictions, references):
    return float(np.mean(np.asarray(predictions) == np.asarray(references)))


def mean_squared_error(predictions, references):
    diff = np.asarray(predictions, dtype=np.float64) - np.asarray(references, dtype=np.float64)
    return float(np.mean(diff * diff))


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    if model_args.trust_remote_code:
        raise ValueError("--trust_remote_code is not part of the e2e cases")
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)

    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)

    set_seed(training_args.seed)

    hub = {"cache_dir": model_args.cache_dir, "token": model_args.token}
    if data_args.dataset_name is not None:
        raw_datasets = load_dataset(data_args.dataset_name, data_args.dataset_config_name, **hub)
    else:
        data_files = {"train": data_args.train_file, "validation": data_args.validation_file}
        if training_args.do_predict:
            if data_args.test_file is None:
                raise ValueError("Need either a dataset name or a test file for `do_predict`.")
            if data_args.test_file.split(".")[-1] != data_args.train_file.split(".")[-1]:
                raise ValueError("`test_file` should have the same extension (csv or json) as `train_file`.")
            data_files["test"] = data_args.test_file
        builder = data_args.train_file.split(".")[-1]
        raw_datasets = load_dataset(builder, data_files=data_files, **hub)

    if data_args.remove_splits is not None:
        for split in data_args.remove_splits.split(","):
            raw_datasets.pop(split)
    for wanted, given in (
        ("train", data_args.train_split_name),
        ("validation", data_args.validation_split_name),
        ("test", data_args.test_split_name),
    ):
        if given is not None:
            raw_datasets[wanted] = raw_datasets.pop(given)
    if data_args.remove_columns is not None:
        for split in raw_datasets.keys():
            for column in data_args.remove_columns.split(","):
                raw_datasets[split] = raw_datasets[split].remove_columns(column)
    if data_args.label_column_name is not None and data_args.label_column_name != "label":
        for split in raw_datasets.keys():
            raw_datasets[split] = raw_datasets[split].rename_column(data_args.label_column_name, "label")

    if data_args.do_regression is None:
        is_regression = raw_datasets["train"].features["label"].dtype in ("float32", "float64")
    else:
        is_regression = data_args.do_regression
    if is_regression:
        label_list = None
        num_labels = 1
    else:
        if raw_datasets["train"].features["label"].dtype == "list":
            raise ValueError("multi-label classification is not part of the e2e cases")
        label_list = label_list_of(raw_datasets["train"])
        for split in ("validation", "test"):
            if split in raw_datasets:
                unseen = set(label_list_of(raw_datasets[split])).difference(label_list)
                if unseen:
                    logger.warning(f"labels {unseen} of the {split} split are not in the train split")
                    label_list += list(unseen)
        for label in label_list:
            if label == -1:
                label_list.remove(label)
        label_list.sort()
        num_labels = len(label_list)
        if num_labels <= 1:
            raise ValueError("You need more than one label to do classification.")

    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path,
        num_labels=num_labels,
        finetuning_task="text-classification",
        revision=model_args.model_revision,
        **hub,
    )
    config.problem_type = "regression" if is_regression else "single_label_classification"
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path,
        use_fast=model_args.use_fast_tokenizer,
        revision=model_args.model_revision,
        **hub,
    )
    model = AutoModelForSequenceClassification.from_pretrained(
        model_args.model_name_or_path,
        config=config,
        revision=model_args.model_revision,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
        **hub,
    )

    padding = "max_length" if data_args.pad_to_max_length else False
    if training_args.do_train and not is_regression:
        label_to_id = {v: i for i, v in enumerate(label_list)}
        if model.config.label2id != label_to_id:
            logger.warning("the model's label2id differs from this run's labels (expected when fine-tuning)")
        model.config.label2id = label_to_id
        model.config.id2label = {i: label for label, i in label_to_id.items()}
    elif not is_regression:
        label_to_id = model.config.label2id
    else:
        label_to_id = None

    if data_args.max_seq_length > tokenizer.model_max_length:
        logger.warning(
            f"max_seq_length {data_args.max_seq_length} > model_max_length {tokenizer.model_max_length}: using the latter"
        )
    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)

    def preprocess_function(examples):
        if data_args.text_column_names is not None:
            columns = data_args.text_column_names.split(",")
            examples["sentence"] = list(examples[columns[0]])
            for column in columns[1:]:
                for i in range(len(examples[column])):
                    examples["sentence"][i] += data_args.text_column_delimiter + examples[column][i]
        result = tokenizer(examples["sentence"], padding=padding, max_length=max_seq_length, truncation=True)
        if label_to_id is not None and "label" in examples:
            result["label"] = [(label_to_id[str(label)] if label != -1 else -1) for label in examples["label"]]
        return result

    with training_args.main_process_first(desc="dataset map pre-processing"):
        raw_datasets = raw_datasets.map(
            preprocess_function,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            desc="Running tokenizer on dataset",
        )

    train_dataset = eval_dataset = None
    if training_args.do_train:
        if "train" not in raw_datasets:
            raise ValueError("--do_train requires a train dataset")
        train_dataset = raw_datasets["train"]
        if data_args.shuffle_train_dataset:
            train_dataset = train_dataset.shuffle(seed=data_args.shuffle_seed)
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
        # Upstream logs three random training rows (Python's `random`, which the Trainer
        # seeds again before anything draws from it).
        for index in random.sample(range(len(train_dataset)), 3):
            logger.info(f"Sample {index} of the training set: {train_dataset[index]}.")
    if training_args.do_eval:
        if "validation" not in raw_datasets and "validation_matched" not in raw_datasets:
            raise ValueError("--do_eval requires a validation dataset")
        eval_dataset = raw_datasets["validation"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))

    if training_args.do_predict or data_args.test_file is not None:
        if "test" not in raw_datasets:
            raise ValueError("--do_predict requires a test dataset")
        predict_dataset = raw_datasets["test"]
        if data_args.max_predict_samples is not None:
            predict_dataset = predict_dataset.select(range(min(len(predict_dataset), data_args.max_predict_samples)))

    metric_name = data_args.metric_name or ("mse" if is_regression else "accuracy")
    if metric_name not in ("accuracy", "mse"):
        raise ValueError(f"--metric_name {metric_name}: accuracy or mse")

    def compute_metrics(p: EvalPrediction):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        if is_regression:
            preds = np.squeeze(preds)
        else:
            preds = np.argmax(preds, axis=1)
        if metric_name == "mse":
            result = {"mse": mean_squared_error(preds, p.label_ids)}
        else:
            result = {"accuracy": accuracy(preds, p.label_ids)}
        if len(result) > 1:
            result["combined_score"] = np.mean(list(result.values())).item()
        return result

    if data_args.pad_to_max_length:
        data_collator = default_data_collator
    elif training_args.fp16:
        data_collator = transformers.DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    else:
        data_collator = None

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=data_collator,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        metrics = train_result.metrics
        n = len(train_dataset)
        metrics["train_samples"] = min(data_args.max_train_samples, n) if data_args.max_train_samples else n
        trainer.save_model()
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate(eval_dataset=eval_dataset)
        n = len(eval_dataset)
        metrics["eval_samples"] = min(data_args.max_eval_samples, n) if data_args.max_eval_samples else n
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


    if training_args.do_predict:
        # The label column may hold -1, which the Trainer would not take.
        if "label" in predict_dataset.features:
            predict_dataset = predict_dataset.remove_columns("label")
        predictions = trainer.predict(predict_dataset, metric_key_prefix="predict").predictions
        predictions = np.squeeze(predictions) if is_regression else np.argmax(predictions, axis=1)
        id2label = model.config.id2label
        if trainer.is_world_process_zero():
            with open(os.path.join(training_args.output_dir, "predict_results.txt"), "w") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(predictions):
                    if is_regression:
                        writer.write(f"{index}\t{item:3.3f}\n")
                    else:
                        writer.write(f"{index}\t{id2label[item]}\n")


if __name__ == "__main__":
    main()
