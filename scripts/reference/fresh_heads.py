"""Reference for models/tests: the weights `from_pretrained` initialises because the
checkpoint lacks them (a new head on a pretrained body), after `set_seed(42)`.

Usage: python fresh_heads.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

For each case, OUT_DIR/<case>.safetensors holds every parameter the load report lists as
missing, as transformers 5.23 initialised it, and `next_draw`: `torch.randn(4)` right after
`from_pretrained`, which shows where the global generator was left.
"""

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
OUT.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(2)

CASES = [
    # case, asset, auto class, kwargs
    ("minilm_sequence_classification", "minilm", tf.AutoModelForSequenceClassification, {"num_labels": 2}),
    ("minilm_token_classification", "minilm", tf.AutoModelForTokenClassification, {"num_labels": 5}),
    ("minilm_masked_lm", "minilm", tf.AutoModelForMaskedLM, {}),
    ("gpt2_sequence_classification", "tiny-gpt2", tf.AutoModelForSequenceClassification, {"num_labels": 3}),
]

for case, asset, cls, kwargs in CASES:
    tf.set_seed(42)
    model, info = cls.from_pretrained(ASSETS / asset, output_loading_info=True, **kwargs)
    next_draw = torch.randn(4)
    params = dict(model.named_parameters(remove_duplicate=False))
    missing = sorted(set(info["missing_keys"]))
    tensors = {k: params[k].detach().clone().contiguous() for k in missing if k in params}
    tensors["next_draw"] = next_draw
    save_file(tensors, str(OUT / f"{case}.safetensors"))
    print(case, "missing:", missing)
