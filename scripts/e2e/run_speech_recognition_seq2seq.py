"""The upstream side of `cargo xtask e2e`'s speech-recognition case: Whisper fine-tuning with the
steps of transformers' examples/pytorch/speech-recognition/run_speech_recognition_seq2seq.py
(its current form: `language` / `task`, `freeze_encoder`, the deprecated `forced_decoder_ids` /
`suppress_tokens`, `apply_spec_augment`), on the pinned transformers / datasets / torch, with
the same flags as the Rust `run_speech_recognition_seq2seq` binary.

Usage:

    python run_speech_recognition_seq2seq.py --model_name_or_path M --dataset_name D \
        --text_column_name sentence --language en --freeze_feature_encoder False \
        --do_train --do_eval --predict_with_generate --output_dir OUT ...

The steps, in upstream's order:
  1. HfArgumentParser over (ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments).
  2. set_seed(training_args.seed).
  3. `load_dataset(dataset_name, dataset_config_name, split=...)` for train (train_split_name)
     and eval (eval_split_name); the audio and text columns checked.
  4. AutoConfig (updated with forced_decoder_ids, suppress_tokens, Whisper's
     apply_spec_augment, use_cache=False with gradient checkpointing), AutoFeatureExtractor,
     AutoTokenizer, AutoModelForSpeechSeq2Seq; freeze_feature_encoder / freeze_encoder; the
     generation config's forced_decoder_ids / suppress_tokens; on a multilingual checkpoint the
     tokenizer's prefix tokens and the generation config's language and task.
  5. The audio column cast to the feature extractor's sampling rate when it differs;
     max_train_samples / max_eval_samples; prepare_dataset with map (input_features,
     input_length, the lower-cased text's ids as labels), the columns removed; the clips kept
     when min < length < max duration.
  6. The word error rate as `evaluate.load("wer")` computes it (its wer.py over jiwer's
     `process_words`, each pair's errors summed over the references' words summed), without
     that package (it would download the metric's script).
  7. Feature extractor, tokenizer and config saved in output_dir, AutoProcessor from there,
     DataCollatorSpeechSeq2SeqWithPadding, Seq2SeqTrainer (processing_class the feature
     extractor, compute_metrics with predict_with_generate).
  8. train (save_model, train metrics with train_samples, save_state); evaluate with
     max_length=generation_max_length, num_beams=generation_num_beams (eval metrics with
     eval_samples).
OMP_NUM_THREADS, when set, also sets torch's intra-op threads.
"""

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import datasets
import jiwer
import torch
from datasets import DatasetDict, load_dataset

import transformers
from transformers import (
    AutoConfig,
    AutoFeatureExtractor,
    AutoModelForSpeechSeq2Seq,
    AutoProcessor,
    AutoTokenizer,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint, is_main_process

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Path to pretrained model or model identifier"})
    config_name: Optional[str] = field(default=None)
    tokenizer_name: Optional[str] = field(default=None)
    feature_extractor_name: Optional[str] = field(default=None)
    cache_dir: Optional[str] = field(default=None)
    use_fast_tokenizer: bool = field(default=True)
    model_revision: str = field(default="main")
    token: Optional[str] = field(default=None)
    trust_remote_code: bool = field(default=False)
    freeze_feature_encoder: bool = field(default=True)
    freeze_encoder: bool = field(default=False)
    forced_decoder_ids: Optional[str] = field(default=None, metadata={"help": "a JSON list (deprecated)"})
    suppress_tokens: Optional[str] = field(default=None, metadata={"help": "a JSON list (deprecated)"})
    apply_spec_augment: bool = field(default=False)


@dataclass
class DataTrainingArguments:
    dataset_name: str = field(default=None)
    dataset_config_name: Optional[str] = field(default=None)
    text_column: Optional[str] = field(default=None)
    overwrite_cache: bool = field(default=False)
    preprocessing_num_workers: Optional[int] = field(default=None)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)
    audio_column_name: str = field(default="audio")
    text_column_name: str = field(default="text")
    max_duration_in_seconds: float = field(default=20.0)
    min_duration_in_seconds: float = field(default=0.0)
    preprocessing_only: bool = field(default=False)
    train_split_name: str = field(default="train")
    eval_split_name: str = field(default="test")
    do_lower_case: bool = field(default=True)
    language: str = field(default=None)
    task: str = field(default="transcribe")


@dataclass
class DataCollatorSpeechSeq2SeqWithPadding:
    processor: Any
    decoder_start_token_id: int
    forward_attention_mask: bool

    def __call__(self, features: list[dict[str, Union[list[int], torch.Tensor]]]) -> dict[str, torch.Tensor]:
        model_input_name = self.processor.model_input_names[0]
        input_features = [{model_input_name: feature[model_input_name]} for feature in features]
        label_features = [{"input_ids": feature["labels"]} for feature in features]

        batch = self.processor.feature_extractor.pad(input_features, return_tensors="pt")

        if self.forward_attention_mask:
            batch["attention_mask"] = torch.LongTensor([feature["attention_mask"] for feature in features])

        labels_batch = self.processor.tokenizer.pad(label_features, return_tensors="pt")

        labels = labels_batch["input_ids"].masked_fill(labels_batch.attention_mask.ne(1), -100)

        if (labels[:, 0] == self.decoder_start_token_id).all().cpu().item():
            labels = labels[:, 1:]

        batch["labels"] = labels

        return batch


def wer(predictions, references):
    """evaluate's wer.py (`concatenate_texts=False`) over jiwer 4's `process_words`."""
    incorrect = 0
    total = 0
    for prediction, reference in zip(predictions, references):
        measures = jiwer.process_words(reference, prediction)
        incorrect += measures.substitutions + measures.deletions + measures.insertions
        total += measures.substitutions + measures.deletions + measures.hits
    return incorrect / total


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    import json

    forced_decoder_ids = json.loads(model_args.forced_decoder_ids) if model_args.forced_decoder_ids else None
    suppress_tokens = json.loads(model_args.suppress_tokens) if model_args.suppress_tokens else None

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

    raw_datasets = DatasetDict()
    if training_args.do_train:
        raw_datasets["train"] = load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, split=data_args.train_split_name,
            cache_dir=model_args.cache_dir, token=model_args.token,
        )
    if training_args.do_eval:
        raw_datasets["eval"] = load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, split=data_args.eval_split_name,
            cache_dir=model_args.cache_dir, token=model_args.token,
        )
    columns = next(iter(raw_datasets.values())).column_names
    if data_args.audio_column_name not in columns:
        raise ValueError(f"--audio_column_name '{data_args.audio_column_name}' not found in dataset")
    if data_args.text_column_name not in columns:
        raise ValueError(f"--text_column_name {data_args.text_column_name} not found in dataset")

    config = AutoConfig.from_pretrained(
        model_args.config_name if model_args.config_name else model_args.model_name_or_path,
        cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token,
    )
    config.update({"forced_decoder_ids": forced_decoder_ids, "suppress_tokens": suppress_tokens})
    if training_args.gradient_checkpointing:
        config.update({"use_cache": False})
    if getattr(config, "model_type", None) == "whisper":
        config.update({"apply_spec_augment": model_args.apply_spec_augment})

    feature_extractor = AutoFeatureExtractor.from_pretrained(
        model_args.feature_extractor_name if model_args.feature_extractor_name else model_args.model_name_or_path,
        cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name if model_args.tokenizer_name else model_args.model_name_or_path,
        cache_dir=model_args.cache_dir, use_fast=model_args.use_fast_tokenizer,
        revision=model_args.model_revision, token=model_args.token,
    )
    model = AutoModelForSpeechSeq2Seq.from_pretrained(
        model_args.model_name_or_path, config=config, cache_dir=model_args.cache_dir,
        revision=model_args.model_revision, token=model_args.token,
    )

    if model.config.decoder_start_token_id is None:
        raise ValueError("Make sure that `config.decoder_start_token_id` is correctly defined")

    if model_args.freeze_feature_encoder:
        model.freeze_feature_encoder()

    if model_args.freeze_encoder:
        model.freeze_encoder()
        model.model.encoder.gradient_checkpointing = False

    if hasattr(model.generation_config, "is_multilingual") and model.generation_config.is_multilingual:
        # We only need to set the language and task ids in a multilingual setting
        tokenizer.set_prefix_tokens(language=data_args.language, task=data_args.task)
        model.generation_config.language = data_args.language
        model.generation_config.task = data_args.task
    elif data_args.language is not None:
        raise ValueError(
            "Setting language token for an English-only checkpoint is not permitted. The language argument should "
            "only be set for multilingual checkpoints."
        )

    if forced_decoder_ids is not None:
        logger.warning("The use of `forced_decoder_ids` is deprecated.")
        model.generation_config.forced_decoder_ids = forced_decoder_ids
    else:
        model.generation_config.forced_decoder_ids = None
        model.config.forced_decoder_ids = None

    if suppress_tokens is not None:
        logger.warning("The use of `suppress_tokens` is deprecated.")
        model.generation_config.suppress_tokens = suppress_tokens

    dataset_sampling_rate = next(iter(raw_datasets.values())).features[data_args.audio_column_name].sampling_rate
    if dataset_sampling_rate != feature_extractor.sampling_rate:
        raw_datasets = raw_datasets.cast_column(
            data_args.audio_column_name, datasets.features.Audio(sampling_rate=feature_extractor.sampling_rate)
        )

    max_input_length = data_args.max_duration_in_seconds * feature_extractor.sampling_rate
    min_input_length = data_args.min_duration_in_seconds * feature_extractor.sampling_rate
    audio_column_name = data_args.audio_column_name
    text_column_name = data_args.text_column_name
    model_input_name = feature_extractor.model_input_names[0]
    do_lower_case = data_args.do_lower_case
    forward_attention_mask = (
        getattr(config, "model_type", None) == "whisper"
        and getattr(config, "apply_spec_augment", False)
        and getattr(config, "mask_time_prob", 0) > 0
    )

    if data_args.max_train_samples is not None:
        raw_datasets["train"] = raw_datasets["train"].select(range(data_args.max_train_samples))
    if data_args.max_eval_samples is not None:
        raw_datasets["eval"] = raw_datasets["eval"].select(range(data_args.max_eval_samples))

    def prepare_dataset(batch):
        sample = batch[audio_column_name]
        inputs = feature_extractor(
            sample["array"], sampling_rate=sample["sampling_rate"], return_attention_mask=forward_attention_mask
        )
        batch[model_input_name] = inputs.get(model_input_name)[0]
        batch["input_length"] = len(sample["array"])
        if forward_attention_mask:
            batch["attention_mask"] = inputs.get("attention_mask")[0]
        input_str = batch[text_column_name].lower() if do_lower_case else batch[text_column_name]
        batch["labels"] = tokenizer(input_str).input_ids
        return batch

    with training_args.main_process_first(desc="dataset map pre-processing"):
        vectorized_datasets = raw_datasets.map(
            prepare_dataset,
            remove_columns=next(iter(raw_datasets.values())).column_names,
            num_proc=data_args.preprocessing_num_workers,
            desc="preprocess train dataset",
        )

    def is_audio_in_length_range(length):
        return length > min_input_length and length < max_input_length

    vectorized_datasets = vectorized_datasets.filter(
        is_audio_in_length_range,
        num_proc=data_args.preprocessing_num_workers,
        input_columns=["input_length"],
    )

    def compute_metrics(pred):
        pred_ids = pred.predictions
        pred.label_ids[pred.label_ids == -100] = tokenizer.pad_token_id
        pred_str = tokenizer.batch_decode(pred_ids, skip_special_tokens=True)
        label_str = tokenizer.batch_decode(pred.label_ids, skip_special_tokens=True)
        return {"wer": wer(predictions=pred_str, references=label_str)}

    with training_args.main_process_first():
        if is_main_process(training_args.local_rank):
            feature_extractor.save_pretrained(training_args.output_dir)
            tokenizer.save_pretrained(training_args.output_dir)
            config.save_pretrained(training_args.output_dir)

    processor = AutoProcessor.from_pretrained(training_args.output_dir)

    data_collator = DataCollatorSpeechSeq2SeqWithPadding(
        processor=processor,
        decoder_start_token_id=model.config.decoder_start_token_id,
        forward_attention_mask=forward_attention_mask,
    )

    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=vectorized_datasets["train"] if training_args.do_train else None,
        eval_dataset=vectorized_datasets["eval"] if training_args.do_eval else None,
        processing_class=feature_extractor,
        data_collator=data_collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )

    if training_args.do_train:
        checkpoint = None
        if training_args.resume_from_checkpoint is not None:
            checkpoint = training_args.resume_from_checkpoint
        elif last_checkpoint is not None:
            checkpoint = last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        max_train_samples = (
            data_args.max_train_samples
            if data_args.max_train_samples is not None
            else len(vectorized_datasets["train"])
        )
        metrics["train_samples"] = min(max_train_samples, len(vectorized_datasets["train"]))
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(
            metric_key_prefix="eval",
            max_length=training_args.generation_max_length,
            num_beams=training_args.generation_num_beams,
        )
        max_eval_samples = (
            data_args.max_eval_samples if data_args.max_eval_samples is not None else len(vectorized_datasets["eval"])
        )
        metrics["eval_samples"] = min(max_eval_samples, len(vectorized_datasets["eval"]))
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
