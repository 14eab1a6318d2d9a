"""Reference for training-args/tests/parity.rs: TrainingArguments and HfArgumentParser of the
pinned transformers.

Writes OUT_DIR/training_args.json with:
  defaults          TrainingArguments(output_dir="out").to_dict() and .to_json_string()
  combos            keyword combinations -> to_dict() or the error upstream raises (accepted/rejected)
  warmup            get_warmup_steps(n) for several warmup_steps
  cli               HfArgumentParser command lines -> to_dict() or the parser's error
  env_dependent     fields whose upstream value depends on the machine or environment, and why
  seq2seq           the same for Seq2SeqTrainingArguments (training_args_seq2seq.py): defaults
                    (to_dict, to_json_string, field_order, to_sanitized_dict), `set` (all five
                    fields set), combos, `generation_config_object` (to_dict with a
                    GenerationConfig object) and cli (HfArgumentParser(Seq2SeqTrainingArguments))
Also OUT_DIR/fsdp_config.json, a file the `--fsdp_config FILE` cases read; "{REF}" in any
argument stands for OUT_DIR (the Rust test substitutes its own path).

Usage: python training_args.py OUT_DIR
"""

import json
import os
import sys
import warnings
from pathlib import Path

os.environ.pop("TRANSFORMERS_VERBOSITY", None)
for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
    os.environ.pop(var, None)

import transformers  # noqa: E402
from transformers import GenerationConfig, HfArgumentParser, Seq2SeqTrainingArguments, TrainingArguments  # noqa: E402
from transformers.debug_utils import DebugOption  # noqa: E402
from transformers.trainer_utils import FSDPOption, HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType  # noqa: E402
from transformers.training_args import OptimizerNames, ParallelMode  # noqa: E402

OUT = Path(sys.argv[1])
REF = str(OUT)
(OUT / "fsdp_config.json").write_text(
    json.dumps({"fsdp_transformer_layer_cls_to_wrap": "GPT2Block", "fsdp_min_num_params": 0, "version": 2})
)


def subst(x):
    if isinstance(x, str):
        return x.replace("{REF}", REF)
    if isinstance(x, list):
        return [subst(v) for v in x]
    if isinstance(x, dict):
        return {k: subst(v) for k, v in x.items()}
    return x


def unsubst(x):
    """Machine paths in results go back to the {REF} placeholder."""
    if isinstance(x, str):
        return x.replace(REF, "{REF}")
    if isinstance(x, list):
        return [unsubst(v) for v in x]
    if isinstance(x, dict):
        return {k: unsubst(v) for k, v in x.items()}
    return x


def build(kwargs, cls=TrainingArguments):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            args = cls(**subst(kwargs))
        except Exception as e:  # noqa: BLE001 - record whatever upstream raises
            return {"ok": False, "error_type": type(e).__name__, "error": str(e)}
    deprecations = sorted({str(w.message) for w in caught if issubclass(w.category, FutureWarning)})
    return {"ok": True, "to_dict": unsubst(json.loads(args.to_json_string())), "future_warnings": deprecations}


# Each combo: name, kwargs, the field the check is about (for rejected ones), and
# tchtrain_rejects when tchtrain deliberately rejects what upstream accepts.
COMBOS = [
    dict(name="eval_steps_from_logging_steps", kwargs=dict(eval_strategy="steps", logging_steps=50)),
    dict(name="eval_steps_zero_falls_back", kwargs=dict(eval_strategy="steps", eval_steps=0, logging_steps=20)),
    dict(name="eval_steps_need_logging_steps", kwargs=dict(eval_strategy="steps", logging_steps=0), field="eval_strategy"),
    dict(name="logging_steps_zero", kwargs=dict(logging_steps=0), field="logging_strategy"),
    dict(name="logging_steps_zero_epoch", kwargs=dict(logging_strategy="epoch", logging_steps=0)),
    dict(name="logging_steps_fraction_above_one", kwargs=dict(logging_steps=10.5), field="logging_steps"),
    dict(name="logging_steps_ratio", kwargs=dict(logging_steps=0.1)),
    dict(name="save_steps_fraction_above_one", kwargs=dict(save_steps=100.5), field="save_steps"),
    dict(name="save_steps_fraction_epoch", kwargs=dict(save_strategy="epoch", save_steps=100.5)),
    dict(name="eval_steps_fraction_above_one", kwargs=dict(eval_strategy="steps", eval_steps=10.5), field="eval_steps"),
    dict(name="load_best_no_eval", kwargs=dict(load_best_model_at_end=True), field="load_best_model_at_end"),
    dict(name="load_best_not_multiple", kwargs=dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=100, save_steps=250), field="save_steps"),
    dict(name="load_best_multiple", kwargs=dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=100, save_steps=300)),
    dict(name="load_best_mixed_ratio", kwargs=dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=100), field="save_steps"),
    dict(name="load_best_ratios_multiple", kwargs=dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.3)),
    dict(name="load_best_ratios_not_multiple", kwargs=dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.2, save_steps=0.3), field="save_steps"),
    dict(name="load_best_epoch", kwargs=dict(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch")),
    dict(name="load_best_save_best", kwargs=dict(load_best_model_at_end=True, eval_strategy="steps", save_strategy="best")),
    dict(name="load_best_steps_vs_epoch", kwargs=dict(load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch"), field="load_best_model_at_end"),
    dict(name="fp16_and_bf16", kwargs=dict(fp16=True, bf16=True, use_cpu=True), field="fp16"),
    dict(name="full_eval_both", kwargs=dict(fp16_full_eval=True, bf16_full_eval=True, use_cpu=True), field="fp16_full_eval"),
    dict(name="bf16_cpu", kwargs=dict(bf16=True, use_cpu=True)),
    dict(name="plateau_without_eval", kwargs=dict(lr_scheduler_type="reduce_lr_on_plateau"), field="lr_scheduler_type"),
    dict(name="plateau_with_eval", kwargs=dict(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch")),
    dict(name="greedy_without_eval", kwargs=dict(lr_scheduler_type="greedy"), field="lr_scheduler_type"),
    dict(name="greedy_with_eval", kwargs=dict(lr_scheduler_type="greedy", eval_strategy="steps", eval_steps=10)),
    dict(name="warmup_negative", kwargs=dict(warmup_steps=-1), field="warmup_steps"),
    dict(name="warmup_ratio_value", kwargs=dict(warmup_steps=0.1)),
    dict(name="warmup_steps_value", kwargs=dict(warmup_steps=100)),
    dict(name="prefetch_without_workers", kwargs=dict(dataloader_prefetch_factor=2), field="dataloader_prefetch_factor"),
    dict(name="prefetch_with_workers", kwargs=dict(dataloader_prefetch_factor=2, dataloader_num_workers=2)),
    dict(name="empty_cache_zero", kwargs=dict(torch_empty_cache_steps=0), field="torch_empty_cache_steps"),
    dict(name="empty_cache_positive", kwargs=dict(torch_empty_cache_steps=10)),
    dict(name="metric_accuracy", kwargs=dict(metric_for_best_model="accuracy")),
    dict(name="metric_eval_loss", kwargs=dict(metric_for_best_model="eval_loss")),
    dict(name="metric_explicit_direction", kwargs=dict(metric_for_best_model="eval_loss", greater_is_better=True)),
    dict(name="report_to_string", kwargs=dict(report_to="tensorboard")),
    dict(name="report_to_list", kwargs=dict(report_to=["tensorboard", "wandb"])),
    dict(name="report_to_none", kwargs=dict(report_to="none")),
    dict(name="tokens_seen_true", kwargs=dict(include_num_input_tokens_seen=True)),
    dict(name="tokens_seen_false", kwargs=dict(include_num_input_tokens_seen=False)),
    dict(name="tokens_seen_non_padding", kwargs=dict(include_num_input_tokens_seen="non_padding")),
    dict(name="debug_string", kwargs=dict(debug="underflow_overflow")),
    dict(name="debug_bad", kwargs=dict(debug="underflow"), field="debug"),
    dict(name="torch_compile_mode", kwargs=dict(torch_compile_mode="max-autotune")),
    dict(name="torch_compile_plain", kwargs=dict(torch_compile=True)),
    dict(name="use_cpu_pin_memory", kwargs=dict(use_cpu=True)),
    dict(name="gradient_checkpointing_alias", kwargs=dict(gradient_checkpointing=True)),
    dict(name="gradient_checkpointing_kwargs_alias", kwargs=dict(gradient_checkpointing_kwargs={"use_reentrant": False})),
    dict(name="activation_checkpointing", kwargs=dict(activation_checkpointing=True, activation_checkpointing_kwargs={"every_n_layers": 2})),
    dict(name="scheduler_kwargs_string", kwargs=dict(lr_scheduler_kwargs='{"num_cycles": "2", "flag": "true", "power": "1.5", "name": "x"}')),
    dict(name="scheduler_kwargs_dict", kwargs=dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 1e-6})),
    dict(name="fsdp_true", kwargs=dict(fsdp=True)),
    dict(name="fsdp_legacy_string", kwargs=dict(fsdp="full_shard offload auto_wrap")),
    dict(name="fsdp_legacy_shard_grad_op", kwargs=dict(fsdp="shard_grad_op")),
    dict(name="fsdp_legacy_list", kwargs=dict(fsdp=["full_shard", "offload"])),
    dict(name="fsdp_hybrid_v2", kwargs=dict(fsdp="hybrid_shard"), field="fsdp"),
    dict(name="fsdp_hybrid_v1", kwargs=dict(fsdp="hybrid_shard", fsdp_config={"version": 1})),
    dict(name="fsdp_unknown_option", kwargs=dict(fsdp="full_shard bogus"), field="fsdp"),
    dict(name="fsdp_config_prefixed", kwargs=dict(fsdp=True, fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "fsdp_cpu_offload": True})),
    dict(name="fsdp_config_file", kwargs=dict(fsdp=True, fsdp_config="{REF}/fsdp_config.json")),
    dict(name="fsdp_config_file_without_fsdp", kwargs=dict(fsdp_config="{REF}/fsdp_config.json")),
    dict(name="fsdp_config_json_string", kwargs=dict(fsdp=True, fsdp_config='{"min_num_params": "1000", "auto_wrap_policy": "SIZE_BASED_WRAP"}')),
    dict(name="fsdp_bad_wrap_policy", kwargs=dict(fsdp=True, fsdp_config={"auto_wrap_policy": "EVERYTHING"}), field="fsdp_config.auto_wrap_policy"),
    dict(name="fsdp_xla", kwargs=dict(fsdp=True, fsdp_config={"xla": True, "auto_wrap_policy": "EVERYTHING"})),
    dict(name="accelerator_config_dict", kwargs=dict(accelerator_config={"split_batches": True, "even_batches": False})),
    dict(name="accelerator_config_string", kwargs=dict(accelerator_config='{"dispatch_batches": "true"}')),
    dict(name="hub_token_masked", kwargs=dict(hub_token="secret", push_to_hub=False, hub_model_id="me/model")),
    dict(name="eval_epoch_sets_do_eval", kwargs=dict(eval_strategy="epoch")),
    dict(name="output_dir_default", kwargs=dict(output_dir=None)),
    dict(name="scheduler_bad_name", kwargs=dict(lr_scheduler_type="cosin"), field="lr_scheduler_type"),
    dict(name="optim_bad_name", kwargs=dict(optim="adamw"), field="optim"),
    dict(name="optim_unimplemented_parses", kwargs=dict(optim="lion_32bit")),
    dict(name="every_scheduler", kwargs=dict(lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs={"num_decay_steps": 10})),
    dict(name="hub_strategy_bad", kwargs=dict(hub_strategy="sometimes"), field="hub_strategy"),
    dict(name="save_best_without_load_best", kwargs=dict(save_strategy="best", metric_for_best_model="accuracy")),
    dict(name="many_fields", kwargs=dict(
        per_device_train_batch_size=16, per_device_eval_batch_size=32, num_train_epochs=1.5, max_steps=1000,
        learning_rate=3e-4, weight_decay=0.01, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6,
        gradient_accumulation_steps=4, max_grad_norm=0.5, label_smoothing_factor=0.1, seed=7, data_seed=11,
        logging_first_step=True, save_total_limit=2, label_names=["labels"], include_for_metrics=["inputs", "loss"],
        train_sampling_strategy="group_by_length", run_name="run", optim_target_modules=["q_proj", "v_proj"],
        ddp_timeout=60, neftune_noise_alpha=5.0, trackio_static_space_id=False,
        eval_delay=2, log_level="info", optim_args="a=1")),
    # tchtrain rejects these at construction; upstream accepts them and fails (or misbehaves) later.
    dict(name="negative_logging_steps", kwargs=dict(logging_steps=-5), field="logging_steps", tchtrain_rejects=True),
    dict(name="negative_save_steps", kwargs=dict(save_steps=-1), field="save_steps", tchtrain_rejects=True),
    dict(name="zero_batch_size", kwargs=dict(per_device_train_batch_size=0), field="per_device_train_batch_size", tchtrain_rejects=True),
    dict(name="zero_accumulation", kwargs=dict(gradient_accumulation_steps=0), field="gradient_accumulation_steps", tchtrain_rejects=True),
    dict(name="negative_batch_size", kwargs=dict(per_device_eval_batch_size=-1), field="per_device_eval_batch_size", tchtrain_rejects=True),
]

combos = []
for c in COMBOS:
    kwargs = dict(c["kwargs"])
    kwargs.setdefault("output_dir", "out")
    res = build(kwargs)
    entry = {"name": c["name"], "kwargs": kwargs, "field": c.get("field"), "tchtrain_rejects": c.get("tchtrain_rejects", False)}
    entry.update(res)
    combos.append(entry)

warmup = []
for ws, n in [(0, 100), (0.1, 100), (0.1, 7), (5, 100), (1.5, 100), (0.999, 10), (1, 3), (0.5, 0), (0.25, 10), (100, 10)]:
    a = TrainingArguments(output_dir="out", warmup_steps=ws)
    warmup.append({"warmup_steps": ws, "num_training_steps": n, "result": a.get_warmup_steps(n)})


class ParserError(Exception):
    pass


def to_json(args):
    """to_json_string's content; a `pathlib.Path` (Seq2Seq's --generation_config) as its string,
    where upstream's own to_json_string raises TypeError."""
    return json.loads(json.dumps(args.to_dict(), default=str))


def parse(argv, cls=TrainingArguments):
    p = HfArgumentParser(cls)

    def error(message):
        raise ParserError(message)

    p.error = error
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            (args,) = p.parse_args_into_dataclasses(subst(argv), look_for_args_file=False)
        except SystemExit as e:  # --help
            return {"ok": False, "error_type": "SystemExit", "error": str(e.code)}
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "error_type": type(e).__name__, "error": str(e)}
    deprecations = sorted({str(w.message) for w in caught if issubclass(w.category, FutureWarning)})
    return {"ok": True, "to_dict": unsubst(to_json(args)), "future_warnings": deprecations}


O = ["--output_dir", "out"]
# Each case: argv; v5_argv when argv uses a v4 alias upstream 5.23 no longer knows (the
# reference result is then upstream's result for v5_argv, and the Rust side must warn).
CLI = [
    dict(argv=O + ["--per_device_train_batch_size", "8"]),
    dict(argv=O + ["--bf16", "--use_cpu"]),
    dict(argv=O + ["--bf16", "false"]),
    dict(argv=O + ["--bf16=false"]),
    dict(argv=O + ["--use_cpu", "--bf16", "YES"]),
    dict(argv=O + ["--bf16", "maybe"]),
    dict(argv=O + ["--no_dataloader_pin_memory"]),
    dict(argv=O + ["--no-remove-unused-columns"]),
    dict(argv=O + ["--no_dataloader_pin_memory=1"]),
    dict(argv=O + ["--dataloader_pin_memory", "false"]),
    dict(argv=O + ["--report_to", "tensorboard"]),
    dict(argv=O + ["--report_to", "tensorboard", "jsonl"]),
    dict(argv=O + ["--report_to", "none"]),
    dict(argv=O + ["--lr_scheduler_kwargs", '{"num_cycles": 2, "x": "3"}']),
    dict(argv=O + ["--fsdp_config", "{REF}/fsdp_config.json", "--fsdp"]),
    dict(argv=O + ["--fsdp", "full_shard auto_wrap"]),
    dict(argv=O + ["--fsdp", "full_shard", "auto_wrap"]),
    dict(argv=O + ["--per-device-train-batch-size", "4", "--learning_rate", "3e-4", "--max_steps", "-1"]),
    dict(argv=O + ["--per_device_train", "4"]),
    dict(argv=O + ["--learning", "1e-4"]),
    dict(argv=O + ["--learning_rate", "-1e-5"]),
    dict(argv=O + ["--learning_rate", "-.5"]),
    dict(argv=O + ["--lr_scheduler_type", "cosin"]),
    dict(argv=O + ["--lr_scheduler_type", "cosine_with_restarts", "--warmup_steps", "0.05"]),
    dict(argv=O + ["--optim", "adamw_torch", "--weight_decay", "0.01"]),
    dict(argv=O + ["--optim", "lion_32bit"]),
    dict(argv=O + ["--optim", "adamw"]),
    dict(argv=O + ["--per_device_train_batch_size", "x"]),
    dict(argv=O + ["--per_device_train_batch_size", "2.5"]),
    dict(argv=O + ["--max_stepz", "10"]),
    dict(argv=O + ["--max_steps"]),
    dict(argv=O + ["positional"]),
    dict(argv=O + ["--eval_strategy", "steps", "--eval_steps", "100", "--save_steps", "300", "--load_best_model_at_end"]),
    dict(argv=O + ["--eval_strategy", "steps", "--eval_steps", "100", "--save_steps", "250", "--load_best_model_at_end"]),
    dict(argv=O + ["--eval_strategy", "epoch", "--save_strategy", "epoch", "--load_best_model_at_end", "--metric_for_best_model", "accuracy"]),
    dict(argv=O + ["--debug", "underflow_overflow"]),
    dict(argv=O + ["--debug", "overflow"]),
    dict(argv=O + ["--label_names", "labels", "start_positions"]),
    dict(argv=O + ["--label_names"]),
    dict(argv=O + ["--include_for_metrics", "inputs", "loss", "--do_train"]),
    dict(argv=O + ["--include_num_input_tokens_seen"]),
    dict(argv=O + ["--include_num_input_tokens_seen", "non_padding"]),
    dict(argv=O + ["--tf32"]),
    dict(argv=O + ["--tf32", "false"]),
    dict(argv=O + ["--greater_is_better", "false", "--metric_for_best_model", "f1"]),
    dict(argv=O + ["--activation_checkpointing"]),
    dict(argv=O + ["--gradient_checkpointing"]),
    dict(argv=O + ["--gradient_checkpointing", "--activation_checkpointing", "false"]),
    dict(argv=O + ["--torch_empty_cache_steps", "0"]),
    dict(argv=O + ["--warmup_steps", "0.1", "--num_train_epochs", "2"]),
    dict(argv=O + ["--warmup_steps", "-2"]),
    dict(argv=O + ["--seed", "7", "--seed", "9"]),
    dict(argv=O + ["--liger_kernel_config", '{"a": true}']),
    dict(argv=O + ["--parallelism_config", "x"]),
    dict(argv=O + ["--hub_token", "abc", "--hub_model_id", "me/m"]),
    dict(argv=O + ["--log_level", "info", "--log_level_replica", "error"]),
    dict(argv=O + ["--log_level", "loud"]),
    dict(argv=O + ["--ddp_timeout", "60", "--ddp_find_unused_parameters", "false"]),
    dict(argv=O + ["--ddp_backend", "nccl2"]),
    dict(argv=O + ["--dataloader_num_workers", "2", "--dataloader_prefetch_factor", "4", "--dataloader_persistent_workers"]),
    dict(argv=O + ["--dataloader_prefetch_factor", "4"]),
    dict(argv=O + ["--logging_strategy", "epoch", "--save_strategy", "no", "--logging_first_step", "true"]),
    dict(argv=O + ["--logging_steps", "10.5"]),
    dict(argv=O + ["--accelerator_config", '{"split_batches": true}']),
    dict(argv=O + ["--optim_target_modules", "attn"]),
    dict(argv=O + ["--trackio_static_space_id", "me/space"]),
    dict(argv=O + ["--torch_compile_backend", "inductor", "--torch_compile_mode", "reduce-overhead"]),
    dict(argv=["--num_train_epochs", "1"]),
    dict(argv=O + ["--evaluation_strategy", "steps", "--logging_steps", "25"],
         v5_argv=O + ["--eval_strategy", "steps", "--logging_steps", "25"]),
    dict(argv=O + ["--warmup_ratio", "0.1"], v5_argv=O + ["--warmup_steps", "0.1"]),
    dict(argv=O + ["--group_by_length"], v5_argv=O + ["--train_sampling_strategy", "group_by_length"]),
    dict(argv=O + ["--logging_dir", "runs/x", "--logging_steps", "5"], v5_argv=O + ["--logging_steps", "5"]),
]

cli = []
for c in CLI:
    entry = {"argv": c["argv"], "v5_argv": c.get("v5_argv")}
    entry.update(parse(c.get("v5_argv") or c["argv"]))
    cli.append(entry)

# Seq2SeqTrainingArguments: upstream checks none of its five fields; `tchtrain_rejects` marks the
# values tchtrain refuses when reading (wrong types, counts below 1), with the field the error names.
SEQ2SEQ_COMBOS = [
    dict(name="predict_with_generate", kwargs=dict(predict_with_generate=True)),
    dict(name="sortish_sampler", kwargs=dict(sortish_sampler=True)),
    dict(name="generation_lengths", kwargs=dict(generation_max_length=128, generation_num_beams=4)),
    dict(name="generation_ones", kwargs=dict(generation_max_length=1, generation_num_beams=1)),
    dict(name="generation_config_path", kwargs=dict(generation_config="{REF}/gen")),
    dict(name="generation_config_dict", kwargs=dict(generation_config={"max_length": 3, "num_beams": 2})),
    dict(name="generation_nulls", kwargs=dict(generation_max_length=None, generation_num_beams=None, generation_config=None)),
    dict(name="with_base_fields", kwargs=dict(predict_with_generate=True, eval_strategy="epoch", learning_rate=3e-4,
                                              per_device_eval_batch_size=16, generation_num_beams=2)),
    dict(name="base_check_still_applies", kwargs=dict(predict_with_generate=True, logging_steps=0), field="logging_strategy"),
    dict(name="unknown_key", kwargs=dict(predict_with_generat=True), field="predict_with_generat"),
    dict(name="num_beams_zero", kwargs=dict(generation_num_beams=0), field="generation_num_beams", tchtrain_rejects=True),
    dict(name="max_length_negative", kwargs=dict(generation_max_length=-1), field="generation_max_length", tchtrain_rejects=True),
    dict(name="num_beams_string", kwargs=dict(generation_num_beams="4"), field="generation_num_beams", tchtrain_rejects=True),
    dict(name="max_length_float", kwargs=dict(generation_max_length=2.5), field="generation_max_length", tchtrain_rejects=True),
    dict(name="predict_string", kwargs=dict(predict_with_generate="yes"), field="predict_with_generate", tchtrain_rejects=True),
    dict(name="sortish_null", kwargs=dict(sortish_sampler=None), field="sortish_sampler", tchtrain_rejects=True),
    dict(name="generation_config_number", kwargs=dict(generation_config=3), field="generation_config", tchtrain_rejects=True),
    dict(name="generation_config_list", kwargs=dict(generation_config=["a"]), field="generation_config", tchtrain_rejects=True),
]
seq2seq_combos = []
for c in SEQ2SEQ_COMBOS:
    kwargs = dict(c["kwargs"])
    kwargs.setdefault("output_dir", "out")
    entry = {"name": c["name"], "kwargs": kwargs, "field": c.get("field"), "tchtrain_rejects": c.get("tchtrain_rejects", False)}
    entry.update(build(kwargs, Seq2SeqTrainingArguments))
    seq2seq_combos.append(entry)

SEQ2SEQ_CLI = [
    O + ["--predict_with_generate"],
    O + ["--predict_with_generate", "false"],
    O + ["--predict_with_generate=no"],
    O + ["--predict-with-generate", "T"],
    O + ["--sortish_sampler"],
    O + ["--sortish_sampler", "0", "--predict_with_generate", "1"],
    O + ["--generation_max_length", "128", "--generation_num_beams", "4"],
    O + ["--generation-max-length=64", "--generation-num-beams", "2"],
    O + ["--generation_config", "{REF}/gen"],
    O + ["--generation_config", "google/flan-t5-small", "--predict_with_generate"],
    O + ["--generation_num_beams", "3", "--generation_num_beams", "5"],
    O + ["--predict_with_gen"],
    O + ["--eval_strategy", "epoch", "--predict_with_generate", "--generation_num_beams", "3", "--bf16", "--use_cpu"],
    O + ["--predict_with_generate", "maybe"],
    O + ["--generation_num_beams", "x"],
    O + ["--generation_max_length", "2.5"],
    O + ["--generation_max_length"],
    O + ["--generation_config"],
    O + ["--predict", "true"],
    O + ["--generation", "3"],
    O + ["--generation_num_beam", "3"],
    O + ["--generation_beams", "3"],
    O + ["--no_predict_with_generate"],
]
# Upstream accepts these (no check); tchtrain rejects them when reading.
SEQ2SEQ_CLI_TCHTRAIN_REJECTS = [
    (O + ["--generation_num_beams", "0"], "generation_num_beams"),
    (O + ["--generation_max_length", "-5"], "generation_max_length"),
]
seq2seq_cli = []
for argv in SEQ2SEQ_CLI:
    entry = {"argv": argv, "tchtrain_rejects": False, "field": None}
    entry.update(parse(argv, Seq2SeqTrainingArguments))
    seq2seq_cli.append(entry)
for argv, field in SEQ2SEQ_CLI_TCHTRAIN_REJECTS:
    entry = {"argv": argv, "tchtrain_rejects": True, "field": field}
    entry.update(parse(argv, Seq2SeqTrainingArguments))
    seq2seq_cli.append(entry)

s2s_defaults = Seq2SeqTrainingArguments(output_dir="out")
s2s_set = Seq2SeqTrainingArguments(
    output_dir="out", sortish_sampler=True, predict_with_generate=True, generation_max_length=64,
    generation_num_beams=4, generation_config="gen_dir",
)
s2s_object = Seq2SeqTrainingArguments(
    output_dir="out", predict_with_generate=True,
    generation_config=GenerationConfig(max_length=32, num_beams=3, temperature=0.7, do_sample=True),
)
seq2seq = {
    "defaults": {
        "to_dict": json.loads(s2s_defaults.to_json_string()),
        "to_json_string": s2s_defaults.to_json_string(),
        "field_order": [f for f in s2s_defaults.to_dict()],
        "to_sanitized_dict": s2s_defaults.to_sanitized_dict(),
    },
    "set": {
        "to_json_string": s2s_set.to_json_string(),
        "to_sanitized_dict": s2s_set.to_sanitized_dict(),
    },
    "generation_config_object": {
        "to_dict": json.loads(s2s_object.to_json_string()),
        "to_sanitized_generation_config": s2s_object.to_sanitized_dict()["generation_config"],
    },
    "combos": seq2seq_combos,
    "cli": seq2seq_cli,
}

defaults = TrainingArguments(output_dir="out")
out = {
    "transformers_version": transformers.__version__,
    "defaults": {
        "to_dict": json.loads(defaults.to_json_string()),
        "to_json_string": defaults.to_json_string(),
        "field_order": [f for f in defaults.to_dict()],
        "to_sanitized_dict": defaults.to_sanitized_dict(),
    },
    "env_dependent": {
        "disable_tqdm": "None resolves to whether the transformers log level (TRANSFORMERS_VERBOSITY) is above WARNING; "
        "False here (unset)",
        "report_to": "'all' resolves to the reporting integrations installed in the Python environment; not used here",
        "bf16": "bf16 without use_cpu is rejected on machines without bf16 GPU support; cases here set use_cpu",
        "tf32": "tf32=True is rejected without an Ampere+ CUDA GPU; cases here only use tf32=False",
        "torch_compile_backend": "hpu_backend / neuron on those devices; inductor here",
    },
    "enums": {
        "IntervalStrategy": [e.value for e in IntervalStrategy],
        "SaveStrategy": [e.value for e in SaveStrategy],
        "HubStrategy": [e.value for e in HubStrategy],
        "SchedulerType": [e.value for e in SchedulerType],
        "OptimizerNames": [e.value for e in OptimizerNames],
        "FSDPOption": [e.value for e in FSDPOption],
        "DebugOption": [e.value for e in DebugOption],
        "ParallelMode": [e.value for e in ParallelMode],
    },
    "combos": combos,
    "warmup": warmup,
    "cli": cli,
    "seq2seq": seq2seq,
}
(OUT / "training_args.json").write_text(json.dumps(out, indent=2))
print(
    f"training_args: {len(combos)} combos, {len(cli)} command lines, {len(warmup)} warmup cases; "
    f"seq2seq: {len(seq2seq_combos)} combos, {len(seq2seq_cli)} command lines"
)
