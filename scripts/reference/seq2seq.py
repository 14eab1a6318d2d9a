"""Reference for models/tests: encoder-decoder models and their `generate()` in transformers 5.23.

Usage: python seq2seq.py OUT_DIR

Tiny random checkpoints are made here (after `torch.manual_seed(0)`) and saved with
save_pretrained into OUT_DIR/<case>/:

  t5_v1      T5 v1.0: feed_forward_proj "relu", the head tied to `shared`, the decoder output
             rescaled by d_model ** -0.5
  flan_t5    T5 v1.1 / Flan-T5: "gated-gelu", tie_word_embeddings False (no rescale) and an
             `lm_head.weight` of its own (drawn after the model; upstream then leaves the two
             apart when loading)
  bart       BART: post-norm layers, 4 encoder / 2 decoder heads, dropout 0.1, the config's
             forced_eos_token_id 2, a non-zero final_logits_bias (drawn after the model)
  mbart      mBART: pre-norm layers with a final LayerNorm per stack, scale_embedding, its
             label shift (the last non-padding token wrapped to the front), no
             decoder_start_token_id (generate starts from bos_token_id) and a
             generation_config.json with forced_bos_token_id 5

t5_v1 has 2 encoder and 3 decoder blocks, flan_t5 2 and 2; both 8 relative-position buckets
up to distance 12 (the 10-token inputs reach the logarithmic buckets) and dropout 0.1 (off in
evaluation). t5_v1 generates with use_cache=False: with fewer encoder than decoder blocks,
upstream's generate sizes its cache by `num_layers` and fails (IndexError).

OUT_DIR/<case>.safetensors holds, for a batch of two (the second row padded at its end):
  input_ids, attention_mask, labels (-100 at the second row's end)
  logits, loss                    eval mode, `model(input_ids, attention_mask, labels)`
                                  (decoder_input_ids: the labels shifted right)
  grad.<name>                     every parameter's gradient after loss.backward()
  train_logits, train_loss, train_grad.<name>
                                  training mode after `torch.manual_seed(3)`: every dropout
                                  drawn (attention probabilities included), the decoder
                                  building its cache as its config's use_cache says (T5:
                                  always; BART: not with labels), which lays the keys out
                                  anew (attention rounds by layout)
  decoder_input_ids, decoder_attention_mask, masked_logits
                                  eval mode, explicit decoder ids with a padded decoder mask
  gen_<kind>.sequences / .scores  `generate(input_ids, attention_mask, ...)` with
                                  output_scores (scores stacked [steps, rows, vocab]):
    greedy   max_new_tokens 8
    beam     num_beams 3, num_return_sequences 2, length_penalty 0.8, no_repeat_ngram_size 2,
             max_new_tokens 8 (sequences_scores too)
    sample   do_sample, top_k 10, temperature 0.9, max_new_tokens 8, seed 0
OUT_DIR/<case>.parameters.json: named_parameters() order.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import transformers as tf

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(2)

GENERATE = {
    "greedy": dict(max_new_tokens=8),
    "beam": dict(num_beams=3, num_return_sequences=2, length_penalty=0.8, no_repeat_ngram_size=2, max_new_tokens=8),
    "sample": dict(do_sample=True, top_k=10, temperature=0.9, max_new_tokens=8),
}


def t5(case, **kw):
    config = tf.T5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=12,
        dropout_rate=0.1, decoder_start_token_id=0, **kw,
    )
    torch.manual_seed(0)
    m = tf.T5ForConditionalGeneration(config)
    if kw.get("tie_word_embeddings") is False:
        m.lm_head.weight = torch.nn.Parameter(torch.randn(config.vocab_size, config.d_model))
    m.save_pretrained(OUT / case)
    return tf.T5ForConditionalGeneration.from_pretrained(OUT / case).eval()


def bart(case, mbart=False):
    cls = tf.MBartForConditionalGeneration if mbart else tf.BartForConditionalGeneration
    kw = dict(
        vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=41, max_position_embeddings=32,
        dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
    )
    config = tf.MBartConfig(scale_embedding=True, **kw) if mbart else tf.BartConfig(**kw)
    torch.manual_seed(0)
    m = cls(config)
    m.final_logits_bias.normal_()
    if mbart:
        m.generation_config.forced_bos_token_id = 5
    m.save_pretrained(OUT / case)
    return cls.from_pretrained(OUT / case).eval()


def record(case, m, use_cache=True):
    g = torch.Generator().manual_seed(1234)
    vocab = m.config.vocab_size
    ids = torch.randint(2, vocab, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.int64)
    mask[1, 7:] = 0
    ids[1, 7:] = m.config.pad_token_id
    labels = torch.randint(2, vocab, (2, 6), generator=g)
    labels[1, 4:] = -100
    t = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    m.zero_grad()
    out = m(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    t["logits"] = out.logits.detach()
    t["loss"] = out.loss.detach().reshape(1)
    for name, p in m.named_parameters():
        t[f"grad.{name}"] = p.grad.detach()
    m.train()
    m.zero_grad()
    torch.manual_seed(3)
    out = m(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    t["train_logits"] = out.logits.detach()
    t["train_loss"] = out.loss.detach().reshape(1)
    for name, p in m.named_parameters():
        t[f"train_grad.{name}"] = p.grad.detach()
    m.eval()
    dec = torch.randint(2, vocab, (2, 5), generator=g)
    start = m.config.decoder_start_token_id
    dec[:, 0] = start if start is not None else m.config.bos_token_id
    dec_mask = torch.ones(2, 5, dtype=torch.int64)
    dec_mask[0, 3:] = 0
    with torch.no_grad():
        t["masked_logits"] = m(
            input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask
        ).logits
    t["decoder_input_ids"] = dec
    t["decoder_attention_mask"] = dec_mask
    for kind, kwargs in GENERATE.items():
        torch.manual_seed(0)
        out = m.generate(
            input_ids=ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True,
            use_cache=use_cache, **kwargs,
        )
        t[f"gen_{kind}.sequences"] = out.sequences
        t[f"gen_{kind}.scores"] = torch.stack(out.scores)
        if getattr(out, "sequences_scores", None) is not None:
            t[f"gen_{kind}.sequences_scores"] = out.sequences_scores
        print(case, kind, out.sequences.tolist())
    save_file({k: v.contiguous() for k, v in t.items()}, str(OUT / f"{case}.safetensors"))
    names = [name for name, _ in m.named_parameters()]
    (OUT / f"{case}.parameters.json").write_text(json.dumps(names))


def main():
    record("t5_v1", t5("t5_v1", num_decoder_layers=3), use_cache=False)
    record("flan_t5", t5("flan_t5", feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    record("bart", bart("bart"))
    record("mbart", bart("mbart", mbart=True))
    (OUT / "generate.json").write_text(json.dumps(GENERATE, indent=1))


if __name__ == "__main__":
    main()
