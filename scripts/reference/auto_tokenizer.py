"""Reference for models/tests/it/tokenization.rs: which tokenizer class transformers 5.23's
AutoTokenizer picks for a model folder, and its ids.

Usage: python auto_tokenizer.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Model folders made from GPT-2's vocab.json + merges.txt (or the tokenizer.json
GPT2TokenizerFast saves from them) under OUT_DIR/<case>/ with a config.json naming the model
type and a tokenizer_config.json naming the class:

  qwen2_vocab_merges   qwen2, vocab.json + merges.txt, "GPT2Tokenizer" -> Qwen2Tokenizer
  qwen2_json           qwen2, tokenizer.json, "PreTrainedTokenizerFast" -> Qwen2Tokenizer
  qwen2_json_added     qwen2, tokenizer.json with an added special token, no class named
  qwen3_vocab_merges   qwen3, vocab.json + merges.txt, "GPT2Tokenizer" -> GPT2Tokenizer
  qwen3_5_json         qwen3_5, tokenizer.json, "PreTrainedTokenizerFast" -> Qwen3_5Tokenizer
                       (its pattern keeps combining marks with their letters; from vocab.json +
                       merges.txt upstream's class keeps only its placeholder vocabulary)
  qwen3_5_text_json    qwen3_5_text, tokenizer.json, "PreTrainedTokenizerFast" -> the file's own
                       (qwen3_5_text is not among the model types whose hub class is wrong)
  llama_json           llama, tokenizer.json, "PreTrainedTokenizerFast" -> the file's own

OUT_DIR/ids.json: per case the class, the ids of hamlet.txt's first 3000 characters and of a
line with digits, contractions, a decomposed accent and Devanagari (combining marks), and the pad token's id.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
LINE = "In 1603 HE'S 42 o'clock: Cafe\u0301 — it'LL   do\n\n ok \u0928\u092e\u0938\u094d\u0924\u0947"


def main():
    gpt2 = ASSETS / "gpt2-tokenizer"
    fast = tf.GPT2TokenizerFast(vocab=str(gpt2 / "vocab.json"), merges=str(gpt2 / "merges.txt"))
    tokenizer_json = OUT / "gpt2_tokenizer.json"
    fast.backend_tokenizer.save(str(tokenizer_json))
    added = tf.GPT2TokenizerFast(vocab=str(gpt2 / "vocab.json"), merges=str(gpt2 / "merges.txt"))
    added.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    added_json = OUT / "gpt2_added_tokenizer.json"
    added.backend_tokenizer.save(str(added_json))
    cases = [
        ("qwen2_vocab_merges", "qwen2", None, "GPT2Tokenizer"),
        ("qwen2_json", "qwen2", tokenizer_json, "PreTrainedTokenizerFast"),
        ("qwen2_json_added", "qwen2", added_json, None),
        ("qwen3_vocab_merges", "qwen3", None, "GPT2Tokenizer"),
        ("qwen3_5_json", "qwen3_5", tokenizer_json, "PreTrainedTokenizerFast"),
        ("qwen3_5_text_json", "qwen3_5_text", tokenizer_json, "PreTrainedTokenizerFast"),
        ("llama_json", "llama", tokenizer_json, "PreTrainedTokenizerFast"),
    ]
    text = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8")[:3000]
    out = {}
    for case, model_type, json_file, cls in cases:
        folder = OUT / case
        folder.mkdir()
        if json_file is None:
            for f in ("vocab.json", "merges.txt"):
                shutil.copy(gpt2 / f, folder / f)
        else:
            shutil.copy(json_file, folder / "tokenizer.json")
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        if cls is not None:
            (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": cls}))
        tok = tf.AutoTokenizer.from_pretrained(folder)
        out[case] = {
            "class": type(tok).__name__,
            "hamlet": tok(text)["input_ids"],
            "line": tok(LINE + " <|im_start|>")["input_ids"],
            "pad_token_id": tok.pad_token_id,
        }
        print(case, out[case]["class"], len(out[case]["hamlet"]))
    (OUT / "ids.json").write_text(json.dumps({"line": LINE + " <|im_start|>", **out}))


if __name__ == "__main__":
    main()
