"""Reference for the Whisper tokenizer (models/tests/it/audio.rs): transformers 5.23's
WhisperTokenizer of the tiny-whisper asset.

Usage: python whisper_tokenizer.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

OUT_DIR/tokenizer.json (a JSON file of cases, not a tokenizer): `encode`: for each prefix
setting (`[language, task, predict_timestamps]`, applied with `set_prefix_tokens` on a fresh
tokenizer) the `input_ids` of the speech asset's sentences; `decode`: id lists (a transcript
after Whisper's prompt, timestamps, a <|startofprev|> prompt, a prompt without
<|startoftranscript|>) with `decode(ids, skip_special_tokens)` for both values.
"""

import json
import os
import sys
from pathlib import Path

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    sentences = (ASSETS / "speech" / "sentences.txt").read_text().splitlines()
    settings = [[None, None, None], ["en", "transcribe", None], ["french", "translate", True], ["de", None, None]]
    encode = []
    for language, task, timestamps in settings:
        tok = tf.AutoTokenizer.from_pretrained(ASSETS / "tiny-whisper")
        tok.set_prefix_tokens(language=language, task=task, predict_timestamps=timestamps)
        encode.append({"setting": [language, task, timestamps], "ids": [tok(s).input_ids for s in sentences]})
    tok = tf.AutoTokenizer.from_pretrained(ASSETS / "tiny-whisper")
    hello = tok("hello world, this is it", add_special_tokens=False).input_ids
    lists = [
        [50257, 50258, 50359, 50363, *hello, 50256],
        [50257, 50258, 50359, 50364, *hello, 50400, 50256, 50256],
        [50361, 1212, 318, 50257, 50258, *hello, 50256],
        [50361, 1212, 318, *hello],
        [],
    ]
    decode = [
        {"ids": ids, "skip": skip, "text": tok.decode(ids, skip_special_tokens=skip)}
        for ids in lists
        for skip in (True, False)
    ]
    (OUT / "tokenizer.json").write_text(json.dumps({"encode": encode, "decode": decode}, indent=1))


if __name__ == "__main__":
    main()
