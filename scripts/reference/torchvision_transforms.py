"""Reference for the torchvision transforms upstream's run_image_classification.py applies
(models/tests/it/vision.rs): torchvision 0.28's RandomResizedCrop, RandomHorizontalFlip,
Resize, CenterCrop, ToTensor and Normalize on PIL images (Pillow 13.0), drawing from torch's
global generator.

Usage: python torchvision_transforms.py OUT_DIR

OUT_DIR/images/{i}.png: 5 RGB images (17x23 ... 48x40, numpy `RandomState(3)` noise over
gradients; image 4 is gray, mode L). OUT_DIR/transforms.safetensors, with ImageNet's mean / std:
  train.{seed}.{i}   after `torch.manual_seed(seed)` (seeds 0-5), the images in order through
                     Compose([RandomResizedCrop((30, 30)), RandomHorizontalFlip(), ToTensor(),
                     Normalize]) (each `.convert("RGB")` first, as the script does)
  after.{seed}       `torch.rand(4)` drawn after them (the generator's state)
  fallback.{i}       RandomResizedCrop((30, 30), scale=(5.0, 6.0)) (no attempt fits: the central
                     crop of the ratio-bounded fallback), ToTensor, after `torch.manual_seed(7)`
  eval.{i}           Compose([Resize((30, 30)), CenterCrop((30, 30)), ToTensor(), Normalize])
  short.{i}          Compose([Resize(30), CenterCrop(30), ToTensor(), Normalize]): the shortest
                     edge to 30, the long one `int(30 * long / short)`, the center cropped
  pad.{i}            Compose([CenterCrop(44), ToTensor()]): images smaller than the crop padded
                     with 0 first
"""

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from torchvision.transforms import (
    CenterCrop, Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize, ToTensor,
)

OUT = Path(sys.argv[1])
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def images():
    rng = np.random.RandomState(3)
    (OUT / "images").mkdir(parents=True, exist_ok=True)
    sizes = [(17, 23), (48, 40), (30, 30), (41, 13), (25, 36)]
    paths = []
    for i, (w, h) in enumerate(sizes):
        y, x = np.mgrid[0:h, 0:w]
        img = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], -1)
        img = np.clip(img + rng.randint(-40, 40, img.shape), 0, 255).astype(np.uint8)
        im = Image.fromarray(img, "RGB")
        if i == 4:
            im = im.convert("L")
        p = OUT / "images" / f"{i}.png"
        im.save(p)
        paths.append(p)
    return paths


def main():
    paths = images()
    pil = [Image.open(p) for p in paths]
    out = {}
    train = Compose([RandomResizedCrop((30, 30)), RandomHorizontalFlip(), ToTensor(), Normalize(MEAN, STD)])
    for seed in range(6):
        torch.manual_seed(seed)
        for i, im in enumerate(pil):
            out[f"train.{seed}.{i}"] = train(im.convert("RGB"))
        out[f"after.{seed}"] = torch.rand(4)
    torch.manual_seed(7)
    fallback = Compose([RandomResizedCrop((30, 30), scale=(5.0, 6.0)), ToTensor()])
    for i, im in enumerate(pil):
        out[f"fallback.{i}"] = fallback(im.convert("RGB"))
    evaluation = Compose([Resize((30, 30)), CenterCrop((30, 30)), ToTensor(), Normalize(MEAN, STD)])
    short = Compose([Resize(30), CenterCrop(30), ToTensor(), Normalize(MEAN, STD)])
    pad = Compose([CenterCrop(44), ToTensor()])
    for i, im in enumerate(pil):
        rgb = im.convert("RGB")
        out[f"eval.{i}"] = evaluation(rgb)
        out[f"short.{i}"] = short(rgb)
        out[f"pad.{i}"] = pad(rgb)
    save_file({k: v.contiguous() for k, v in out.items()}, OUT / "transforms.safetensors")


if __name__ == "__main__":
    main()
