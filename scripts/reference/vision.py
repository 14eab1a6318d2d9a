"""Reference for the vision models (models/tests/it/vision.rs, trainer/tests/it/vision.rs):
transformers 5.23's ViTForImageClassification and SiglipForImageClassification, and their image
processors on the PIL backend (ViTImageProcessorPil, SiglipImageProcessorPil: what transformers
uses without torchvision).

Usage: python vision.py OUT_DIR

OUT_DIR/images/{i}.png: 24 RGB images of sizes from 17x23 to 48x40 (smooth gradients with
noise, numpy `RandomState(0)`), their labels `i % 3`. OUT_DIR/pil_resize.safetensors: PIL's own
`Image.resize` of images 0-5 (as RGB and as L) by NEAREST, LANCZOS, BILINEAR and BICUBIC to
30x30, 13x41 and 64x48 (uint8, `{i}.{mode}.{filter}.{w}x{h}`). OUT_DIR/images.parquet: the
images as `datasets`' `Image` column (`{bytes, path}`, the PNG bytes embedded) and `label`.

For each model (OUT_DIR/vit/, OUT_DIR/siglip/):
  model/            the tiny classifier (hidden 32, 2 layers, 4 heads, MLP 37, 30x30 images in
                    6x6 patches, 3 labels; ViT with dropout 0.1 in the hidden states and the
                    attention, SigLIP with attention dropout 0.1), drawn after
                    `torch.manual_seed(0)`, saved (ViT: the checkpoint's legacy names,
                    `vit.encoder.layer.{i}.attention.attention.query`, ...)
  processor/        the image processor (30x30; ViT bilinear, SigLIP bicubic with RGB
                    conversion) and `pixel_values.safetensors`: its `pixel_values` [24, 3, 30, 30]
  forward.safetensors  in evaluation mode, on images 0-3 with their labels: `logits`, `loss`,
                    and `grad.<name>` of every parameter that gets one (checkpoint names)
  trainer/          `Trainer(model, args, train_dataset=images 0-15, eval_dataset=images 16-23,
                    data_collator=default_data_collator)` on those pixel values: 20 steps of
                    batches of 4 at lr 1e-3 (dropout on), logged every 5, evaluated every 10,
                    seed 42: `log_history.json` and `model/` (the trained model, saved)
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import transformers as tf
from datasets import Dataset
from datasets import Features, Value
from datasets import Image as DatasetImage
from safetensors.torch import save_file

OUT = Path(sys.argv[1])
torch.set_num_threads(2)

LEGACY = [
    ("vit.layers.", "vit.encoder.layer."),
    ("attention.q_proj", "attention.attention.query"),
    ("attention.k_proj", "attention.attention.key"),
    ("attention.v_proj", "attention.attention.value"),
    ("attention.o_proj", "attention.output.dense"),
    ("mlp.fc1", "intermediate.dense"),
    ("mlp.fc2", "output.dense"),
]


def legacy(name):
    for a, b in LEGACY:
        name = name.replace(a, b)
    return name


def images():
    (OUT / "images").mkdir()
    rs = np.random.RandomState(0)
    paths = []
    for i in range(24):
        h, w = 17 + (i * 7) % 32, 23 + (i * 5) % 26
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / (h + w)], -1)
        img = np.clip(base + rs.normal(0, 30, size=(h, w, 3)), 0, 255).astype(np.uint8)
        path = OUT / "images" / f"{i}.png"
        Image.fromarray(img, "RGB").save(path)
        paths.append(path)
    return paths


def run(name, model_class, config, processor, paths, rename=lambda n: n):
    out = OUT / name
    out.mkdir()
    torch.manual_seed(0)
    model_class(config).save_pretrained(out / "model")

    processor.save_pretrained(out / "processor")
    pixels = processor([Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]
    save_file({"pixel_values": pixels.contiguous()}, out / "processor" / "pixel_values.safetensors")
    labels = torch.tensor([i % 3 for i in range(24)])

    model = model_class.from_pretrained(out / "model")
    model.eval()
    result = model(pixel_values=pixels[:4], labels=labels[:4])
    result.loss.backward()
    tensors = {"logits": result.logits.detach().contiguous(), "loss": result.loss.detach().reshape(1)}
    for pname, p in model.named_parameters():
        if p.grad is not None:
            tensors[f"grad.{rename(pname)}"] = p.grad.contiguous()
    save_file(tensors, out / "forward.safetensors")

    def dataset(lo, hi):
        ds = Dataset.from_dict({"pixel_values": pixels[lo:hi].numpy(), "labels": labels[lo:hi].tolist()})
        return ds.with_format("numpy")

    (out / "trainer").mkdir()
    model = model_class.from_pretrained(out / "model")
    args = tf.TrainingArguments(
        output_dir=str(OUT / f".tmp-{name}"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=20, learning_rate=1e-3, logging_steps=5, eval_strategy="steps", eval_steps=10,
        save_strategy="no", seed=42, use_cpu=True, report_to="none", disable_tqdm=True,
    )
    trainer = tf.Trainer(
        model=model, args=args, train_dataset=dataset(0, 16), eval_dataset=dataset(16, 24),
        data_collator=tf.default_data_collator,
    )
    trainer.train()
    (out / "trainer" / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    trainer.save_model(str(out / "trainer" / "model"))
    shutil.rmtree(args.output_dir, ignore_errors=True)
    print(name, trainer.state.log_history[-2])


def main():
    paths = images()
    # PIL's own resize of the first 6 images (as RGB and as L) by each filter to a few sizes.
    resized = {}
    for i, p in enumerate(paths[:6]):
        for mode in ("RGB", "L"):
            img = Image.open(p).convert(mode)
            for f in (0, 1, 2, 3):
                for w, h in ((30, 30), (13, 41), (64, 48)):
                    arr = np.array(img.resize((w, h), resample=f))
                    resized[f"{i}.{mode}.{f}.{w}x{h}"] = torch.from_numpy(arr.copy())
    save_file(resized, OUT / "pil_resize.safetensors")
    # The images as a `datasets` Image column in Parquet (their PNG bytes embedded).
    table = Dataset.from_dict(
        {"image": [{"bytes": p.read_bytes(), "path": p.name} for p in paths], "label": [i % 3 for i in range(24)]},
        features=Features({"image": DatasetImage(), "label": Value("int64")}),
    )
    table.to_parquet(OUT / "images.parquet")

    vit = tf.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        image_size=30, patch_size=6, num_labels=3, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    run(
        "vit", tf.ViTForImageClassification, vit, tf.ViTImageProcessorPil(size={"height": 30, "width": 30}),
        paths, rename=legacy,
    )
    siglip = tf.SiglipConfig(
        vision_config=dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            image_size=30, patch_size=6, attention_dropout=0.1,
        ),
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20),
        num_labels=3,
    )
    run(
        "siglip", tf.SiglipForImageClassification, siglip,
        tf.SiglipImageProcessorPil(size={"height": 30, "width": 30}), paths,
    )


if __name__ == "__main__":
    main()
