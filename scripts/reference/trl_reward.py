"""Reference for TRL's RewardTrainer (trl/tests/it/reward.rs): trl 1.16 over transformers 5.23.

Usage: python trl_reward.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/initial/: a tiny Llama causal LM (2 layers, hidden 64, MLP 128, 4 heads over 2, untied
head) at the 1024 tokens of SmolLM2's tokenizer cut
short (OUT_DIR/tokenizer/, written by `_smollm2_1k.py`), drawn after `torch.manual_seed(0)`. Every case
passes its path as a string, so TRL loads it with `AutoModelForSequenceClassification(
num_labels=1, dtype=float32)` after its `set_seed(42)`: `score.weight` is drawn then and the
causal head is dropped.

OUT_DIR/data/: preference pairs, as JSON lines, built from hamlet.txt's non-empty lines: a line
`a`, the line after it `b` (chosen) and a line further on `c` (rejected). `standard.jsonl`
(implicit prompt: `chosen` = a + " " + b, `rejected` = a + " " + c), `explicit.jsonl` (`prompt`
= a, `chosen` = " " + b, `rejected` = " " + c), `margin.jsonl` (standard with `margin` = 0.5 *
(i % 3)), `conversational.jsonl` (`prompt` [user a], `chosen` / `rejected` [assistant b / c]);
40 train rows and 8 eval rows each (`*.eval.jsonl`).

OUT_DIR/<case>/: `RewardTrainer(model=path, args, train_dataset, eval_dataset,
processing_class=that tokenizer)` trained 8 steps (batch 4, lr 1e-3, max_length 48 (rows
longer are dropped), logging every 2 steps, evaluation every 4, seed 42, float32, no gradient
checkpointing unless the case says; the conversational cases max_length 100, SmolLM2's template
adding its system message): `log_history.json`, `train_output.json`, `prepared.json`
(the prepared train rows' `chosen_ids`, `rejected_ids` and `margin`) and `model/` (the trained
model, saved). Cases:
  standard        implicit prompt, EOS appended
  explicit        explicit prompt
  margin_center   `margin` column and `center_rewards_coefficient=0.01`
  conversational  prompt / chosen / rejected messages under SmolLM2's chat template
  lora_defaults   conversational with TRL's defaults (bf16 autocast, gradient checkpointing) and
                  `peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                  task_type="SEQ_CLS")` (`score` trained in full, as peft adds it)
"""

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import torch

import transformers as tf
from datasets import load_dataset
from peft import LoraConfig
from trl import RewardConfig, RewardTrainer

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
HERE = Path(__file__).resolve().parent
torch.set_num_threads(2)


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lines():
    text = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if len(line.strip()) > 20][:200]


def write(name, rows):
    path = OUT / "data" / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def datasets():
    (OUT / "data").mkdir()
    ls = lines()
    triples = [(ls[i], ls[i + 1], ls[(i + 57) % 150]) for i in range(0, 96, 2)]
    train, ev = triples[:40], triples[40:48]
    for suffix, part in [("", train), (".eval", ev)]:
        write(f"standard{suffix}.jsonl", [{"chosen": a + " " + b, "rejected": a + " " + c} for a, b, c in part])
        write(f"explicit{suffix}.jsonl", [{"prompt": a, "chosen": " " + b, "rejected": " " + c} for a, b, c in part])
        write(
            f"margin{suffix}.jsonl",
            [{"chosen": a + " " + b, "rejected": a + " " + c, "margin": 0.5 * (i % 3)} for i, (a, b, c) in enumerate(part)],
        )
        write(
            f"conversational{suffix}.jsonl",
            [
                {
                    "prompt": [{"role": "user", "content": a}],
                    "chosen": [{"role": "assistant", "content": b}],
                    "rejected": [{"role": "assistant", "content": c}],
                }
                for a, b, c in part
            ],
        )


def model():
    config = tf.LlamaConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).save_pretrained(OUT / "initial")


def run(case, data, defaults=False, peft=None, **kw):
    folder = OUT / case
    folder.mkdir()
    tok = tf.AutoTokenizer.from_pretrained(OUT / "tokenizer")
    train = load_dataset("json", data_files=str(OUT / "data" / f"{data}.jsonl"), split="train")
    ev = load_dataset("json", data_files=str(OUT / "data" / f"{data}.eval.jsonl"), split="train")
    args = dict(
        output_dir=str(OUT / f".tmp-{case}"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=8, learning_rate=1e-3, max_length=48, logging_steps=2, eval_strategy="steps",
        eval_steps=4, save_strategy="no", seed=42, use_cpu=True, report_to="none", disable_tqdm=True,
    )
    if not defaults:
        args.update(bf16=False, gradient_checkpointing=False)
    args.update(kw)
    trainer = RewardTrainer(
        model=str(OUT / "initial"), args=RewardConfig(**args), train_dataset=train, eval_dataset=ev,
        processing_class=tok, peft_config=peft,
    )
    prepared = [
        {k: row[k] for k in ("chosen_ids", "rejected_ids", "margin") if k in row} for row in trainer.train_dataset
    ]
    (folder / "prepared.json").write_text(json.dumps(prepared))
    result = trainer.train()
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "train_output.json").write_text(
        json.dumps({"global_step": result.global_step, "training_loss": result.training_loss,
                    "total_flos": trainer.state.total_flos}, indent=1)
    )
    trainer.save_model(str(folder / "model"))
    shutil.rmtree(args["output_dir"], ignore_errors=True)
    print(case, len(prepared), "rows", trainer.state.log_history[-2])


def main():
    sibling("_smollm2_1k").write(OUT / "tokenizer")
    datasets()
    model()
    run("standard", "standard")
    run("explicit", "explicit")
    run("margin_center", "margin", center_rewards_coefficient=0.01)
    run("conversational", "conversational", max_length=100)
    run("lora_defaults", "conversational", defaults=True, max_length=100,
        peft=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"))


if __name__ == "__main__":
    main()
