"""Reference for models/tests/it/tokenization.rs: upstream's multilingual tokenizers
(transformers 5.23) with `src_lang` / `tgt_lang`.

Usage: python multilingual_tokenizers.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

mbart/: assets/mbart-tokenizer (mBART-cc25's vocabulary and language codes, built by setup)
  loaded with AutoTokenizer, `src_lang` / `tgt_lang` set as run_translation.py sets them.
mbart50/: `MBart50Tokenizer(vocab=...)` over the same SentencePiece vocabulary with mBART-50's
  52 language codes (mBART-50's layout; no PyPI package ships its own file): its codes go
  before the text.
OUT_DIR/multilingual_tokenizers.json: for each case, the ids of `tok(sources)` and of
`tok(text_target=targets)` (special tokens included), and the saved tokenizer folder.
"""

import json
import os
import sys
from pathlib import Path

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
SOURCES = ["UN Chief Says There Is No Military Solution in Syria", "Hello, world!", ""]
TARGETS = ["Şeful ONU declară că nu există o soluţie militară în Siria", "Bună ziua!", "x"]


def encode(tok, src, tgt):
    tok.src_lang, tok.tgt_lang = src, tgt
    return {
        "src_lang": src,
        "tgt_lang": tgt,
        "sources": tok(SOURCES)["input_ids"],
        "targets": tok(text_target=TARGETS)["input_ids"],
    }


def main():
    out = {}
    mbart = tf.AutoTokenizer.from_pretrained(ASSETS / "mbart-tokenizer")
    out["mbart"] = [encode(mbart, "en_XX", "ro_RO"), encode(mbart, "ro_RO", "de_DE")]
    vocab = [tuple(x) for x in json.loads((ASSETS / "mbart-tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]]
    base = vocab[:250001]  # XLM-R's pieces, before mBART's codes and <mask>
    mbart50 = tf.MBart50Tokenizer(vocab=base, src_lang="en_XX", tgt_lang="ro_RO")
    mbart50.save_pretrained(OUT / "mbart50")
    out["mbart50"] = [encode(mbart50, "en_XX", "ro_RO")]
    (OUT / "multilingual_tokenizers.json").write_text(json.dumps(out))


main()
