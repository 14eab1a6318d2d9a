"""Greedy decoding speed of transformers' `generate` with its key / value cache on
SmolLM2-135M (CPU, fp32): the counterpart of examples/src/bin/bench_generate.rs, for
`cargo xtask bench --generate`.

The same prompts (32-token windows of hamlet.txt tokenized by SmolLM2's tokenizer, no
padding), `max_new_tokens` = `min_new_tokens` = --new-tokens, greedy, the model's own
generation config otherwise, under `torch.no_grad()` (as `generate` runs itself). One
warm-up pass, then --passes passes; `median_ms` / `min_ms` are pass times, `tokens_per_s`
the new tokens of the median pass, `padded_len_sum` the sum of every generated id (both
sides must generate the same tokens).

Prints one flat JSON object per line, with "impl": "python".

Usage: python bench_generate.py [--threads N] [--passes N] [--new-tokens N] [--batches 1,8]
Assets: $TCHTRAIN_ASSETS or <workspace>/assets.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT_TOKENS = 32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    assets = Path(os.environ.get("TCHTRAIN_ASSETS", Path(__file__).resolve().parents[2] / "assets"))
    model_dir = assets / "smollm2-135m"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer((assets / "text" / "hamlet.txt").read_text(), add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = torch.tensor(ids[: batch * PROMPT_TOKENS]).reshape(batch, PROMPT_TOKENS)
        mask = torch.ones_like(prompts)

        def one_pass():
            t0 = time.perf_counter()
            out = model.generate(
                input_ids=prompts, attention_mask=mask, max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens, do_sample=False,
            )
            return time.perf_counter() - t0, out

        _, sequences = one_pass()
        times = [one_pass()[0] for _ in range(args.passes)]
        pass_s = statistics.median(times)
        tokens = batch * args.new_tokens
        print(json.dumps({
            "bench": f"generate/greedy_b{batch}",
            "impl": "python",
            "median_ms": pass_s * 1e3,
            "min_ms": min(times) * 1e3,
            "tokens_per_s": tokens / pass_s,
            "tokens": tokens,
            "padded_len_sum": int(sequences[:, PROMPT_TOKENS:].sum()),
            "threads": threads,
        }), flush=True)


if __name__ == "__main__":
    main()
