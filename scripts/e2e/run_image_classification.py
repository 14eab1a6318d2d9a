"""The upstream side of `cargo xtask e2e`'s image-classification case: the steps of transformers'
examples/pytorch/image-classification/run_image_classification.py on the pinned transformers /
datasets / torch / torchvision, with the same flags as the Rust `run_image_classification`
binary.

Usage:

    python run_image_classification.py --model_name_or_path M --dataset_name D \
        --remove_unused_columns False --do_train --do_eval --output_dir OUT ...

The steps, in upstream's order:
  1. HfArgumentParser over (ModelArguments, DataTrainingArguments, TrainingArguments).
  2. set_seed(training_args.seed).
  3. `load_dataset(dataset_name, dataset_config_name)` (a hub repository or a local folder
     laid out as one); the image and label columns checked; without a validation split,
     `train_test_split(train_val_split)` (numpy's generator: not part of the e2e cases).
  4. The labels' names from the `ClassLabel` feature; `label2id` / `id2label`.
  5. The accuracy of `np.argmax(predictions, axis=1)` against the labels (evaluate's
     `accuracy`, sklearn's `accuracy_score`, computed here with numpy).
  6. AutoConfig (num_labels, label2id, id2label, finetuning_task="image-classification"),
     AutoModelForImageClassification (ignore_mismatched_sizes), AutoImageProcessor.
  7. The torchvision transforms: size from the processor (`shortest_edge`, else (height,
     width)), Normalize with its mean / std; train: RandomResizedCrop, RandomHorizontalFlip,
     ToTensor, Normalize; validation: Resize, CenterCrop, ToTensor, Normalize; each image
     `.convert("RGB")`, applied with `set_transform` (at fetch time, on torch's global
     generator); max_train_samples (after `shuffle(seed)`) / max_eval_samples.
  8. Trainer(model, args, train_dataset, eval_dataset, compute_metrics, processing_class =
     image processor, data_collator = the script's collate_fn); train (save_model, metrics,
     save_state); evaluate (metrics).
OMP_NUM_THREADS, when set, also sets torch's intra-op threads.
"""

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import datasets
import numpy as np
import torch
from datasets import load_dataset
from torchvision.transforms import (
    CenterCrop, Compose, Lambda, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize, ToTensor,
)

import transformers
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageClassification,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    dataset_name: Optional[str] = field(default=None)
    dataset_config_name: Optional[str] = field(default=None)
    image_column_name: str = field(default="image")
    label_column_name: str = field(default="label")
    train_dir: Optional[str] = field(default=None)
    validation_dir: Optional[str] = field(default=None)
    train_val_split: Optional[float] = field(default=0.15)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)

    def __post_init__(self):
        if self.dataset_name is None and (self.train_dir is None and self.validation_dir is None):
            raise ValueError(
                "You must specify either a dataset name from the hub or a train and/or validation directory."
            )


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="google/vit-base-patch16-224-in21k")
    model_type: Optional[str] = field(default=None)
    config_name: Optional[str] = field(default=None)
    cache_dir: Optional[str] = field(default=None)
    model_revision: str = field(default="main")
    image_processor_name: str = field(default=None)
    token: str = field(default=None)
    trust_remote_code: bool = field(default=False)
    ignore_mismatched_sizes: bool = field(default=False)


def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    labels = torch.tensor([example["labels"] for example in examples])
    return {"pixel_values": pixel_values, "labels": labels}


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
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

    if data_args.dataset_name is not None:
        dataset = load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, cache_dir=model_args.cache_dir,
            token=model_args.token,
        )
    else:
        raise ValueError("image folders are not part of the e2e cases")

    dataset_column_names = dataset["train"].column_names if "train" in dataset else dataset["validation"].column_names
    if data_args.image_column_name not in dataset_column_names:
        raise ValueError(f"--image_column_name {data_args.image_column_name} not found in dataset")
    if data_args.label_column_name not in dataset_column_names:
        raise ValueError(f"--label_column_name {data_args.label_column_name} not found in dataset")

    def collate(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        labels = torch.tensor([example[data_args.label_column_name] for example in examples])
        return {"pixel_values": pixel_values, "labels": labels}

    data_args.train_val_split = None if "validation" in dataset else data_args.train_val_split
    if isinstance(data_args.train_val_split, float) and data_args.train_val_split > 0.0:
        split = dataset["train"].train_test_split(data_args.train_val_split)
        dataset["train"] = split["train"]
        dataset["validation"] = split["test"]

    labels = dataset["train"].features[data_args.label_column_name].names
    label2id, id2label = {}, {}
    for i, label in enumerate(labels):
        label2id[label] = str(i)
        id2label[str(i)] = label

    def compute_metrics(p):
        predictions = np.argmax(p.predictions, axis=1)
        return {"accuracy": float((predictions == p.label_ids).mean())}

    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path,
        num_labels=len(labels), label2id=label2id, id2label=id2label, finetuning_task="image-classification",
        cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token,
    )
    model = AutoModelForImageClassification.from_pretrained(
        model_args.model_name_or_path, config=config, cache_dir=model_args.cache_dir,
        revision=model_args.model_revision, token=model_args.token,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
    )
    image_processor = AutoImageProcessor.from_pretrained(
        model_args.image_processor_name or model_args.model_name_or_path,
        cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token,
    )

    if "shortest_edge" in image_processor.size:
        size = image_processor.size["shortest_edge"]
    else:
        size = (image_processor.size["height"], image_processor.size["width"])
    normalize = (
        Normalize(mean=image_processor.image_mean, std=image_processor.image_std)
        if hasattr(image_processor, "image_mean") and hasattr(image_processor, "image_std")
        else Lambda(lambda x: x)
    )
    _train_transforms = Compose([RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(), normalize])
    _val_transforms = Compose([Resize(size), CenterCrop(size), ToTensor(), normalize])

    def train_transforms(example_batch):
        example_batch["pixel_values"] = [
            _train_transforms(pil_img.convert("RGB")) for pil_img in example_batch[data_args.image_column_name]
        ]
        return example_batch

    def val_transforms(example_batch):
        example_batch["pixel_values"] = [
            _val_transforms(pil_img.convert("RGB")) for pil_img in example_batch[data_args.image_column_name]
        ]
        return example_batch

    if training_args.do_train:
        if data_args.max_train_samples is not None:
            dataset["train"] = (
                dataset["train"].shuffle(seed=training_args.seed).select(range(data_args.max_train_samples))
            )
        dataset["train"].set_transform(train_transforms)

    if training_args.do_eval:
        if data_args.max_eval_samples is not None:
            dataset["validation"] = (
                dataset["validation"].shuffle(seed=training_args.seed).select(range(data_args.max_eval_samples))
            )
        dataset["validation"].set_transform(val_transforms)

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=dataset["train"] if training_args.do_train else None,
        eval_dataset=dataset["validation"] if training_args.do_eval else None,
        compute_metrics=compute_metrics,
        processing_class=image_processor,
        data_collator=collate,
    )

    if training_args.do_train:
        checkpoint = None
        if training_args.resume_from_checkpoint is not None:
            checkpoint = training_args.resume_from_checkpoint
        elif last_checkpoint is not None:
            checkpoint = last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", train_result.metrics)
        trainer.save_metrics("train", train_result.metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
