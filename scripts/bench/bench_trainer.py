"""Upstream's Trainer (transformers 5.23 on torch 2.13, CPU) on the jobs of
`cargo xtask bench`: the counterpart of examples/src/bin/bench_trainer.rs.

Two modes:

    python bench_trainer.py --prepare DIR
        writes, for every job, DIR/<job>/initial/ (config.json + model.safetensors: the
        weights both sides start from), DIR/<job>/rows.json (the training rows, already
        tokenized) and DIR/<job>/job.json (the settings both sides read). Run once per
        bench invocation.

    python bench_trainer.py --data DIR --job NAME --precision fp32|bf16 [--threads N]
        trains DIR/NAME with transformers.Trainer and prints one JSON line.

Steps: `warmup` steps, then `steps` measured steps (few: the whole bench has to fit in
~15 minutes on a busy 2-core machine).

Jobs (CPU, dropout off, seed 42, AdamW (the default `adamw_torch_fused`), lr 5e-5, linear
schedule, max_grad_norm 1.0, no logging until the end, no saving, report_to none):

    gpt2_tiny     GPT-2, 2 layers x 64 wide (4 heads), block 128, batch 8: the 50257-token
                  vocabulary (GPT-2 tokenizer) on hamlet.txt, `default_data_collator`.
    gpt2_tiny_v1k the same with a 1024-token vocabulary (each GPT-2 id taken modulo 1024):
                  with 50257 tokens the LM head is 97 % of the tiny model's matmul work, so
                  only this variant is bound by per-step overhead rather than by the LM head.
    gpt2_6x384    GPT-2, 6 layers x 384 wide (6 heads), block 128, batch 4, same data.
    smollm2_lora  SmolLM2-135M with a LoRA adapter on every linear layer (peft), block 128,
                  batch 4: the frozen base's forward and input gradients, the adapter trained.
    smollm2_qlora the same on the base loaded in 4 bits (bitsandbytes NF4, double
                  quantization, float32 compute): QLoRA.
    smollm2_qlora8 the same on the base loaded in 8 bits (LLM.int8, TRL's --load_in_8bit).
    smollm2_sft_packed SmolLM2-135M trained in full by TRL's SFTTrainer on hamlet.txt's lines
                  (two per `text` row, EOS appended), BFD-packed into 512-token rows with
                  padding-free batches of 2, TRL's fused LM head (ours: tchtrain-trl); no bare
                  loop.
    smollm2_dpo   SmolLM2-135M trained in full by TRL's DPOTrainer (sigmoid loss, beta 0.1) on
                  preference pairs of hamlet.txt's lines (prompt: a line; chosen: the next;
                  rejected: a line further on), batches of 4 pairs, max_length 128, the
                  reference a second copy of the checkpoint (ours: tchtrain-trl); no bare loop.
    qwen2_tiny    a tiny Qwen2 (2 x 64), 1024-token vocabulary, block 128, batch 8;
    qwen2_padded  the same on rows cut to 16..128 tokens and padded to 128 (see JOBS).
    qwen3_moe_tiny a tiny Qwen3-MoE (2 x 64, 8 experts, 2 per token, router logits on), 1024-
                  token vocabulary, block 128, batch 8.
    qwen3_5_tiny  a tiny Qwen3.5 (4 x 64: three Gated DeltaNet linear-attention layers (2 key heads,
                  4 value heads of 16) and a gated full-attention one, upstream's torch fallbacks),
                  1024-token vocabulary, block 128 (two 64-token chunks), batch 8.
    minilm_cls    assets/minilm (BERT, 6 x 384) under a fresh 2-label head (seed 0),
                  Rotten Tomatoes fresh / rotten reviews truncated to 128 tokens, batch 16,
                  `DataCollatorWithPadding` (dynamic padding).

Random weights are drawn with torch.manual_seed(0) and saved with save_pretrained, so both
sides start from the same weights; both sides read the same rows and use the same seeded
random sampler, so they also see the same batches.

Timing (the same definitions as the Rust side): a TrainerCallback takes the time at
on_step_begin and on_step_end; `median_step_ms` is the median of (end - begin) over the steps
after `warmup` (the window of on_step_begin .. on_step_end holds forward, backward, clipping,
optimizer and scheduler step; the batch is collated just before on_step_begin);
`tokens_per_s` = input tokens (padded, numel of input_ids) of the measured steps / wall time
(`real_tokens_per_s`: the real tokens, those the attention mask keeps, over the same time)
from the warm-up's last on_step_end to the last on_step_end (collation included). `peak_rss_mb`
is getrusage's ru_maxrss of the process (KiB on Linux) / 1024. The step's parts (medians):
`median_forward_backward_ms` (on_step_begin to on_pre_optimizer_step: forward, loss, backward,
clipping), `median_optimizer_ms` (to on_optimizer_step), `median_after_optimizer_ms` (scheduler,
zero grad, callbacks, to on_step_end).
"""

import argparse
import bz2
import csv
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

import transformers as tf

ROOT = Path(__file__).resolve().parents[2]
ASSETS = Path(os.environ.get("TCHTRAIN_ASSETS", ROOT / "assets"))

JOBS = {
    "gpt2_tiny": dict(kind="clm", layers=2, width=64, heads=4, block=128, batch=8, warmup=3, steps=12),
    "gpt2_tiny_v1k": dict(kind="clm", layers=2, width=64, heads=4, block=128, batch=8, vocab=1024, warmup=5, steps=100),
    "gpt2_6x384": dict(kind="clm", layers=6, width=384, heads=6, block=128, batch=4, warmup=2, steps=6),
    "minilm_cls": dict(kind="cls", max_length=128, batch=16, warmup=2, steps=8),
    # A tiny Qwen2 (the Llama-shaped family: RMSNorm, RoPE, grouped-query attention with
    # q/k/v biases, SwiGLU), 2 x 64, 4 heads over 2 key-value heads, a 1024-token vocabulary.
    "qwen2_tiny": dict(kind="clm", arch="qwen2", layers=2, width=64, heads=4, kv_heads=2, inner=128, block=128, batch=8, vocab=1024, warmup=5, steps=40),
    # The same tiny Qwen2 on padded rows: each Hamlet block cut to 16..128 tokens (16 +
    # (37 i) mod 113; 55 % real on average) and padded to 128 (pad id 0, attention mask,
    # labels -100 on the padding), `default_data_collator`.
    "qwen2_padded": dict(kind="clm", arch="qwen2", layers=2, width=64, heads=4, kv_heads=2, inner=128, block=128, batch=8, vocab=1024, warmup=5, steps=40, padded=True),
    # A tiny Qwen3-MoE (the mixture-of-experts family: 8 experts of intermediate size 64, 2
    # per token, normalised, the router's load-balancing loss on at 0.001), 2 x 64, 4 heads
    # over 2 key-value heads, head_dim 16, a 1024-token vocabulary, tied head.
    "qwen3_moe_tiny": dict(kind="clm", arch="qwen3_moe", layers=2, width=64, heads=4, kv_heads=2, experts=8, top_k=2, moe_inner=64, block=128, batch=8, vocab=1024, warmup=5, steps=40),
    "qwen3_5_tiny": dict(kind="clm", arch="qwen3_5", layers=4, width=64, heads=4, kv_heads=2, inner=128, block=128, batch=8, vocab=1024, warmup=5, steps=40),
    # SmolLM2-135M (assets/smollm2-135m, 30 x 576, tied embeddings) under a LoRA adapter on
    # every linear layer (peft's "all-linear": r 16, alpha 32, dropout 0.05), drawn after
    # torch.manual_seed(0) on both sides; hamlet.txt in the model's own tokenizer.
    "smollm2_lora": dict(
        kind="clm", arch="smollm2", block=128, batch=4, warmup=2, steps=6,
        lora=dict(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"),
    ),
    # QLoRA: smollm2_lora with the base loaded in 4 bits (bitsandbytes' NF4, double
    # quantization, float32 compute) as TRL's --load_in_4bit --use_bnb_nested_quant loads it.
    "smollm2_qlora": dict(
        kind="clm", arch="smollm2", block=128, batch=4, warmup=2, steps=6,
        lora=dict(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"),
        quantization=dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    ),
    # smollm2_lora with the base loaded in 8 bits (LLM.int8: training through
    # MatMul8bitFp, the int8 rows dequantized per step) as TRL's --load_in_8bit loads it.
    "smollm2_qlora8": dict(
        kind="clm", arch="smollm2", block=128, batch=4, warmup=2, steps=6,
        lora=dict(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"),
        quantization=dict(load_in_8bit=True),
    ),
    # TRL's SFT with packing: SFTTrainer(model, SFTConfig(max_length=512, packing=True)) on
    # text rows, every other setting as the other jobs (float32 or bf16 autocast, no
    # gradient checkpointing).
    "smollm2_sft_packed": dict(kind="sft", arch="smollm2", max_length=512, batch=2, warmup=2, steps=6),
    # TRL's DPO, full fine-tuning against a reference loaded again from the checkpoint:
    # DPOTrainer(model=path, DPOConfig(max_length=128)) on explicit-prompt text pairs.
    "smollm2_dpo": dict(kind="dpo", arch="smollm2", max_length=128, batch=4, warmup=2, steps=6),
}


class Rows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return dict(self.rows[i])


def gpt2_blocks(block, tok=None):
    tok = tok or tf.GPT2TokenizerFast(
        vocab=str(ASSETS / "gpt2-tokenizer" / "vocab.json"),
        merges=str(ASSETS / "gpt2-tokenizer" / "merges.txt"),
    )
    tok.model_max_length = 10**9
    ids = tok((ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8"))["input_ids"]
    return [ids[i : i + block] for i in range(0, len(ids) // block * block, block)]


def prepare(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    for name, job in JOBS.items():
        folder = out / name
        folder.mkdir(exist_ok=True)
        torch.manual_seed(0)
        if job["kind"] in ("sft", "dpo"):
            (folder / "initial").mkdir()
            for f in ("config.json", "model.safetensors"):
                (folder / "initial" / f).symlink_to(ASSETS / "smollm2-135m" / f)
            text = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8")
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if job["kind"] == "sft":
                rows = [{"text": lines[i] + " " + lines[i + 1]} for i in range(0, len(lines) - 1, 2)]
            else:
                n = len(lines) - 1
                rows = [
                    {"prompt": lines[i], "chosen": " " + lines[i + 1], "rejected": " " + lines[(i + 57) % n]}
                    for i in range(0, n, 2)
                ]
            (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (folder / "job.json").write_text(json.dumps({"name": name, **job}, indent=1))
            print(f"prepared {name}: {len(rows)} {job['kind']} rows", file=sys.stderr)
            continue
        if job.get("arch") == "smollm2":
            # The checkpoint as it is: both sides read the asset's files.
            (folder / "initial").mkdir()
            for f in ("config.json", "model.safetensors"):
                (folder / "initial" / f).symlink_to(ASSETS / "smollm2-135m" / f)
            tok = tf.AutoTokenizer.from_pretrained(ASSETS / "smollm2-135m")
            rows = [{"input_ids": b} for b in gpt2_blocks(job["block"], tok)]
            (folder / "rows.json").write_text(json.dumps(rows))
            (folder / "job.json").write_text(json.dumps({"name": name, **job}, indent=1))
            print(f"prepared {name}: {len(rows)} rows", file=sys.stderr)
            continue
        if job.get("arch") == "qwen3_moe":
            vocab = job["vocab"]
            config = tf.Qwen3MoeConfig(
                vocab_size=vocab,
                hidden_size=job["width"],
                num_hidden_layers=job["layers"],
                num_attention_heads=job["heads"],
                num_key_value_heads=job["kv_heads"],
                head_dim=job["width"] // job["heads"],
                num_experts=job["experts"],
                num_experts_per_tok=job["top_k"],
                moe_intermediate_size=job["moe_inner"],
                norm_topk_prob=True,
                output_router_logits=True,
                max_position_embeddings=job["block"],
                tie_word_embeddings=True,
            )
            model = tf.Qwen3MoeForCausalLM(config)
            rows = [{"input_ids": [i % vocab for i in b]} for b in gpt2_blocks(job["block"])]
        elif job.get("arch") == "qwen3_5":
            vocab = job["vocab"]
            config = tf.Qwen3_5TextConfig(
                vocab_size=vocab,
                hidden_size=job["width"],
                intermediate_size=job["inner"],
                num_hidden_layers=job["layers"],
                num_attention_heads=job["heads"],
                num_key_value_heads=job["kv_heads"],
                head_dim=job["width"] // job["heads"],
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                max_position_embeddings=job["block"],
                tie_word_embeddings=True,
            )
            model = tf.Qwen3_5ForCausalLM(config)
            rows = [{"input_ids": [i % vocab for i in b]} for b in gpt2_blocks(job["block"])]
        elif job.get("arch") == "qwen2":
            vocab = job["vocab"]
            config = tf.Qwen2Config(
                vocab_size=vocab,
                hidden_size=job["width"],
                intermediate_size=job["inner"],
                num_hidden_layers=job["layers"],
                num_attention_heads=job["heads"],
                num_key_value_heads=job["kv_heads"],
                max_position_embeddings=job["block"],
                tie_word_embeddings=True,
            )
            model = tf.Qwen2ForCausalLM(config)
            rows = [{"input_ids": [i % vocab for i in b]} for b in gpt2_blocks(job["block"])]
            if job.get("padded"):
                block = job["block"]
                for i, r in enumerate(rows):
                    n = 16 + (37 * i) % 113
                    ids = r["input_ids"][:n]
                    r["input_ids"] = ids + [0] * (block - n)
                    r["attention_mask"] = [1] * n + [0] * (block - n)
                    r["labels"] = ids + [-100] * (block - n)
        elif job["kind"] == "clm":
            vocab = job.get("vocab", 50257)
            config = tf.GPT2Config(
                vocab_size=vocab,
                bos_token_id=vocab - 1,
                eos_token_id=vocab - 1,
                n_layer=job["layers"],
                n_embd=job["width"],
                n_head=job["heads"],
                n_positions=job["block"],
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
            model = tf.GPT2LMHeadModel(config)
            rows = [{"input_ids": [i % vocab for i in b]} for b in gpt2_blocks(job["block"])]
        else:
            model = tf.BertForSequenceClassification.from_pretrained(
                ASSETS / "minilm", num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
            )
            tok = tf.AutoTokenizer.from_pretrained(ASSETS / "minilm")
            with bz2.open(ASSETS / "text" / "rotten_tomatoes_corpus.csv.bz2", "rt", encoding="utf-8") as f:
                reviews = [r for r in csv.DictReader(f) if r["category"] in ("fresh", "rotten")]
            reviews = reviews[: 2 * job["batch"] * (job["warmup"] + job["steps"])]
            rows = []
            for r in reviews:
                enc = tok(r["text"], truncation=True, max_length=job["max_length"])
                rows.append({
                    "input_ids": list(enc["input_ids"]),
                    "token_type_ids": list(enc["token_type_ids"]),
                    "attention_mask": list(enc["attention_mask"]),
                    "label": ["fresh", "rotten"].index(r["category"]),
                })
        model.save_pretrained(folder / "initial")
        (folder / "rows.json").write_text(json.dumps(rows))
        (folder / "job.json").write_text(json.dumps({"name": name, **job}, indent=1))
        print(f"prepared {name}: {len(rows)} rows, {model.num_parameters()} parameters", file=sys.stderr)


# `--device`: "cpu" (the default) or "cuda" / "cuda:N" (the Trainer's device, use_cpu False).
DEVICE = "cpu"
# `--zero-stage N`: the DeepSpeed config the Rust side's `zero_config` writes (None: none).
DEEPSPEED = None


def zero_config(stage):
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": stage,
            "overlap_comm": True,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    }


def stamp():
    """perf_counter() after the device's queued work (a CUDA device synchronised first)."""
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter()


class StepTimer(tf.TrainerCallback):
    def __init__(self):
        self.begin, self.pre, self.post, self.end = [], [], [], []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin.append(stamp())

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.pre.append(stamp())

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.post.append(stamp())

    def on_step_end(self, args, state, control, **kwargs):
        self.end.append(stamp())


class ShapeRecorder:
    """Wraps a collator and records each batch's input_ids numel (padded tokens) and its
    real tokens (the attention mask's sum; every token without one)."""

    def __init__(self, collator):
        self.collator = collator
        self.tokens = []
        self.real = []

    def __call__(self, features):
        batch = self.collator(features)
        self.tokens.append(int(batch["input_ids"].numel()))
        mask = batch.get("attention_mask")
        self.real.append(int(mask.sum()) if mask is not None else self.tokens[-1])
        return batch


def run(data: Path, name: str, precision: str, threads: int):
    torch.set_num_threads(threads)
    folder = data / name
    job = json.loads((folder / "job.json").read_text())
    if job["kind"] == "sft":
        return run_sft(folder, job, name, precision)
    if job["kind"] == "dpo":
        return run_dpo(folder, job, name, precision)
    rows = json.loads((folder / "rows.json").read_text())
    if job["kind"] == "clm":
        quantization = job.get("quantization")
        model = tf.AutoModelForCausalLM.from_pretrained(
            folder / "initial",
            quantization_config=tf.BitsAndBytesConfig(**quantization) if quantization else None,
        )
        if "lora" in job:
            import peft

            torch.manual_seed(0)
            model = peft.get_peft_model(model, peft.LoraConfig(**job["lora"]))
        rows = [r if "labels" in r else {"input_ids": r["input_ids"], "labels": list(r["input_ids"])} for r in rows]
        collator = ShapeRecorder(tf.default_data_collator)
    else:
        model = tf.BertForSequenceClassification.from_pretrained(folder / "initial")
        tok = tf.AutoTokenizer.from_pretrained(ASSETS / "minilm")
        collator = ShapeRecorder(tf.DataCollatorWithPadding(tok))
    total = job["warmup"] + job["steps"]
    with tempfile.TemporaryDirectory() as out:
        args = tf.TrainingArguments(
            output_dir=out,
            max_steps=total,
            per_device_train_batch_size=job["batch"],
            learning_rate=5e-5,
            logging_steps=10**6,
            save_strategy="no",
            seed=42,
            use_cpu=DEVICE == "cpu", deepspeed=DEEPSPEED,
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            bf16=precision == "bf16",
        )
        timer = StepTimer()
        trainer = tf.Trainer(
            model=model,
            args=args,
            train_dataset=Rows(rows),
            data_collator=collator,
            callbacks=[timer],
        )
        trainer.train()
    report(job, name, precision, timer, collator)


def run_sft(folder: Path, job: dict, name: str, precision: str):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = tf.AutoTokenizer.from_pretrained(ASSETS / "smollm2-135m")
    model = tf.AutoModelForCausalLM.from_pretrained(folder / "initial")
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    total = job["warmup"] + job["steps"]
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out, max_steps=total, per_device_train_batch_size=job["batch"], learning_rate=5e-5,
            logging_steps=10**6, save_strategy="no", seed=42, use_cpu=DEVICE == "cpu", report_to="none",
            deepspeed=DEEPSPEED,
            disable_tqdm=True, dataloader_num_workers=0, bf16=precision == "bf16",
            gradient_checkpointing=False, max_length=job["max_length"], packing=True,
        )
        timer = StepTimer()
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tok, callbacks=[timer])
        collator = ShapeRecorder(trainer.data_collator)
        trainer.data_collator = collator
        trainer.train()
    report(job, name, precision, timer, collator)


def run_dpo(folder: Path, job: dict, name: str, precision: str):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tok = tf.AutoTokenizer.from_pretrained(ASSETS / "smollm2-135m")
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    total = job["warmup"] + job["steps"]
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(
            output_dir=out, max_steps=total, per_device_train_batch_size=job["batch"], learning_rate=5e-7,
            logging_steps=10**6, save_strategy="no", seed=42, use_cpu=DEVICE == "cpu", report_to="none",
            deepspeed=DEEPSPEED,
            disable_tqdm=True, dataloader_num_workers=0, bf16=precision == "bf16",
            gradient_checkpointing=False, max_length=job["max_length"],
        )
        timer = StepTimer()
        trainer = DPOTrainer(model=str(folder / "initial"), args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tok, callbacks=[timer])
        collator = ShapeRecorder(trainer.data_collator)
        trainer.data_collator = collator
        trainer.train()
    report(job, name, precision, timer, collator)


def report(job, name, precision, timer, collator):
    total = job["warmup"] + job["steps"]
    w = job["warmup"]
    steps = [e - b for b, e in zip(timer.begin[w:], timer.end[w:])]

    def part(a, b):
        return statistics.median(y - x for x, y in zip(a[w:], b[w:])) * 1e3
    tokens = sum(collator.tokens[w:total])
    real = sum(collator.real[w:total])
    wall = timer.end[-1] - timer.end[w - 1]
    print(json.dumps({
        "job": name,
        "precision": precision,
        "impl": "python",
        "tokens_per_s": tokens / wall,
        "real_tokens_per_s": real / wall,
        "median_step_ms": statistics.median(steps) * 1e3,
        "min_step_ms": min(steps) * 1e3,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps": len(steps),
        "tokens": tokens,
        "threads": torch.get_num_threads(),
        "median_forward_backward_ms": part(timer.begin, timer.pre),
        "median_optimizer_ms": part(timer.pre, timer.post),
        "median_after_optimizer_ms": part(timer.post, timer.end),
    }), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", type=Path)
    p.add_argument("--data", type=Path)
    p.add_argument("--job", choices=sorted(JOBS))
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (the Trainer's device)")
    p.add_argument("--zero-stage", type=int, choices=[1, 2, 3], help="run under DeepSpeed ZeRO stage N")
    a = p.parse_args()
    global DEVICE, DEEPSPEED
    if a.zero_stage:
        DEEPSPEED = zero_config(a.zero_stage)
        # DeepSpeed's TorchBackend would JIT-build its shared-memory all-reduce op (minutes of
        # ninja) for inference_all_reduce alone; training reduces through torch.distributed.
        import importlib
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    if a.device != "cpu" and not a.device.startswith("cuda"):
        p.error(f"--device: cpu, cuda or cuda:N, got {a.device!r}")
    DEVICE = a.device
    if a.device.startswith("cuda:"):
        torch.cuda.set_device(int(a.device.split(":")[1]))
    if a.prepare:
        prepare(a.prepare)
    elif a.data and a.job:
        run(a.data, a.job, a.precision, a.threads)
    else:
        p.error("give --prepare DIR, or --data DIR and --job NAME")


if __name__ == "__main__":
    main()
