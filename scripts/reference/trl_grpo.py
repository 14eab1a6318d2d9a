"""Reference for TRL's GRPOTrainer (trl/tests/it/grpo.rs): trl 1.16 over transformers 5.23.

Usage: python trl_grpo.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/initial/: a tiny Llama causal LM (2 layers, hidden 64, MLP 128, 4 heads over 2, untied
head) at the 1024 tokens of SmolLM2's tokenizer cut
short (OUT_DIR/tokenizer/, written by `_smollm2_1k.py`), drawn after `torch.manual_seed(0)`; and
OUT_DIR/reward/: the same shape as a one-label sequence classifier, drawn after
`torch.manual_seed(1)`, with `pad_token_id` 2.

OUT_DIR/data/: prompts as JSON lines, from hamlet.txt's non-empty lines: `standard.jsonl`
(`prompt` a line's first 40 characters, `target` its length modulo 5) and
`conversational.jsonl` (`prompt` [user: the same text]), 16 train rows and 4 eval rows each
(`*.eval.jsonl`).

The reward functions (mirrored by the Rust test):
  length_reward    len(completion text) / 10 (the text's content for conversations)
  token_reward     sum(completion_ids) % 7
  target_reward    1.0 when completion_ids[0] % 5 equals the row's `target`, else 0.0
  sometimes_none   None when completion_ids[0] is even, else len(completion_ids)

OUT_DIR/<case>/: `GRPOTrainer(model=path, reward_funcs, args, train_dataset, eval_dataset,
processing_class=that tokenizer)`: batches of 4 (4 generations of one prompt),
gradient accumulation 2 (so 2 prompts per generation), `max_completion_length` 8, lr 1e-3,
4 steps logged every step, an evaluation every 2, seed 42, float32, no gradient checkpointing
unless the case says: `log_history.json`, `rounds.json` (each generation round's completion
ids and advantages, in generation order) and `model/` (the trained model or adapter). Cases:
  standard        text prompts, [length_reward, token_reward], TRL's default loss (`dapo`)
  grpo_kl         conversational, `loss_type="grpo"`, `beta=0.04` (the reference loaded again),
                  `num_iterations=2` (old log-probabilities), `epsilon_high=0.28`,
                  `reward_weights=[1.0, 0.5]`, `scale_rewards="batch"`, `temperature=0.7`,
                  `top_k=20`, `top_p=0.9`
  none_rewards    [target_reward, sometimes_none], `multi_objective_aggregation=
                  "normalize_then_sum"`, `scale_rewards="none"`, `loss_type="bnpo"`
  reward_model    conversational, the reward model and token_reward, `loss_type="dr_grpo"`,
                  `beta=0.02`, `delta=1.5`
  lora_defaults   text prompts with TRL's defaults (bf16 autocast, gradient checkpointing),
                  `beta=0.04` and `peft_config=LoraConfig(r=4, lora_alpha=8,
                  target_modules=["q_proj", "v_proj"])`: the reference is the adapter disabled
  resume          `standard` saving every 2 steps: `checkpoint-2/` kept for the resume test
  loss_<type>     `cispo`, `sapo`, `luspo` (sequence-level importance sampling) and `grpo` with
                  `steps_per_generation=4` (generations reused across optimizer steps),
                  2 steps, no evaluation
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
from trl import GRPOConfig, GRPOTrainer

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


def text_of(c):
    return c[0]["content"] if isinstance(c, list) else c


def length_reward(completions, **kwargs):
    return [len(text_of(c)) / 10 for c in completions]


def token_reward(completion_ids, **kwargs):
    return [float(sum(ids) % 7) for ids in completion_ids]


def target_reward(completion_ids, target, **kwargs):
    return [1.0 if ids[0] % 5 == t else 0.0 for ids, t in zip(completion_ids, target)]


def sometimes_none(completion_ids, **kwargs):
    return [None if ids[0] % 2 == 0 else float(len(ids)) for ids in completion_ids]


def lines():
    text = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if len(line.strip()) > 20][:200]


def write(name, rows):
    path = OUT / "data" / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def datasets():
    (OUT / "data").mkdir()
    ls = [line[:40] for line in lines()[:40:2]]
    train, ev = ls[:16], ls[16:20]
    for suffix, part in [("", train), (".eval", ev)]:
        write(f"standard{suffix}.jsonl", [{"prompt": a, "target": len(a) % 5} for a in part])
        write(
            f"conversational{suffix}.jsonl",
            [{"prompt": [{"role": "user", "content": a}], "target": len(a) % 5} for a in part],
        )


def models():
    config = dict(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    tf.LlamaForCausalLM(tf.LlamaConfig(**config)).save_pretrained(OUT / "initial")
    torch.manual_seed(1)
    rm = tf.LlamaForSequenceClassification(tf.LlamaConfig(**config, num_labels=1, pad_token_id=2))
    rm.save_pretrained(OUT / "reward")
    tf.AutoTokenizer.from_pretrained(OUT / "tokenizer").save_pretrained(OUT / "reward")


class Recording(GRPOTrainer):
    """GRPOTrainer recording each generation round's completions and advantages."""

    rounds = []

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        ids, mask = out["completion_ids"], out["completion_mask"]
        self.rounds.append({
            "training": self.model.training,
            "prompt_ids": [p[m.bool()].tolist() for p, m in zip(out["prompt_ids"], out["prompt_mask"])],
            "completion_ids": [c[: int(n)].tolist() for c, n in zip(ids, mask.sum(1))],
            "advantages": out["advantages"].tolist(),
        })
        return out


def run(case, data, reward_funcs, defaults=False, peft=None, steps=4, evaluate=True, save=True,
        keep=None, **kw):
    folder = OUT / case
    folder.mkdir()
    tok = tf.AutoTokenizer.from_pretrained(OUT / "tokenizer")
    train = load_dataset("json", data_files=str(OUT / "data" / f"{data}.jsonl"), split="train")
    ev = load_dataset("json", data_files=str(OUT / "data" / f"{data}.eval.jsonl"), split="train")
    args = dict(
        output_dir=str(OUT / f".tmp-{case}"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, num_generations=4, max_completion_length=8,
        max_steps=steps, learning_rate=1e-3, logging_steps=1,
        eval_strategy="steps" if evaluate else "no", eval_steps=2, save_strategy="no", seed=42, use_cpu=True,
        report_to="none", disable_tqdm=True,
    )
    if not defaults:
        args.update(bf16=False, gradient_checkpointing=False)
    args.update(kw)
    Recording.rounds = []
    trainer = Recording(
        model=str(OUT / "initial"), reward_funcs=reward_funcs, args=GRPOConfig(**args), train_dataset=train,
        eval_dataset=ev if evaluate else None, processing_class=tok, peft_config=peft,
    )
    trainer.train()
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "rounds.json").write_text(json.dumps(Recording.rounds))
    if save:
        trainer.save_model(str(folder / "model"))
    if keep:
        shutil.copytree(Path(args["output_dir"]) / keep, folder / keep)
    shutil.rmtree(args["output_dir"], ignore_errors=True)
    print(case, trainer.state.log_history[-2])


def main():
    sibling("_smollm2_1k").write(OUT / "tokenizer")
    datasets()
    models()
    run("standard", "standard", [length_reward, token_reward])
    run("grpo_kl", "conversational", [length_reward, token_reward], loss_type="grpo", beta=0.04,
        num_iterations=2, epsilon_high=0.28, reward_weights=[1.0, 0.5], scale_rewards="batch",
        temperature=0.7, top_k=20, top_p=0.9)
    run("none_rewards", "standard", [target_reward, sometimes_none],
        multi_objective_aggregation="normalize_then_sum", scale_rewards="none", loss_type="bnpo")
    run("reward_model", "conversational", [str(OUT / "reward"), token_reward], loss_type="dr_grpo",
        beta=0.02, delta=1.5)
    run("lora_defaults", "standard", [length_reward, token_reward], defaults=True, beta=0.04,
        peft=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    run("resume", "standard", [length_reward, token_reward], save_strategy="steps", save_steps=2,
        keep="checkpoint-2")
    for loss, kw in [("cispo", {}), ("sapo", {}), ("luspo", {"importance_sampling_level": "sequence"}),
                     ("grpo", {"steps_per_generation": 4})]:
        run(f"loss_{loss}", "standard", [length_reward, token_reward], steps=2, evaluate=False, save=False,
            loss_type=loss, **kw)


if __name__ == "__main__":
    main()
