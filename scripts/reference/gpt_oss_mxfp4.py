"""Reference for gpt-oss checkpoints whose experts are MXFP4 (models/tests/it/loading.rs):
transformers 5.23 without its MXFP4 kernels, which dequantises them on load (`Mxfp4Dequantize`).

Usage: python gpt_oss_mxfp4.py OUT_DIR

decoder_families.py's tiny gpt-oss (seeded, 3 layers, 4 experts) saved with each expert weight
replaced by seeded random MXFP4 data as the released checkpoints store it
(`….gate_up_proj_blocks` uint8 `[experts, out, in / 32, 16]`, `….gate_up_proj_scales` uint8
`[experts, out, in / 32]`, scales within 2^-9 .. 2^2) and `quantization_config`
`{"quant_method": "mxfp4"}`: OUT_DIR/float32/ (the config's dtype float32) and
OUT_DIR/bfloat16/ (dtype bfloat16, the other weights in bfloat16, as the hub's).

OUT_DIR/<dtype>.safetensors: the model upstream loads from it — every expert weight
(`model.layers.{i}.mlp.experts.gate_up_proj` / `down_proj`, dequantised) and the evaluation
logits on models.py's 2 × 8 batch (row 1's last 3 tokens padded).
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import transformers as tf

HERE = Path(__file__).resolve().parent
OUT = Path(sys.argv[1])


def sibling(stem):
    spec = importlib.util.spec_from_file_location(stem, HERE / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    families = sibling("decoder_families")
    models_ref = sibling("models")
    case, config, cls = [c for c in families.cases() if c[0] == "gpt_oss"][0]
    config.output_router_logits = False
    torch.manual_seed(0)
    plain = OUT / "plain"
    cls(config).save_pretrained(plain)
    weights = load_file(str(plain / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    for dtype in ["float32", "bfloat16"]:
        folder = OUT / dtype
        folder.mkdir(parents=True)
        out = {}
        for key, t in weights.items():
            if key.endswith("experts.gate_up_proj") or key.endswith("experts.down_proj"):
                experts, inner, outer = t.shape
                out[key + "_blocks"] = torch.randint(
                    0, 256, (experts, outer, inner // 32, 16), generator=g, dtype=torch.uint8
                )
                out[key + "_scales"] = torch.randint(
                    118, 130, (experts, outer, inner // 32), generator=g, dtype=torch.uint8
                )
            else:
                out[key] = t.to(getattr(torch, dtype))
        save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((plain / "config.json").read_text())
        cfg["dtype"] = dtype
        cfg["quantization_config"] = {"quant_method": "mxfp4"}
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        model = tf.AutoModelForCausalLM.from_pretrained(folder)
        model.eval()
        ids, mask = models_ref.batch(config.vocab_size)
        tensors = {"input_ids": ids, "attention_mask": mask}
        with torch.no_grad():
            tensors["logits"] = model(input_ids=ids, attention_mask=mask).logits.float().contiguous()
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                tensors[name] = p.detach().contiguous()
        save_file(tensors, str(OUT / f"{dtype}.safetensors"))
        print(dtype, model.dtype, float(tensors["logits"].abs().mean()))


if __name__ == "__main__":
    main()
