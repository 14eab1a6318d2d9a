"""Reference for TRL's SFTTrainer (trl/tests/it/sft.rs): trl 1.16 over transformers 5.23.

Usage: python trl_sft.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/initial/: a tiny Llama (2 layers, hidden 64, MLP 128, 4 heads over 2, untied head) at
the 1024 tokens of SmolLM2's tokenizer cut short (OUT_DIR/tokenizer/, written by
`_smollm2_1k.py`), drawn after `torch.manual_seed(0)`.

OUT_DIR/data/: the datasets, as JSON lines, built from hamlet.txt's non-empty lines:
`text.jsonl` (`text`: two lines), `messages.jsonl` (`messages`: a user line and the
assistant's next line, every third row with a system message), `prompt_completion.jsonl`
(`prompt`: a line, `completion`: " " + the next), `chat_prompt_completion.jsonl` (the same as
messages: `prompt` [user], `completion` [assistant]); 40 train rows and 8 eval rows each
(`*.eval.jsonl`).

OUT_DIR/<case>/: `SFTTrainer(model, args, train_dataset, eval_dataset, processing_class=
that tokenizer)` trained 8 steps (batch 4, lr 1e-3, max_length 80, logging every 2 steps,
evaluation every 4, seed 42, float32, no gradient checkpointing unless the case says):
`log_history.json`, `train_output.json`, and `prepared.json` (the prepared train rows'
`input_ids`, `labels` and, when packed, `seq_lengths`). Cases:
  text            language modeling on `text` (EOS appended)
  messages        conversational `messages` (SmolLM2's chat template)
  prompt_completion   prompt-completion text (completion-only loss by default)
  chat_prompt_completion   prompt-completion as messages
  packing         `text` packed (BFD) into 80-token rows, padding-free batches
  dft             `messages` with `loss_type="dft"`
  assistant_smollm2   `messages` with `assistant_only_loss` under SmolLM2's template with
                  `{% generation %}` around each assistant turn (`data/smollm2_training.jinja`,
                  `chat_template_path`)
  assistant_qwen3_tools   `tool_messages` (a user request, an assistant tool call, the tool's
                  answer, the assistant's reply; `tools` as JSON text) with `assistant_only_loss`
                  under TRL's own `qwen3_training.jinja` (`chat_template_path`)
  lora_defaults   `messages` with TRL's defaults (bf16 autocast, gradient checkpointing) and
                  `peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj",
                  "v_proj"])` (drawn after the trainer's `set_seed(42)`)
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
from trl import SFTConfig, SFTTrainer

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
    pairs = [(ls[i], ls[i + 1]) for i in range(0, 96, 2)]
    train, ev = pairs[:40], pairs[40:48]
    for suffix, part in [("", train), (".eval", ev)]:
        write(f"text{suffix}.jsonl", [{"text": a + " " + b} for a, b in part])
        messages = []
        for i, (a, b) in enumerate(part):
            m = [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
            if i % 3 == 0:
                m = [{"role": "system", "content": "Answer in verse."}] + m
            messages.append({"messages": m})
        write(f"messages{suffix}.jsonl", messages)
        write(f"prompt_completion{suffix}.jsonl", [{"prompt": a, "completion": " " + b} for a, b in part])
        write(
            f"chat_prompt_completion{suffix}.jsonl",
            [
                {"prompt": [{"role": "user", "content": a}], "completion": [{"role": "assistant", "content": b}]}
                for a, b in part
            ],
        )


SMOLLM2_TRAINING = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TOOLS = json.dumps([{"type": "function", "function": {
    "name": "rhyme", "description": "A word that rhymes with the given one.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}])


def tool_datasets():
    (OUT / "data" / "smollm2_training.jinja").write_text(SMOLLM2_TRAINING, encoding="utf-8")
    import trl
    shutil.copy(Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja", OUT / "data" / "qwen3_training.jinja")
    ls = lines()
    rows = []
    for i in range(48):
        a, b = ls[100 + 2 * i], ls[101 + 2 * i]
        word = b.split()[0].strip(",.;:!?'").lower() or "time"
        rows.append({"tools": TOOLS, "messages": [
            {"role": "user", "content": a},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "rhyme", "arguments": {"word": word}}}]},
            {"role": "tool", "content": word + "s"},
            {"role": "assistant", "content": b},
        ]})
    write("tool_messages.jsonl", rows[:40])
    write("tool_messages.eval.jsonl", rows[40:])


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
    model = tf.AutoModelForCausalLM.from_pretrained(OUT / "initial")
    train = load_dataset("json", data_files=str(OUT / "data" / f"{data}.jsonl"), split="train")
    ev = load_dataset("json", data_files=str(OUT / "data" / f"{data}.eval.jsonl"), split="train")
    args = dict(
        output_dir=str(OUT / f".tmp-{case}"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=8, learning_rate=1e-3, max_length=80, logging_steps=2, eval_strategy="steps",
        eval_steps=4, save_strategy="no", seed=42, use_cpu=True, report_to="none", disable_tqdm=True,
    )
    if not defaults:
        args.update(bf16=False, gradient_checkpointing=False)
    args.update(kw)
    trainer = SFTTrainer(
        model=model, args=SFTConfig(**args), train_dataset=train, eval_dataset=ev, processing_class=tok,
        peft_config=peft,
    )
    prepared = [
        {k: row[k] for k in ("input_ids", "labels", "seq_lengths") if k in row} for row in trainer.train_dataset
    ]
    (folder / "prepared.json").write_text(json.dumps(prepared))
    result = trainer.train()
    (folder / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (folder / "train_output.json").write_text(
        json.dumps({"global_step": result.global_step, "training_loss": result.training_loss,
                    "total_flos": trainer.state.total_flos}, indent=1)
    )
    shutil.rmtree(args["output_dir"], ignore_errors=True)
    print(case, trainer.state.log_history[-2])


def main():
    sibling("_smollm2_1k").write(OUT / "tokenizer")
    datasets()
    tool_datasets()
    model()
    run("text", "text")
    run("messages", "messages")
    run("prompt_completion", "prompt_completion")
    run("chat_prompt_completion", "chat_prompt_completion")
    run("packing", "text", packing=True)
    run("dft", "messages", loss_type="dft")
    run("assistant_smollm2", "messages", assistant_only_loss=True,
        chat_template_path=str(OUT / "data" / "smollm2_training.jinja"))
    run("assistant_qwen3_tools", "tool_messages", assistant_only_loss=True, max_length=560,
        chat_template_path=str(OUT / "data" / "qwen3_training.jinja"))
    run("lora_defaults", "messages", defaults=True,
        peft=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


if __name__ == "__main__":
    main()
