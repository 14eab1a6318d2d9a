"""Reference for collators/tests/parity.rs: every collator of transformers.data.data_collator.

Tokenizes lines of hamlet.txt with the real tokenizers of the assets folder (minilm = BERT
WordPiece, smollm2-135m = Llama BPE, gpt2-tokenizer = GPT-2 byte-level BPE), collates them with
upstream's collators, and records the features fed in and every output tensor. Masked LM runs
with fixed seeds (upstream's private torch.Generator), twice in a row to follow the generator
across batches, and once on the global generator after torch.manual_seed. TRL's padding-free
collator (trl 1.16.0) runs on rows packed by its `pack_dataset`.

Usage: python collators.py OUT_DIR
Writes OUT_DIR/collators.json (tokenizer facts, encodings, cases: collator, options, features,
output keys) and OUT_DIR/collators.safetensors (outputs, named "<case>.<key>").
"""

import json
import os
import sys
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.torch import save_file
from trl import pack_dataset
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TrlLanguageModeling
from transformers import (
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    DataCollatorForLanguageModeling,
    DataCollatorForMultipleChoice,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    GPT2Tokenizer,
    default_data_collator,
)

out_dir = Path(sys.argv[1])
assets = Path(os.environ.get("TCHTRAIN_ASSETS", Path(__file__).resolve().parents[2] / "assets"))
toks = {
    "bert": AutoTokenizer.from_pretrained(str(assets / "minilm")),
    "llama": AutoTokenizer.from_pretrained(str(assets / "smollm2-135m")),
    "gpt2": GPT2Tokenizer.from_pretrained(str(assets / "gpt2-tokenizer")),
}
toks["gpt2"].pad_token = toks["gpt2"].eos_token  # the usual causal-LM setup

lines = [l.strip() for l in (assets / "text" / "hamlet.txt").read_text().splitlines() if len(l.strip()) > 20]
texts = lines[100:112]

tensors: dict[str, torch.Tensor] = {}
cases: list[dict] = []


def to_jsonable(features):
    out = []
    for f in features:
        d = {}
        for k, v in f.items():
            if isinstance(v, torch.Tensor):
                v = v.tolist()
            if k == "offset_mapping":
                v = [list(x) for x in v]
            d[k] = v
        out.append(d)
    return out


def record(name, collator, tokenizer, options, features, batch, padding_side="right", extra=None):
    keys = []
    for k, v in batch.items():
        if v is None:
            continue
        if isinstance(v, torch.Tensor):
            tensors[f"{name}.{k}"] = v.clone()
            keys.append(k)
    ints = {k: v for k, v in batch.items() if isinstance(v, int)}
    case = {"name": name, "collator": collator, "tokenizer": tokenizer, "options": options,
            "padding_side": padding_side, "features": features, "keys": keys, "ints": ints}
    if extra:
        case.update(extra)
    cases.append(case)


def encode(tok, texts, **kw):
    return [dict(tok(t, **kw)) for t in texts]


bert, llama, gpt2 = toks["bert"], toks["llama"], toks["gpt2"]
g = torch.Generator().manual_seed(0)

# ---------------------------------------------------------------- default_data_collator
feats = encode(bert, texts[:4], padding="max_length", max_length=24, truncation=True)
for i, f in enumerate(feats):
    f["label"] = i % 3
record("default_class", "default", "bert", {}, to_jsonable(feats), default_data_collator(feats))
feats = encode(llama, texts[:3], padding="max_length", max_length=20, truncation=True)
for i, f in enumerate(feats):
    f["label"] = 0.25 * i - 0.1
record("default_float", "default", "llama", {}, to_jsonable(feats), default_data_collator(feats))
feats = [{"input_ids": f["input_ids"], "label_ids": [1, 0, 1, 1]} for f in feats]
record("default_label_ids", "default", "llama", {}, to_jsonable(feats), default_data_collator(feats))

# ---------------------------------------------------------------- DataCollatorWithPadding
for name, tokname, opts, side in [
    ("padding_longest", "bert", {}, "right"),
    ("padding_max_length", "bert", {"padding": "max_length", "max_length": 40}, "right"),
    ("padding_multiple_of", "bert", {"pad_to_multiple_of": 8}, "right"),
    ("padding_left", "llama", {"pad_to_multiple_of": 4}, "left"),
    ("padding_model_max_length", "bert", {"padding": "max_length"}, "right"),
]:
    tok = toks[tokname]
    tok.padding_side = side
    feats = encode(tok, texts[2:6])
    for i, f in enumerate(feats):
        f["label"] = i % 2
    collator = DataCollatorWithPadding(tok, **opts)
    record(name, "with_padding", tokname, opts, to_jsonable(feats), collator([dict(f) for f in feats]), side)
    tok.padding_side = "right"
# question answering's answer positions (run_qa's columns): stacked as int64 [batch]
feats = encode(bert, texts[2:6])
for i, f in enumerate(feats):
    f["start_positions"], f["end_positions"] = i + 1, 2 * i + 3
record("padding_qa", "with_padding", "bert", {}, to_jsonable(feats), DataCollatorWithPadding(bert)([dict(f) for f in feats]))
feats = encode(bert, texts[:3], padding="max_length", max_length=24, truncation=True)
for i, f in enumerate(feats):
    f["start_positions"], f["end_positions"] = 0, 23 - i
record("default_qa", "default", "bert", {}, to_jsonable(feats), default_data_collator(feats))
feats = encode(bert, texts[:3], padding="max_length", max_length=30, truncation=True)
record("padding_do_not_pad", "with_padding", "bert", {"padding": "do_not_pad"}, to_jsonable(feats),
       DataCollatorWithPadding(bert, padding=False)(feats))

# ---------------------------------------------------------------- token classification
for name, opts, side in [("token_cls", {}, "right"), ("token_cls_left_multiple", {"pad_to_multiple_of": 8, "label_pad_token_id": -1}, "left")]:
    bert.padding_side = side
    feats = encode(bert, texts[4:8])
    for f in feats:
        n = len(f["input_ids"])
        labels = torch.randint(0, 9, (n,), generator=g).tolist()
        labels[0] = labels[-1] = -100
        f["labels"] = labels
    collator = DataCollatorForTokenClassification(bert, **opts)
    record(name, "token_classification", "bert", opts, to_jsonable(feats), collator([dict(f) for f in feats]), side)
    bert.padding_side = "right"

# ---------------------------------------------------------------- multiple choice
examples = []
for e in range(2):
    context = texts[e]
    endings = texts[5 + 3 * e: 8 + 3 * e]
    enc = bert([context] * 3, endings)
    ex = {k: v for k, v in enc.items()}
    ex["label"] = e + 1
    examples.append(ex)
mc_json = [{"choices": [{k: ex[k][c] for k in ex if k != "label"} for c in range(3)], "label": ex["label"]} for ex in examples]
record("multiple_choice", "multiple_choice", "bert", {}, mc_json, DataCollatorForMultipleChoice(bert)([dict(x) for x in examples]))

# ---------------------------------------------------------------- seq2seq
bart = BartForConditionalGeneration(BartConfig(
    vocab_size=len(llama), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
    decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, pad_token_id=llama.pad_token_id,
    decoder_start_token_id=1, bos_token_id=1, eos_token_id=2,
))
for name, opts, side, model in [
    ("seq2seq", {}, "right", None),
    ("seq2seq_model", {}, "right", bart),
    ("seq2seq_max_length", {"padding": "max_length", "max_length": 24, "pad_to_multiple_of": 8}, "right", bart),
    ("seq2seq_left", {"label_pad_token_id": -7}, "left", None),
]:
    llama.padding_side = side
    feats = encode(llama, texts[6:10])
    targets = encode(llama, texts[0:4])
    for f, t in zip(feats, targets):
        f["labels"] = t["input_ids"]
    collator = DataCollatorForSeq2Seq(llama, model=model, **opts)
    extra = {"decoder_start_token_id": 1, "decoder_pad_token_id": llama.pad_token_id} if model is not None else {}
    record(name, "seq2seq", "llama", opts, to_jsonable(feats), collator([dict(f) for f in feats]), side, extra)
    llama.padding_side = "right"

# ---------------------------------------------------------------- language modeling
def lm_case(name, tokname, opts, feats, n_batches=1, list_examples=False):
    tok = toks[tokname]
    collator = DataCollatorForLanguageModeling(tok, **opts)
    for b in range(n_batches):
        rows = feats[b]
        inp = [list(r["input_ids"]) for r in rows] if list_examples else [dict(r) for r in rows]
        batch = collator(inp)
        record(f"{name}_{b}", "language_modeling", tokname, opts,
               [{"input_ids": r} for r in inp] if list_examples else to_jsonable(rows), batch,
               extra={"list_examples": list_examples, "sequence": name, "batch_index": b})


bert_stm = [encode(bert, texts[0:4], return_special_tokens_mask=True), encode(bert, texts[4:9], return_special_tokens_mask=True)]
lm_case("mlm_seed42", "bert", {"seed": 42}, bert_stm, n_batches=2)
lm_case("mlm_seed7_no_stm", "bert", {"seed": 7, "pad_to_multiple_of": 8}, [encode(bert, texts[3:8]), encode(bert, texts[0:2])], n_batches=2)
lm_case("mlm_balanced", "bert", {"seed": 3, "mask_replace_prob": 0.5, "random_replace_prob": 0.4, "mlm_probability": 0.4}, [bert_stm[0]])
lm_case("mlm_all_mask", "bert", {"seed": 5, "mask_replace_prob": 1.0, "random_replace_prob": 0.0, "mlm_probability": 0.5}, [bert_stm[1]])
wwm = encode(bert, texts[0:4], padding="max_length", max_length=40, truncation=True,
             return_special_tokens_mask=True, return_offsets_mapping=True)
lm_case("mlm_whole_word", "bert", {"seed": 11, "whole_word_mask": True, "mlm_probability": 0.3}, [wwm])
lm_case("mlm_list_examples", "bert", {"seed": 13, "pad_to_multiple_of": 16},
        [[{"input_ids": f["input_ids"]} for f in bert_stm[1]]], list_examples=True)
lm_case("clm_gpt2", "gpt2", {"mlm": False}, [encode(gpt2, texts[0:4])])
lm_case("clm_llama_multiple", "llama", {"mlm": False, "pad_to_multiple_of": 8}, [encode(llama, texts[4:8])])
lm_case("clm_gpt2_list", "gpt2", {"mlm": False}, [[{"input_ids": f["input_ids"]} for f in encode(gpt2, texts[5:8])]], list_examples=True)
# global generator: torch.manual_seed(2024) right before collating
torch.manual_seed(2024)
lm_case("mlm_global_rng", "bert", {}, [bert_stm[0]])
cases[-1]["global_seed"] = 2024

# ---------------------------------------------------------------- flattening
flat = encode(llama, texts[0:3])
record("flattening", "flattening", "llama", {}, [{"input_ids": f["input_ids"]} for f in flat],
       DataCollatorWithFlattening()([{"input_ids": f["input_ids"]} for f in flat]))
flat_l = [{"input_ids": f["input_ids"], "labels": [x + 1 for x in f["input_ids"]]} for f in flat]
opts = {"return_flash_attn_kwargs": True, "return_seq_idx": True, "separator_id": -1, "position_ids_start": 2}
record("flattening_all", "flattening", "llama", opts, flat_l, DataCollatorWithFlattening(**opts)(flat_l))
# TRL's padding-free collator on rows packed by TRL's `pack_dataset` (bfd; `seq_lengths`
# restart the positions): DataCollatorWithFlattening with every output, over the documents.
packed = pack_dataset(Dataset.from_dict({"input_ids": [f["input_ids"] for f in encode(llama, texts[0:8])]}),
                      40, strategy="bfd")[:]
packed_rows = [{"input_ids": i, "seq_lengths": s} for i, s in zip(packed["input_ids"], packed["seq_lengths"])]
assert any(len(r["seq_lengths"]) > 1 for r in packed_rows)
record("trl_padding_free", "flattening", "llama", {"return_flash_attn_kwargs": True, "return_seq_idx": True},
       packed_rows, TrlLanguageModeling(pad_token_id=0, padding_free=True)(packed_rows),
       extra={"unordered_keys": True})

# ---------------------------------------------------------------- the generator itself
streams = {}
for seed in (0, 42, 123456789):
    gen = torch.Generator().manual_seed(seed)
    streams[str(seed)] = {
        "randint10": torch.randint(10, (5,), generator=gen).tolist(),
        "randint_2_20": torch.randint(2**20, (1000,), generator=gen).tolist(),
        "randint_2_30": torch.randint(2**30, (100,), generator=gen).tolist(),
        "bernoulli_0_3": torch.bernoulli(torch.full((1000,), 0.3), generator=gen).int().tolist(),
        "randint30522": torch.randint(30522, (50,), generator=gen).tolist(),
    }

tok_facts = {}
for name, tok in toks.items():
    tok_facts[name] = {
        "pad_token_id": tok.pad_token_id, "mask_token_id": tok.mask_token_id, "len": len(tok),
        "all_special_ids": sorted(tok.all_special_ids), "padding_side": tok.padding_side,
        "model_max_length": tok.model_max_length if tok.model_max_length < 1e30 else None,
        "pad_token_type_id": tok.pad_token_type_id,
    }
encodings = {name: [{"text": t, "input_ids": toks[name](t)["input_ids"]} for t in texts] for name in toks}

save_file(tensors, str(out_dir / "collators.safetensors"))
(out_dir / "collators.json").write_text(json.dumps(
    {"torch_version": torch.__version__, "tokenizers": tok_facts, "encodings": encodings, "cases": cases,
     "generator_streams": streams}, indent=1,
))
print(f"collators: {len(cases)} cases")
