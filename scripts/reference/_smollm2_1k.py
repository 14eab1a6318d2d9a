"""SmolLM2's tokenizer cut to its first 1024 tokens, for the TRL references' tiny models.

Not a reference itself (`setup_assets.py` runs no script whose name starts with `_`); the TRL
scripts load it with `sibling("_smollm2_1k")` and write it into their own folder, where the Rust
tests load it.

SmolLM2-135M's `tokenizer.json` is a byte-level BPE whose ids are its 17 special tokens, its
256 byte symbols, then one token per merge in merge order. Keeping the ids below 1024 and the
merges whose two parts and result are all kept leaves the first 772 merges, in order: the same
tokenizer as far as it goes (the same pre-tokenizer, specials, chat template and
`tokenizer_config.json`), whose words split into more, shorter pieces. At 49152 tokens the
tiny models' head and its log-softmax were most of the references' and the tests' time (a DPO
case 6.6 s → 1.6 s in Python at 1024).
"""

import json
import os
import shutil
from pathlib import Path

VOCAB = 1024
SOURCE = Path(os.environ["TCHTRAIN_ASSETS"]) / "smollm2-135m"


def write(dest):
    """Writes the cut tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja)
    into `dest` and returns `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    full = json.loads((SOURCE / "tokenizer.json").read_text(encoding="utf-8"))
    model = full["model"]
    assert model["type"] == "BPE", model["type"]
    vocab = {token: i for token, i in model["vocab"].items() if i < VOCAB}
    merges = [m for m in model["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    # The kept merges are the full list's first ones: nothing later makes a kept token.
    assert merges == model["merges"][: len(merges)], "kept merges are not a prefix"
    assert all(t["id"] < VOCAB for t in full["added_tokens"]), "a special token past the cut"
    model["vocab"], model["merges"] = vocab, merges
    (dest / "tokenizer.json").write_text(json.dumps(full, ensure_ascii=False), encoding="utf-8")
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(SOURCE / name, dest / name)
    return dest
