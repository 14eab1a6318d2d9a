"""The upstream side of `cargo xtask e2e`'s run_clm cases: causal-LM fine-tuning with the
steps of transformers' examples/pytorch/language-modeling/run_clm.py, on the pinned
transformers / datasets / torch, with the same flags as the Rust `run_clm` binary.

Usage (one process, or under `python -m torch.distributed.run --nproc_per_node N`):

    python run_clm.py --model_name_or_path M --tokenizer_name T --train_file F.txt \
        --block_size 64 --do_train --do_eval --max_steps 12 --output_dir OUT ...

The steps, in upstream's order:
  1. HfArgumentParser over (ModelArguments, DataTrainingArguments, TrainingArguments): the
     script's dataclasses hold the flags of upstream's (same names, types and defaults);
     the ones only upstream's hub / model-from-scratch paths use are accepted and refused
     when set.
  2. set_seed(training_args.seed).
  3. The raw dataset: `load_dataset(dataset_name, dataset_config_name)` (a hub repository
     or a local folder laid out as one), or the data files through the builder their
     extension names ("txt" -> the "text" builder with keep_linebreaks; "csv", "json",
     "parquet"); without a validation split, `train[:P%]` is the validation split and
     `train[P%:]` the training split (P = validation_split_percentage).
  4. Config, tokenizer (AutoTokenizer of tokenizer_name or the model), model
     (AutoModelForCausalLM, the checkpoint's dtype unless --dtype), embeddings resized when
     the tokenizer is larger.
  5. Tokenization of the "text" column (else the first column) with map(batched=True),
     the raw columns removed; block_size from the flag (capped at model_max_length) or
     min(1024, ...); group_texts with map(batched=True): each batch of 1000 rows
     concatenated and cut into blocks, the remainder dropped, labels = input_ids.
  6. max_train_samples / max_eval_samples; Trainer with default_data_collator,
     preprocess_logits_for_metrics = argmax, compute_metrics = accuracy of the
     predictions shifted against the labels.
  7. train (save_model, train metrics with train_samples, save_state); evaluate (eval
     metrics with eval_samples and perplexity = exp(eval_loss)).

Accuracy is computed with numpy as `evaluate`'s "accuracy" metric computes it
(sklearn's accuracy_score: the mean of predictions == references), without that package.
OMP_NUM_THREADS, when set, also sets torch's intra-op threads (the Rust side follows the
same variable).
"""

import importlib.util
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Optional

import datasets
import numpy as np
import torch
from datasets import load_dataset

import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune (upstream's ModelArguments)."""

    model_name_or_path: Optional[str] = field(default=None, metadata={"help": "The model checkpoint."})
    model_type: Optional[str] = field(default=None, metadata={"help": "Training from scratch: refused here."})
    config_overrides: Optional[str] = field(default=None, metadata={"help": "Training from scratch: refused here."})
    config_name: Optional[str] = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "Tokenizer name or path, if not the model's."})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "Where downloads are stored."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast (tokenizers-backed) tokenizer."})
    model_revision: str = field(default="main", metadata={"help": "Model revision (branch, tag or commit)."})
    token: str = field(default=None, metadata={"help": "Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the hub: refused here."})
    dtype: Optional[str] = field(
        default=None,
        metadata={"help": "dtype to load the model in.", "choices": ["auto", "bfloat16", "float16", "float32"]},
    )


@dataclass
class DataTrainingArguments:
    """Which data, and how it is prepared (upstream's DataTrainingArguments)."""

    dataset_name: Optional[str] = field(default=None, metadata={"help": "Dataset repository or local folder."})
    dataset_config_name: Optional[str] = field(default=None, metadata={"help": "The dataset's configuration."})
    train_file: Optional[str] = field(default=None, metadata={"help": "Training data file (txt, csv, json, parquet)."})
    validation_file: Optional[str] = field(default=None, metadata={"help": "Evaluation data file."})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N training blocks."})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N evaluation blocks."})
    streaming: bool = field(default=False, metadata={"help": "Streaming mode: refused here."})
    block_size: Optional[int] = field(default=None, metadata={"help": "Tokens per block after grouping."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the cached map results."})
    validation_split_percentage: Optional[int] = field(
        default=5, metadata={"help": "Share of the train split held out when there is no validation split."}
    )
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "Processes for map()."})
    keep_linebreaks: bool = field(default=True, metadata={"help": "Keep line breaks in TXT rows."})

    def __post_init__(self):
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("Need either a dataset name or a training/validation file.")
        for f in (self.train_file, self.validation_file):
            if f is not None and f.split(".")[-1] not in ("csv", "json", "txt", "parquet"):
                raise ValueError(f"{f}: expected a csv, json, txt or parquet file")


def refuse_unsupported(model_args, data_args):
    """The flags of upstream's script that this driver does not carry out."""
    if model_args.model_name_or_path is None or model_args.model_type or model_args.config_overrides:
        raise ValueError("training from scratch (--model_type / --config_overrides) is not part of the e2e cases")
    if data_args.streaming:
        raise ValueError("--streaming is not part of the e2e cases")


def raw_datasets_of(model_args, data_args):
    """Step 3: the raw DatasetDict with "train" and "validation" splits."""
    pct = data_args.validation_split_percentage
    if data_args.dataset_name is not None:

        def load(split=None):
            return load_dataset(
                data_args.dataset_name,
                data_args.dataset_config_name,
                split=split,
                cache_dir=model_args.cache_dir,
                token=model_args.token,
            )

        raw = load()
        if "validation" not in raw.keys():
            raw["validation"] = load(f"train[:{pct}%]")
            raw["train"] = load(f"train[{pct}%:]")
        return raw

    data_files = {}
    if data_args.train_file is not None:
        data_files["train"] = data_args.train_file
    if data_args.validation_file is not None:
        data_files["validation"] = data_args.validation_file
    extension = (data_args.train_file or data_args.validation_file).split(".")[-1]
    builder_args = {}
    if extension == "txt":
        extension = "text"
        builder_args["keep_linebreaks"] = data_args.keep_linebreaks

    def load(split=None):
        return load_dataset(
            extension,
            data_files=data_files,
            split=split,
            cache_dir=model_args.cache_dir,
            token=model_args.token,
            **builder_args,
        )

    raw = load()
    if "validation" not in raw.keys():
        raw["validation"] = load(f"train[:{pct}%]")
        raw["train"] = load(f"train[{pct}%:]")
    return raw


def fsdp_on_the_cpu():
    """accelerate turns FSDP on only for accelerator devices: on the CPU its Trainer drops
    the plugin and trains DDP. For `--fsdp` cases this applies accelerate's GPU branch to the
    CPU run (scripts/reference/fsdp_mixed_precision.py's `fsdp_on_the_cpu`), so that the run
    is the FSDP2 run a GPU user gets, computed on CPU gloo."""
    path = Path(__file__).resolve().parents[1] / "reference" / "fsdp_mixed_precision.py"
    spec = importlib.util.spec_from_file_location("fsdp_mixed_precision", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.fsdp_on_the_cpu()
    # `cpu_offload` is FSDP2's CPUOffloadPolicy(pin_memory=True), whose pinned host copies
    # need a CUDA driver; on the CPU the copies stay unpinned (pinning changes no number).
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    refuse_unsupported(model_args, data_args)
    if training_args.fsdp and not torch.cuda.is_available():
        fsdp_on_the_cpu()
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
    logger.warning(
        f"process rank {training_args.process_index}, device {training_args.device}, "
        f"n_gpu {training_args.n_gpu}, distributed {training_args.parallel_mode.value == 'distributed'}"
    )

    # Resuming from an earlier run's last checkpoint, as upstream.
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)

    set_seed(training_args.seed)

    raw_datasets = raw_datasets_of(model_args, data_args)

    hub_kwargs = {"cache_dir": model_args.cache_dir, "revision": model_args.model_revision, "token": model_args.token}
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path,
        use_fast=model_args.use_fast_tokenizer,
        **hub_kwargs,
    )
    dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path, config=config, dtype=dtype, **hub_kwargs
    )
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))

    split = "train" if training_args.do_train else "validation"
    column_names = list(raw_datasets[split].features)
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name])

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized_datasets = raw_datasets.map(
            tokenize_function,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=column_names,
            load_from_cache_file=not data_args.overwrite_cache,
            desc="Running tokenizer on dataset",
        )

    if data_args.block_size is None:
        block_size = tokenizer.model_max_length
        if block_size > config.max_position_embeddings:
            block_size = min(1024, config.max_position_embeddings)
            logger.warning(f"model_max_length {tokenizer.model_max_length} is very large: using block_size {block_size}")
    else:
        if data_args.block_size > tokenizer.model_max_length:
            logger.warning(
                f"block_size {data_args.block_size} > model_max_length {tokenizer.model_max_length}: using the latter"
            )
        block_size = min(data_args.block_size, tokenizer.model_max_length)

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples.keys()}
        total = len(joined[next(iter(examples.keys()))])
        total = (total // block_size) * block_size
        blocks = {k: [t[i : i + block_size] for i in range(0, total, block_size)] for k, t in joined.items()}
        blocks["labels"] = blocks["input_ids"].copy()
        return blocks

    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized_datasets.map(
            group_texts,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            desc=f"Grouping texts in chunks of {block_size}",
        )

    train_dataset = eval_dataset = None
    if training_args.do_train:
        if "train" not in lm_datasets:
            raise ValueError("--do_train requires a train dataset")
        train_dataset = lm_datasets["train"]
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    if training_args.do_eval:
        if "validation" not in lm_datasets:
            raise ValueError("--do_eval requires a validation dataset")
        eval_dataset = lm_datasets["validation"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        # The prediction at position i is for the token at i + 1.
        labels = labels[:, 1:].reshape(-1)
        preds = preds[:, :-1].reshape(-1)
        return {"accuracy": float(np.mean(preds == labels))}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics if training_args.do_eval else None,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        n = len(train_dataset)
        metrics["train_samples"] = min(data_args.max_train_samples, n) if data_args.max_train_samples else n
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate()
        n = len(eval_dataset)
        metrics["eval_samples"] = min(data_args.max_eval_samples, n) if data_args.max_eval_samples else n
        try:
            perplexity = math.exp(metrics["eval_loss"])
        except OverflowError:
            perplexity = float("inf")
        metrics["perplexity"] = perplexity
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
