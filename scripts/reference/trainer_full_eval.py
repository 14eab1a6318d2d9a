"""Reference for trainer/tests/full_eval.rs: upstream's Trainer (transformers 5.23) with
`bf16_full_eval` / `fp16_full_eval` on the CPU: `evaluate()` and `predict()` called outside
`train()` cast the model to bfloat16 / float16 first (`model.to(dtype=...)` in
`evaluation_loop`), and it stays cast.

Usage: python trainer_full_eval.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Model and data are trainer_mixed.py's tiny GPT-2 (dropouts 0, cut to 1024 tokens) and its 14
evaluation blocks of hamlet.txt (ids mapped into them), saved again here. Per run (`bf16/`, `fp16/`): `evaluate()` metrics (eval_loss),
then `predict()` on the same blocks: the test loss, the argmax token of every position
(`argmax.json`) and the float32 sum and absolute sum of the predicted logits, and the dtype
the model's parameters have afterwards.
"""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import torch

import transformers as tf

OUT = Path(sys.argv[1])
HERE = Path(__file__).resolve().parent
torch.set_num_threads(2)


def sibling(stem):
    """Another reference script as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MIXED = sibling("trainer_mixed")


def run(name, rows, **kw):
    model = tf.GPT2LMHeadModel.from_pretrained(OUT / "gpt2_initial")
    args = tf.TrainingArguments(
        output_dir=str(OUT / f".tmp-{name}"),
        per_device_eval_batch_size=4,
        seed=42,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        **kw,
    )
    trainer = tf.Trainer(model=model, args=args, data_collator=tf.default_data_collator)
    metrics = trainer.evaluate(eval_dataset=MIXED.Rows(rows))
    out = trainer.predict(MIXED.Rows(rows))
    logits = torch.from_numpy(out.predictions).float()
    folder = OUT / name
    folder.mkdir()
    (folder / "argmax.json").write_text(json.dumps(logits.argmax(-1).tolist()))
    (folder / "results.json").write_text(
        json.dumps(
            {
                "eval_loss": metrics["eval_loss"],
                "test_loss": out.metrics["test_loss"],
                "logits_shape": list(logits.shape),
                "logits_sum": logits.double().sum().item(),
                "logits_abs_sum": logits.double().abs().sum().item(),
                "param_dtype": str(next(model.parameters()).dtype),
            },
            indent=1,
        )
    )
    shutil.rmtree(args.output_dir, ignore_errors=True)


def main():
    _, rows = MIXED.gpt2_setup()
    (OUT / "gpt2_blocks.json").write_text(json.dumps({"eval": rows}))
    run("bf16", rows, bf16_full_eval=True)
    run("fp16", rows, fp16_full_eval=True)
    run("fp32", rows)


if __name__ == "__main__":
    main()
