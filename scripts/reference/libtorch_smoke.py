"""Reference for tchtrain/tests/libtorch.rs: a matmul, a tanh, a softmax and a backward pass.

Inputs are built from arange so the Rust test constructs the very same tensors.
Usage: python libtorch_smoke.py OUT_DIR  (writes OUT_DIR/libtorch_smoke.json)
"""

import json
import sys
from pathlib import Path

import torch

torch.set_default_dtype(torch.float32)
x = (torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10.0 - 0.5).requires_grad_(True)
w = (torch.arange(8, dtype=torch.float32).reshape(4, 2) / 7.0 - 0.3).requires_grad_(True)
h = torch.tanh(x @ w)
p = torch.softmax(h, dim=-1)
loss = (p[:, 0] * torch.arange(1, 4, dtype=torch.float32)).sum() + (h**2).mean()
loss.backward()

out = {
    "torch_version": torch.__version__,
    "h": h.detach().flatten().tolist(),
    "loss": loss.item(),
    "x_grad": x.grad.flatten().tolist(),
    "w_grad": w.grad.flatten().tolist(),
}
Path(sys.argv[1], "libtorch_smoke.json").write_text(json.dumps(out, indent=2))
