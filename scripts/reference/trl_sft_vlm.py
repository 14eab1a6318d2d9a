"""Reference for TRL's SFTTrainer on a vision-language model (trl/tests/it/sft_vlm.rs): trl 1.16
over transformers 5.23, the tiny-gemma3 asset (Gemma3ForConditionalGeneration, Gemma3Processor).

Usage: python trl_sft_vlm.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/vlm/{train,test}.parquet: 24 rows (20 train, 4 test) of `messages` (a user question and
the assistant's answer, every fourth row with a system message) and `images` (`datasets`'
List(Image()), the PNG bytes embedded): one image a row, two on every fifth row, none on every
seventh; the images are smooth gradients with noise (numpy `RandomState(0)`) of sizes from
17x23 to 48x40, every sixth one grayscale (converted to RGB by the processor), images 0 and 9
already 28x28 (no resize).

OUT_DIR/processor.safetensors: the image processor's `pixel_values` of each image alone
(`image.{i}`, upstream's default backend: torchvision, as AutoProcessor picks it when
torchvision is installed), and TRL's DataCollatorForVisionLanguageModeling on the train rows in
batches of 4 (`batch.{k}.input_ids`, `attention_mask`, `token_type_ids`, `pixel_values`,
`labels`).

OUT_DIR/run/: `SFTTrainer(model=<tiny-gemma3>, args, train_dataset, eval_dataset)` (the processor
loaded by TRL with AutoProcessor) trained 20 steps (batch 4, lr 1e-3, logging every 5 steps,
evaluation every 10, seed 42, float32, TRL's default gradient checkpointing): `log_history.json`,
`train_output.json`, `model/` (the trained model, saved).
"""

import json
import os
import sys
from io import BytesIO
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

import transformers as tf
from datasets import Dataset, Features, List, Value, load_dataset
from datasets import Image as DatasetImage
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
MODEL = ASSETS / "tiny-gemma3"
torch.set_num_threads(2)


def images():
    rs = np.random.RandomState(0)
    out = []
    for i in range(30):
        h, w = (28, 28) if i in (0, 9) else (17 + (i * 7) % 32, 23 + (i * 5) % 26)
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / (h + w)], -1)
        img = Image.fromarray(np.clip(base + rs.normal(0, 30, size=(h, w, 3)), 0, 255).astype(np.uint8), "RGB")
        if i % 6 == 5:
            img = img.convert("L")
        buf = BytesIO()
        img.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def rows(pngs):
    result, k = [], 0
    for i in range(24):
        n = 0 if i % 7 == 6 else 2 if i % 5 == 4 else 1
        imgs = [{"bytes": pngs[k + j], "path": None} for j in range(n)]
        k += n
        messages = [
            {"role": "user", "content": f"What does picture {i} show?"},
            {"role": "assistant", "content": f"A gradient with noise, number {i}; it has {n} parts."},
        ]
        if i % 4 == 1:
            messages = [{"role": "system", "content": "Answer briefly."}] + messages
        result.append({"messages": messages, "images": imgs})
    return result


def main():
    pngs = images()
    features = Features({
        "messages": List({"role": Value("string"), "content": Value("string")}),
        "images": List(DatasetImage()),
    })
    data = rows(pngs)
    (OUT / "vlm").mkdir()
    Dataset.from_list(data[:20], features=features).to_parquet(str(OUT / "vlm" / "train.parquet"))
    Dataset.from_list(data[20:], features=features).to_parquet(str(OUT / "vlm" / "test.parquet"))
    ds = load_dataset(str(OUT / "vlm"))

    processor = tf.AutoProcessor.from_pretrained(MODEL)
    assert type(processor.image_processor).__name__ == "Gemma3ImageProcessor", type(processor.image_processor)
    t = {}
    for i, png in enumerate(pngs):
        t[f"image.{i}"] = processor.image_processor(images=[Image.open(BytesIO(png))], return_tensors="pt")[
            "pixel_values"
        ][0].contiguous()
    collator = DataCollatorForVisionLanguageModeling(processor=processor)
    train = ds["train"]
    for k in range(5):
        batch = collator([dict(train[j]) for j in range(4 * k, 4 * k + 4)])
        for key, v in batch.items():
            t[f"batch.{k}.{key}"] = v.contiguous()
    save_file(t, str(OUT / "processor.safetensors"))

    run = OUT / "run"
    run.mkdir()
    args = SFTConfig(
        output_dir=str(OUT / ".tmp-run"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=20, learning_rate=1e-3, logging_steps=5, eval_strategy="steps", eval_steps=10,
        save_strategy="no", seed=42, use_cpu=True, report_to="none", disable_tqdm=True, bf16=False,
    )
    trainer = SFTTrainer(model=str(MODEL), args=args, train_dataset=ds["train"], eval_dataset=ds["test"])
    result = trainer.train()
    (run / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (run / "train_output.json").write_text(
        json.dumps({"global_step": result.global_step, "training_loss": result.training_loss,
                    "total_flos": trainer.state.total_flos}, indent=1)
    )
    trainer.save_model(str(run / "model"))
    print(trainer.state.log_history[-1])


if __name__ == "__main__":
    main()
