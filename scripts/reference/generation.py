"""Reference for models/tests: transformers 5.23's `generate()` on decoder-only models.

Usage: python generation.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

Every case loads a tiny model from the assets (tiny-llama, tiny-gpt2) in evaluation mode,
with two intra-op threads, and calls `model.generate(input_ids, attention_mask=...,
**kwargs, output_scores=True, return_dict_in_generate=True)`, the seed set right before it.
OUT_DIR/cases.json lists the cases (model, kwargs, seed); OUT_DIR/<case>.safetensors holds
input_ids, attention_mask, sequences and scores (the processed scores of each step, stacked
[steps, rows, vocab]). With `use_cache` false upstream recomputes the whole sequence each
step (what the Rust side does: the scores equal to the bit); each case is also run with the
cache (`cached_sequences`, `cached_scores`: the same tokens, scores within a few 1e-8).

  llama_greedy        one prompt, greedy, 12 new tokens, repetition_penalty 1.5,
                      no_repeat_ngram_size 2
  llama_sample        two prompts, the second left-padded, sampling with temperature 0.8,
                      top_k 20, top_p 0.9, repetition_penalty 1.3, no_repeat_ngram_size 3
  llama_min_p         one prompt, sampling with min_p 0.2 and the default top_k 50
  gpt2_eos            two prompts (left padding), greedy, end-of-sequence ids: the first row
                      ends at its second new token (then filled with the pad id), the second
                      row's first choice is an end-of-sequence id held back by min_new_tokens
  gpt2_return_seqs    one prompt, sampling with num_return_sequences 3, max_length 16
  llama_beam          two prompts (one left-padded), beam search with 3 beams, 2 returned
                      (sequences_scores saved too)
  gpt2_beam_eos       two prompts, 4 beams, early_stopping True, length_penalty 2.0,
                      end-of-sequence ids and pad id 0 (which upstream's fill treats as unset),
                      no_repeat_ngram_size 2
  llama_beam_sample   beam sampling: 2 beams, early_stopping "never", length_penalty 0.5,
                      top_k 20, temperature 0.9

and OUT_DIR/run_generation.json: the texts upstream's run_generation.py prints for SmolLM2-135M
(see run_generation_script).
"""

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
torch.set_num_threads(2)
OUT.mkdir(parents=True, exist_ok=True)


def model(name):
    cls = tf.GPT2LMHeadModel if name == "tiny-gpt2" else tf.LlamaForCausalLM
    return cls.from_pretrained(ASSETS / name).eval()


def run(case, name, ids, mask, kwargs, seed=0):
    m = model(name)
    out = {}
    for cached in (False, True):
        torch.manual_seed(seed)
        g = m.generate(
            input_ids=ids, attention_mask=mask, use_cache=cached,
            output_scores=True, return_dict_in_generate=True, **kwargs,
        )
        prefix = "cached_" if cached else ""
        out[prefix + "sequences"] = g.sequences
        out[prefix + "scores"] = torch.stack(g.scores)
        if getattr(g, "sequences_scores", None) is not None:
            out[prefix + "sequences_scores"] = g.sequences_scores
    assert torch.equal(out["sequences"], out["cached_sequences"]), case
    save_file(
        {"input_ids": ids, "attention_mask": mask, **{k: v.contiguous() for k, v in out.items()}},
        str(OUT / f"{case}.safetensors"),
    )
    print(case, out["sequences"].tolist())
    return {"model": name, "kwargs": kwargs, "seed": seed}


def main():
    cases = {}
    ones = lambda ids: torch.ones_like(ids)
    ids = torch.tensor([[1, 45, 300, 17, 9]])
    cases["llama_greedy"] = run("llama_greedy", "tiny-llama", ids, ones(ids), dict(
        max_new_tokens=12, repetition_penalty=1.5, no_repeat_ngram_size=2,
    ))
    ids = torch.tensor([[1, 45, 300, 17, 9, 77], [0, 0, 1, 88, 5, 120]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    cases["llama_sample"] = run("llama_sample", "tiny-llama", ids, mask, dict(
        max_new_tokens=10, do_sample=True, temperature=0.8, top_k=20, top_p=0.9,
        repetition_penalty=1.3, no_repeat_ngram_size=3,
    ), seed=7)
    ids = torch.tensor([[1, 45, 300, 17]])
    cases["llama_min_p"] = run("llama_min_p", "tiny-llama", ids, ones(ids), dict(
        max_new_tokens=8, do_sample=True, min_p=0.2, repetition_penalty=1.1,
    ), seed=3)
    # 7171 ends the first row at its second new token; 588, the second row's first choice,
    # is held back by min_new_tokens.
    ids = torch.tensor([[464, 3290, 318, 257], [0, 0, 40, 588]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    cases["gpt2_eos"] = run("gpt2_eos", "tiny-gpt2", ids, mask, dict(
        max_new_tokens=9, eos_token_id=[7171, 588, 50256], pad_token_id=0, min_new_tokens=1,
    ))
    ids = torch.tensor([[464, 3290, 318]])
    cases["gpt2_return_seqs"] = run("gpt2_return_seqs", "tiny-gpt2", ids, ones(ids), dict(
        max_length=16, do_sample=True, num_return_sequences=3, pad_token_id=50256,
    ), seed=11)
    # Beam search.
    ids = torch.tensor([[1, 45, 300, 17, 9, 77], [0, 0, 1, 88, 5, 120]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    cases["llama_beam"] = run("llama_beam", "tiny-llama", ids, mask, dict(
        max_new_tokens=8, num_beams=3, num_return_sequences=2,
    ))
    ids = torch.tensor([[464, 3290, 318, 257], [0, 0, 40, 588]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    cases["gpt2_beam_eos"] = run("gpt2_beam_eos", "tiny-gpt2", ids, mask, dict(
        max_new_tokens=9, num_beams=4, early_stopping=True, length_penalty=2.0,
        eos_token_id=[7171, 588, 50256], pad_token_id=0, no_repeat_ngram_size=2,
    ))
    ids = torch.tensor([[1, 45, 300, 17], [1, 88, 5, 120]])
    cases["llama_beam_sample"] = run("llama_beam_sample", "tiny-llama", ids, torch.ones_like(ids), dict(
        max_new_tokens=6, num_beams=2, do_sample=True, early_stopping="never", length_penalty=0.5,
        top_k=20, temperature=0.9,
    ), seed=5)
    (OUT / "cases.json").write_text(json.dumps(cases, indent=1))
    run_generation_script()


def run_generation_script():
    """upstream run_generation.py's generation on SmolLM2-135M (its steps, without argparse):
    --model_type llama --prompt "To be, or not to be: that is" --length 24 --k 50
    --temperature 0.7 --num_return_sequences 2 --stop_token "." (seed 42, p 0.9)."""
    folder = ASSETS / "smollm2-135m"
    tok = tf.AutoTokenizer.from_pretrained(folder)
    m = tf.AutoModelForCausalLM.from_pretrained(folder)
    torch.manual_seed(42)
    prompt = "To be, or not to be: that is"
    encoded = tok.encode(prompt, add_special_tokens=False, return_tensors="pt")
    out = m.generate(
        input_ids=encoded, max_length=24 + len(encoded[0]), temperature=0.7, top_k=50, top_p=0.9,
        repetition_penalty=1.0, do_sample=True, num_return_sequences=2,
    )
    texts = []
    for seq in out:
        text = tok.decode(seq.tolist(), clean_up_tokenization_spaces=True)
        text = text[: text.find(".")]
        texts.append(prompt + text[len(tok.decode(encoded[0], clean_up_tokenization_spaces=True)) :])
    (OUT / "run_generation.json").write_text(json.dumps(texts, indent=1))
    print("run_generation", texts)


if __name__ == "__main__":
    main()
