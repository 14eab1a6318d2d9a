"""Reference for TRL's DPOTrainer (trl/tests/it/dpo.rs): trl 1.16 over transformers 5.23.

Usage: python trl_dpo.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/initial/: a tiny Llama causal LM (2 layers, hidden 64, MLP 128, 4 heads over 2, untied
head) at the 1024 tokens of SmolLM2's tokenizer cut
short (OUT_DIR/tokenizer/, written by `_smollm2_1k.py`), drawn after `torch.manual_seed(0)`. Every case
passes its path as a string: TRL loads the policy from it and, for full fine-tuning without
precomputed log-probabilities, the reference model again from it.

OUT_DIR/data/: preference pairs, as JSON lines, built from hamlet.txt's non-empty lines: a line
`a`, the line after it `b` (chosen) and a line further on `c` (rejected). `standard.jsonl`
(implicit prompt: `chosen` = a + " " + b, `rejected` = a + " " + c; TRL extracts the prompt),
`explicit.jsonl` (`prompt` = a, `chosen` = " " + b, `rejected` = " " + c), `conversational.jsonl`
(`prompt` [user a], `chosen` / `rejected` [assistant b / c]); 40 train rows and 8 eval rows each
(`*.eval.jsonl`).

OUT_DIR/<case>/: `DPOTrainer(model=path, args, train_dataset, eval_dataset,
processing_class=that tokenizer)` trained 8 steps (batch 4, lr 1e-3, max_length 48,
logging every 2 steps, evaluation every 4, seed 42, float32, no gradient checkpointing unless
the case says): `log_history.json`, `prepared.json` (the prepared train rows' `prompt_ids`,
`chosen_ids`, `rejected_ids` and, when precomputed, `ref_chosen_logps` / `ref_rejected_logps`)
and `model/` (the trained model or adapter, saved). Cases:
  sigmoid         implicit prompt (extracted), EOS appended, DPO's sigmoid loss
  explicit        explicit prompt, `max_length` 20 (the collator truncates, `keep_start`; rows
                  whose prompt fills it dropped)
  keep_end        explicit prompt, `max_length` 20, `truncation_mode="keep_end"`
  conversational  messages under SmolLM2's chat template (`max_length` 96)
  mpo             `loss_type=["sigmoid", "bco_pair", "sft"]`, `loss_weights=[0.8, 0.2, 1.0]`
  variants        `ld_alpha=0.5`, `use_weighting=True`, `f_divergence_type="js_divergence"`
  alpha_div       `f_divergence_type="alpha_divergence"`, `f_alpha_divergence_coef=0.3`,
                  `loss_type="hinge"`
  sync            TR-DPO: `sync_ref_model=True`, `ref_model_sync_steps=2`,
                  `ref_model_mixup_alpha=0.6` (the reference mixed with the policy every 2 steps)
  precompute      `precompute_ref_log_probs=True` (the policy before training as reference,
                  batches of 3)
  lora_defaults   conversational with TRL's defaults (bf16 autocast, gradient checkpointing)
                  and `peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj",
                  "v_proj"])`: the reference is the base with the adapter disabled
  loss_<type>     each other loss type (4 steps, no evaluation), `label_smoothing` 0.1 for
                  `robust`, `exo_pair`, `aot`, `aot_unpaired`
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
from trl import DPOConfig, DPOTrainer

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
HERE = Path(__file__).resolve().parent
torch.set_num_threads(2)

LOSS_TYPES = ["hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
              "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"]
SMOOTHED = {"robust", "exo_pair", "aot", "aot_unpaired"}


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


def run(case, data, defaults=False, peft=None, steps=8, evaluate=True, save=True, **kw):
    folder = OUT / case
    folder.mkdir()
    tok = tf.AutoTokenizer.from_pretrained(OUT / "tokenizer")
    train = load_dataset("json", data_files=str(OUT / "data" / f"{data}.jsonl"), split="train")
    ev = load_dataset("json", data_files=str(OUT / "data" / f"{data}.eval.jsonl"), split="train")
    args = dict(
        output_dir=str(OUT / f".tmp-{case}"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=steps, learning_rate=1e-3, max_length=48, logging_steps=2,
        eval_strategy="steps" if evaluate else "no", eval_steps=4, save_strategy="no", seed=42, use_cpu=True,
        report_to="none", disable_tqdm=True,
    )
    if not defaults:
        args.update(bf16=False, gradient_checkpointing=False)
    args.update(kw)
    trainer = DPOTrainer(
        model=str(OUT / "initial"), args=DPOConfig(**args), train_dataset=train,
        eval_dataset=ev if evaluate else None, processing_class=tok, peft_config=peft,
    )
    keys = ("prompt_ids", "chosen_ids", "rejected_ids", "ref_chosen_logps", "ref_rejected_logps")
    prepared = [{k: row[k] for k in keys if k in row} for row in trainer.train_dataset]
    (folder / "prepared.json").write_text(json.dumps(prepared))
    trainer.train()
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    if save:
        trainer.save_model(str(folder / "model"))
    shutil.rmtree(args["output_dir"], ignore_errors=True)
    print(case, len(prepared), "rows", trainer.state.log_history[-2])


def main():
    sibling("_smollm2_1k").write(OUT / "tokenizer")
    datasets()
    model()
    run("sigmoid", "standard")
    run("explicit", "explicit", max_length=20)
    run("keep_end", "explicit", max_length=20, truncation_mode="keep_end")
    run("conversational", "conversational", max_length=96)
    run("mpo", "explicit", loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0])
    run("variants", "explicit", ld_alpha=0.5, use_weighting=True, f_divergence_type="js_divergence")
    run("alpha_div", "explicit", loss_type="hinge", f_divergence_type="alpha_divergence",
        f_alpha_divergence_coef=0.3)
    run("sync", "explicit", sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.6)
    run("precompute", "explicit", precompute_ref_log_probs=True, precompute_ref_batch_size=3)
    run("lora_defaults", "conversational", defaults=True, max_length=96,
        peft=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    for loss in LOSS_TYPES:
        kw = {"label_smoothing": 0.1} if loss in SMOOTHED else {}
        run(f"loss_{loss}", "explicit", steps=4, evaluate=False, save=False, loss_type=loss, **kw)


if __name__ == "__main__":
    main()
