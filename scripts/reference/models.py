"""Reference for models/tests: logits, losses, gradients and token ids from transformers 5.23.

Usage: python models.py OUT_DIR   (TCHTRAIN_ASSETS names the assets folder)

For every checkpoint (tiny random GPT-2 / BERT / Llama made by setup, tiny random Qwen2 /
Qwen3 / Mistral / Gemma / Gemma 2 / Gemma 3 / Phi-3 and Llama under each rope type made here and saved as OUT_DIR/<case>/, real MiniLM, real SmolLM2-135M) it
writes OUT_DIR/<case>.safetensors with
  input_ids, attention_mask           the batch fed to the model (int64)
  logits (or last_hidden_state)       eval mode, fp32
  loss                                train-mode forward with dropout disabled (eval),
                                      labels as described per case
  grad.<param name>                   gradients after loss.backward() (all parameters for
                                      tiny models, a few named ones for the real ones)
Fresh-head cases (sequence / token classification on tiny models) save the Python model
with save_pretrained into OUT_DIR/<case>/ so Rust loads the very same head weights.
Token ids of a hamlet.txt paragraph for the GPT-2, MiniLM and SmolLM2 tokenizers go to
OUT_DIR/tokenizers.json. The Llama-shaped families' tiny models also generate (see
record_generate): OUT_DIR/<case>.generate.safetensors.
"""

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file as safe_load, save_file

import transformers as tf

OUT = Path(sys.argv[1])
ASSETS = Path(os.environ["TCHTRAIN_ASSETS"])
torch.set_num_threads(2)


def batch(vocab: int, seq: int = 8):
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (2, seq), generator=g)
    mask = torch.ones(2, seq, dtype=torch.int64)
    mask[1, seq - 3 :] = 0
    return ids, mask


def record(case, model, ids, mask, labels, grads="all", output="logits", extra=None):
    model.eval()
    tensors = {"input_ids": ids.contiguous(), "attention_mask": mask.contiguous()}
    kwargs = dict(input_ids=ids, attention_mask=mask)
    if extra:
        kwargs.update(extra)
        tensors.update({k: v.contiguous() for k, v in extra.items()})
    with torch.no_grad():
        out = model(**kwargs)
    if output == "qa":
        # A question-answering head: `qa_outputs` before its split, [batch, seq, 2].
        tensors["logits"] = torch.stack([out.start_logits, out.end_logits], -1).contiguous()
    else:
        tensors[output] = getattr(out, output).contiguous()
    if labels is not None:
        # A dict of label tensors (question answering's start / end positions) or `labels`.
        label_kwargs = labels if isinstance(labels, dict) else {"labels": labels}
        tensors.update({k: v.contiguous() for k, v in label_kwargs.items()})
        model.zero_grad()
        out = model(**kwargs, **label_kwargs)
        out.loss.backward()
        tensors["loss"] = out.loss.detach().reshape(1)
        for name, p in model.named_parameters():
            if p.grad is not None and (grads == "all" or name in grads):
                tensors[f"grad.{name}"] = p.grad.detach().contiguous()
    save_file(tensors, str(OUT / f"{case}.safetensors"))
    # `model.parameters()`'s order (registration order, a tied weight once): gradient
    # clipping stacks the per-parameter norms in this order.
    names = [name for name, _ in model.named_parameters()]
    (OUT / f"{case}.parameters.json").write_text(json.dumps(names))


GENERATE = {
    "greedy": dict(max_new_tokens=6),
    "beam": dict(num_beams=3, num_return_sequences=2, length_penalty=0.9, max_new_tokens=6),
}


def record_generate(case, model, ids, mask):
    """`generate` on the family's tiny model (evaluation mode, its default cache: the
    sliding-window families' sliding layers included): the batch's second row left-padded
    (its last 3 tokens dropped, pad id 0), greedy and beam search (3 beams, 2 returned);
    OUT_DIR/<case>.generate.safetensors holds the inputs and the sequences."""
    model.eval()
    left = ids.clone()
    left[1] = torch.cat([torch.zeros(3, dtype=ids.dtype), ids[1, :-3]])
    left_mask = mask.flip(1).contiguous()
    out = {"input_ids": left, "attention_mask": left_mask}
    for kind, kwargs in GENERATE.items():
        torch.manual_seed(0)
        out[kind] = model.generate(
            input_ids=left, attention_mask=left_mask, pad_token_id=0, do_sample=False, **kwargs
        )
    save_file({k: v.contiguous() for k, v in out.items()}, str(OUT / f"{case}.generate.safetensors"))


# The saved cases rerun under bf16 autocast: every family, and each kind of head.
AUTOCAST_CASES = [
    "tiny_qwen2_lm", "tiny_qwen3_lm", "tiny_mistral_lm", "tiny_gemma_lm", "tiny_gemma2_lm",
    "tiny_gemma3_lm", "tiny_phi3_lm", "tiny_llama_yarn_lm", "tiny_roberta_mlm", "tiny_xlmr_mlm",
    "tiny_distilbert_mlm", "tiny_deberta_mlm", "tiny_modernbert_mlm", "tiny_qwen2_seqcls",
    "tiny_qwen2_tokcls", "tiny_roberta_seqcls", "tiny_deberta_tokcls", "tiny_modernbert_seqcls",
    "tiny_bert_qa", "tiny_gpt2_qa", "tiny_qwen2_qa",
]


def main():
    # --- tiny GPT-2: LM head with labels = input_ids (padding -> -100)
    m = tf.GPT2LMHeadModel.from_pretrained(ASSETS / "tiny-gpt2")
    ids, mask = batch(m.config.vocab_size)
    labels = ids.masked_fill(mask == 0, -100)
    record("tiny_gpt2_lm", m, ids, mask, labels)

    # --- tiny GPT-2 sequence classification (fresh head saved for Rust)
    torch.manual_seed(0)
    m = tf.GPT2ForSequenceClassification.from_pretrained(ASSETS / "tiny-gpt2", num_labels=3, pad_token_id=50256)
    m.save_pretrained(OUT / "tiny_gpt2_seqcls")
    ids_p = ids.clone()
    ids_p[1, -3:] = 50256
    record("tiny_gpt2_seqcls", m, ids_p, mask, torch.tensor([2, 0]))

    # --- tiny BERT masked LM
    m = tf.BertForMaskedLM.from_pretrained(ASSETS / "tiny-bert")
    ids, mask = batch(m.config.vocab_size)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 5], labels[1, 1] = 7, 99, 1000
    tt = torch.zeros_like(ids)
    tt[:, 4:] = 1
    record("tiny_bert_mlm", m, ids, mask, labels, extra={"token_type_ids": tt})

    # --- tiny BERT sequence + token classification (fresh heads)
    torch.manual_seed(0)
    m = tf.BertForSequenceClassification.from_pretrained(ASSETS / "tiny-bert", num_labels=3)
    m.save_pretrained(OUT / "tiny_bert_seqcls")
    record("tiny_bert_seqcls", m, ids, mask, torch.tensor([1, 2]))
    torch.manual_seed(0)
    m = tf.BertForTokenClassification.from_pretrained(ASSETS / "tiny-bert", num_labels=5)
    m.save_pretrained(OUT / "tiny_bert_tokcls")
    tok_labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(7))
    tok_labels = tok_labels.masked_fill(mask == 0, -100)
    record("tiny_bert_tokcls", m, ids, mask, tok_labels)

    # --- tiny RoBERTa / XLM-RoBERTa (seeded, saved for Rust): masked LM with row 1's last 3
    # tokens padding (pad id 1: their positions stay at the padding index), then new
    # RobertaClassificationHead / token-classification heads drawn after
    # torch.manual_seed(0) on the masked LM's checkpoint
    tiny_enc = dict(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=64,
    )
    for fam, config_cls, mlm_cls, seq_cls, tok_cls in [
        ("roberta", tf.RobertaConfig, tf.RobertaForMaskedLM, tf.RobertaForSequenceClassification, tf.RobertaForTokenClassification),
        ("xlmr", tf.XLMRobertaConfig, tf.XLMRobertaForMaskedLM, tf.XLMRobertaForSequenceClassification, tf.XLMRobertaForTokenClassification),
    ]:
        torch.manual_seed(0)
        m = mlm_cls(config_cls(**tiny_enc))
        m.save_pretrained(OUT / f"tiny_{fam}_mlm")
        ids, mask = batch(1000)
        ids = ids.masked_fill(mask == 0, 1)
        labels = torch.full_like(ids, -100)
        labels[0, 2], labels[0, 5], labels[1, 1] = 7, 99, 500
        record(f"tiny_{fam}_mlm", m, ids, mask, labels)
        for head, cls, n, lab in [
            ("seqcls", seq_cls, 3, torch.tensor([1, 2])),
            ("tokcls", tok_cls, 5, torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(7)).masked_fill(mask == 0, -100)),
        ]:
            torch.manual_seed(0)
            m = cls.from_pretrained(OUT / f"tiny_{fam}_mlm", num_labels=n)
            m.save_pretrained(OUT / f"tiny_{fam}_{head}")
            record(f"tiny_{fam}_{head}", m, ids, mask, lab)

    # --- tiny DistilBERT (seeded, saved for Rust; pad id 0 ending row 1): the masked LM, and
    # new sequence (pre_classifier + classifier) / token classifiers drawn after
    # torch.manual_seed(0) on its checkpoint
    torch.manual_seed(0)
    m = tf.DistilBertForMaskedLM(tf.DistilBertConfig(
        vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=96, max_position_embeddings=64,
    ))
    m.save_pretrained(OUT / "tiny_distilbert_mlm")
    ids, mask = batch(1000)
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 5], labels[1, 1] = 7, 99, 500
    record("tiny_distilbert_mlm", m, ids, mask, labels)
    for head, cls, n, lab in [
        ("seqcls", tf.DistilBertForSequenceClassification, 3, torch.tensor([1, 2])),
        ("tokcls", tf.DistilBertForTokenClassification, 5, torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(7)).masked_fill(mask == 0, -100)),
    ]:
        torch.manual_seed(0)
        m = cls.from_pretrained(OUT / "tiny_distilbert_mlm", num_labels=n)
        m.save_pretrained(OUT / f"tiny_distilbert_{head}")
        record(f"tiny_distilbert_{head}", m, ids, mask, lab)

    # --- tiny DeBERTa-v3 (seeded, saved for Rust): relative attention (c2p and p2c) over 16
    # log buckets, shared keys, LayerNorm-ed relative embeddings, no absolute positions; 20
    # tokens so that distances past 8 are bucketed; row 1 padded. The masked LM (legacy
    # `cls.predictions` head), and on its checkpoint new sequence (pooler + classifier;
    # one label -1, which DeBERTa's loss drops) and token classifiers drawn after
    # torch.manual_seed(0). A variant: the non-legacy `lm_predictions` head, own position
    # projections (share_att_key False), absolute positions and token types, no buckets
    # (12 relative positions, clamped), pos_att_type given as "p2c|c2p".
    tiny_deberta = dict(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=64, relative_attention=True,
        pad_token_id=0,
    )
    v3 = dict(
        position_buckets=16, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
        share_att_key=True, position_biased_input=False, type_vocab_size=0,
    )
    ids, mask = batch(1000, seq=20)
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 15], labels[1, 1] = 7, 99, 500
    torch.manual_seed(0)
    m = tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**tiny_deberta, **v3))
    m.save_pretrained(OUT / "tiny_deberta_mlm")
    record("tiny_deberta_mlm", m, ids, mask, labels)
    for head, cls, n, lab in [
        ("seqcls", tf.DebertaV2ForSequenceClassification, 3, torch.tensor([2, -1])),
        ("tokcls", tf.DebertaV2ForTokenClassification, 5, torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(7)).masked_fill(mask == 0, -100)),
    ]:
        torch.manual_seed(0)
        m = cls.from_pretrained(OUT / "tiny_deberta_mlm", num_labels=n)
        m.save_pretrained(OUT / f"tiny_deberta_{head}")
        record(f"tiny_deberta_{head}", m, ids, mask, lab)
    torch.manual_seed(0)
    m = tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(
        **tiny_deberta, pos_att_type="p2c|c2p", max_relative_positions=12, share_att_key=False,
        position_biased_input=True, type_vocab_size=2, legacy=False,
    ))
    m.save_pretrained(OUT / "tiny_deberta_variant_mlm")
    tt = torch.zeros_like(ids)
    tt[:, 10:] = 1
    record("tiny_deberta_variant_mlm", m, ids, mask, labels, extra={"token_type_ids": tt})

    # --- tiny ModernBERT (seeded, saved for Rust): layers 0 and 2 global, layer 1 local
    # (window 4: keys within 2 of the query), pad id 0 ending row 1; the masked LM, the same
    # with sparse_prediction (only the labelled tokens through the head), new sequence (cls
    # pooling) and token classifiers drawn after torch.manual_seed(0) on its checkpoint
    # (normal, then ModernBERT's truncated normal); and a model with every bias and mean
    # pooling
    tiny_mb = dict(
        vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=64, global_attn_every_n_layers=2,
        local_attention=4, pad_token_id=0,
    )
    torch.manual_seed(0)
    m = tf.ModernBertForMaskedLM(tf.ModernBertConfig(**tiny_mb))
    m.save_pretrained(OUT / "tiny_modernbert_mlm")
    ids, mask = batch(1000)
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 5], labels[1, 1] = 7, 99, 500
    record("tiny_modernbert_mlm", m, ids, mask, labels)
    m = tf.ModernBertForMaskedLM.from_pretrained(OUT / "tiny_modernbert_mlm", sparse_prediction=True)
    m.save_pretrained(OUT / "tiny_modernbert_sparse_mlm")
    record("tiny_modernbert_sparse_mlm", m, ids, mask, labels)
    for head, cls, n, lab in [
        ("seqcls", tf.ModernBertForSequenceClassification, 3, torch.tensor([1, 2])),
        ("tokcls", tf.ModernBertForTokenClassification, 5, torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(7)).masked_fill(mask == 0, -100)),
    ]:
        torch.manual_seed(0)
        m = cls.from_pretrained(OUT / "tiny_modernbert_mlm", num_labels=n)
        m.save_pretrained(OUT / f"tiny_modernbert_{head}")
        record(f"tiny_modernbert_{head}", m, ids, mask, lab)
    torch.manual_seed(0)
    m = tf.ModernBertForSequenceClassification(tf.ModernBertConfig(
        **tiny_mb, norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
        classifier_pooling="mean", num_labels=3,
    ))
    m.save_pretrained(OUT / "tiny_modernbert_biased_seqcls")
    record("tiny_modernbert_biased_seqcls", m, ids, mask, torch.tensor([0, 2]))

    # --- tiny Llama causal LM
    m = tf.LlamaForCausalLM.from_pretrained(ASSETS / "tiny-llama")
    ids, mask = batch(m.config.vocab_size)
    labels = ids.masked_fill(mask == 0, -100)
    record("tiny_llama_lm", m, ids, mask, labels)

    # --- the Llama-shaped families, tiny and seeded, saved for Rust: Qwen2 (q/k/v bias, the
    # last two of 3 layers sliding over 3 tokens), Qwen3 (q/k RMSNorm, head_dim 32 != 64/4,
    # tied), Mistral (head_dim 24, every layer sliding over 3 tokens); 8 tokens, one row
    # padded, so that the windows cut in.
    small = dict(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=256, vocab_size=1000,
    )
    families = [
        ("tiny_qwen2_lm", tf.Qwen2Config(**small, use_sliding_window=True, sliding_window=3, max_window_layers=1), tf.Qwen2ForCausalLM),
        ("tiny_qwen3_lm", tf.Qwen3Config(**small, head_dim=32, tie_word_embeddings=True), tf.Qwen3ForCausalLM),
        ("tiny_mistral_lm", tf.MistralConfig(**small, head_dim=24, sliding_window=3), tf.MistralForCausalLM),
    ]
    # Gemma (pad token 0 in row 0, whose embedding row gets no gradient), Gemma 2 (eager
    # attention soft-capped at 0.05 and logits at 0.3, so that tanh bends them; scale
    # 20 ** -0.5; layers 0 and 2 sliding over 3 tokens), Gemma 3 text (q/k norm, layers 0
    # and 2 sliding with their own RoPE base 100, the full layer's linear-scaled RoPE).
    families += [
        ("tiny_gemma_lm", tf.GemmaConfig(**small, head_dim=16), tf.GemmaForCausalLM),
        ("tiny_gemma2_lm", tf.Gemma2Config(
            **small, head_dim=24, query_pre_attn_scalar=20, sliding_window=3,
            attn_logit_softcapping=0.05, final_logit_softcapping=0.3,
        ), tf.Gemma2ForCausalLM),
        ("tiny_gemma3_lm", tf.Gemma3TextConfig(
            **small, head_dim=32, query_pre_attn_scalar=20, sliding_window=3, sliding_window_pattern=2,
            final_logit_softcapping=0.3,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            },
        ), tf.Gemma3ForCausalLM),
    ]
    # Phi-3 (fused projections, half of each head rotary, LongRoPE past its original 4
    # positions: the long factors, attention scaling 2; every layer sliding over 5 tokens),
    # and Llama under every other rope type: yarn, dynamic (8 tokens outgrow the 4 cached
    # positions: the forward recomputes the base), llama3, linear.
    families += [
        ("tiny_phi3_lm", tf.Phi3Config(
            **small, pad_token_id=999, original_max_position_embeddings=4, sliding_window=5,
            rope_parameters={
                "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [1.5, 2.0, 3.0, 4.0],
            },
        ), tf.Phi3ForCausalLM),
    ]
    ropes = {
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0},
        "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        "llama3": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16, "rope_theta": 500000.0,
        },
        "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    }
    for name, rope in ropes.items():
        sizes = dict(small, max_position_embeddings=4) if name == "dynamic" else small
        families.append((f"tiny_llama_{name}_lm", tf.LlamaConfig(**sizes, rope_parameters=rope), tf.LlamaForCausalLM))
    for case, config, cls in families:
        torch.manual_seed(0)
        m = cls(config)
        m.save_pretrained(OUT / case)
        ids, mask = batch(config.vocab_size)
        if case == "tiny_gemma_lm":
            ids[0, 3] = 0
        labels = ids.masked_fill(mask == 0, -100)
        record(case, m, ids, mask, labels)
        record_generate(case, m, ids, mask)

    # --- dtype="auto" (transformers 5's default): the tiny Qwen2 saved in bfloat16 (its config
    # says so) loads and runs in bfloat16, logits, loss and gradients in bfloat16
    m = tf.Qwen2ForCausalLM.from_pretrained(OUT / "tiny_qwen2_lm", dtype=torch.bfloat16)
    m.save_pretrained(OUT / "tiny_qwen2_bf16")
    m = tf.Qwen2ForCausalLM.from_pretrained(OUT / "tiny_qwen2_bf16")
    assert m.dtype == torch.bfloat16, m.dtype
    ids, mask = batch(m.config.vocab_size)
    record("tiny_qwen2_bf16", m, ids, mask, ids.masked_fill(mask == 0, -100))

    # --- a new `score` head (GenericForSequenceClassification) on the tiny Qwen2 and Llama
    # causal LMs, drawn after torch.manual_seed(0), pad token 0 (the last 3 tokens of row 1),
    # pooled at each row's last non-padding token; saved for Rust.
    for case, src, cls in [
        ("tiny_qwen2_seqcls", OUT / "tiny_qwen2_lm", tf.Qwen2ForSequenceClassification),
        ("tiny_llama_seqcls", ASSETS / "tiny-llama", tf.LlamaForSequenceClassification),
        ("tiny_gemma2_seqcls", OUT / "tiny_gemma2_lm", tf.Gemma2ForSequenceClassification),
        ("tiny_gemma3_seqcls", OUT / "tiny_gemma3_lm", tf.Gemma3TextForSequenceClassification),
    ]:
        torch.manual_seed(0)
        m = cls.from_pretrained(src, num_labels=3, pad_token_id=0)
        m.save_pretrained(OUT / case)
        ids, mask = batch(m.config.vocab_size)
        ids = ids.masked_fill(mask == 0, 0)
        record(case, m, ids, mask, torch.tensor([2, 0]))

    # --- a new `score` head with a bias (GenericForTokenClassification, dropout 0.1 in
    # training) on the tiny Qwen2 and Phi-3 causal LMs, drawn after torch.manual_seed(0), 5
    # labels, the padding labelled -100; saved for Rust.
    for case, src, cls in [
        ("tiny_qwen2_tokcls", OUT / "tiny_qwen2_lm", tf.Qwen2ForTokenClassification),
        ("tiny_phi3_tokcls", OUT / "tiny_phi3_lm", tf.Phi3ForTokenClassification),
    ]:
        torch.manual_seed(0)
        m = cls.from_pretrained(src, num_labels=5)
        m.save_pretrained(OUT / case)
        ids, mask = batch(m.config.vocab_size)
        tok_labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(7))
        record(case, m, ids, mask, tok_labels.masked_fill(mask == 0, -100))

    # --- question answering (`qa_outputs`, or ModernBERT's head + `classifier`, two logits per
    # token), drawn after torch.manual_seed(0) on each family's checkpoint and saved for Rust;
    # positions past the end (clamped to seq: ignored) and negative (clamped to 0) included.
    # Llama, Qwen2 and Qwen3 keep their body under `transformer` (upstream's BC prefix): a
    # causal LM's `model.` keys would not load, so their heads are drawn on the base model
    # saved alone (keys at the root, which from_pretrained prefixes).
    qa_cases = [
        ("tiny_gpt2_qa", ASSETS / "tiny-gpt2", tf.GPT2ForQuestionAnswering, 8),
        ("tiny_bert_qa", ASSETS / "tiny-bert", tf.BertForQuestionAnswering, 8),
        ("tiny_roberta_qa", OUT / "tiny_roberta_mlm", tf.RobertaForQuestionAnswering, 8),
        ("tiny_xlmr_qa", OUT / "tiny_xlmr_mlm", tf.XLMRobertaForQuestionAnswering, 8),
        ("tiny_distilbert_qa", OUT / "tiny_distilbert_mlm", tf.DistilBertForQuestionAnswering, 8),
        ("tiny_deberta_qa", OUT / "tiny_deberta_mlm", tf.DebertaV2ForQuestionAnswering, 20),
        ("tiny_modernbert_qa", OUT / "tiny_modernbert_mlm", tf.ModernBertForQuestionAnswering, 8),
        ("tiny_mistral_qa", OUT / "tiny_mistral_lm", tf.MistralForQuestionAnswering, 8),
    ]
    for fam, src, cls in [
        ("llama", ASSETS / "tiny-llama", tf.LlamaForQuestionAnswering),
        ("qwen2", OUT / "tiny_qwen2_lm", tf.Qwen2ForQuestionAnswering),
        ("qwen3", OUT / "tiny_qwen3_lm", tf.Qwen3ForQuestionAnswering),
    ]:
        tf.AutoModel.from_pretrained(src).save_pretrained(OUT / f"tiny_{fam}_base")
        qa_cases.append((f"tiny_{fam}_qa", OUT / f"tiny_{fam}_base", cls, 8))
    for case, src, cls, seq in qa_cases:
        torch.manual_seed(0)
        m = cls.from_pretrained(src)
        m.save_pretrained(OUT / case)
        ids, mask = batch(m.config.vocab_size, seq=seq)
        positions = {
            "start_positions": torch.tensor([2, seq + 3]),
            "end_positions": torch.tensor([seq - 3, -2]),
        }
        record(case, m, ids, mask, positions, output="qa")

    # --- bf16 autocast on the CPU (the Trainer's `--bf16`: accelerate's autocast region around
    # the forward, the outputs cast back to float32): every family's saved case rerun on its
    # own batch and labels, train mode with dropout off as above; logits, loss and gradients
    # (float32 parameters) into OUT_DIR/autocast.safetensors as `<case>.<name>`.
    autocast = {}
    for case in AUTOCAST_CASES:
        saved = {k: v for k, v in safe_load(str(OUT / f"{case}.safetensors")).items()}
        arch = json.loads((OUT / case / "config.json").read_text())["architectures"][0]
        m = getattr(tf, arch).from_pretrained(OUT / case, dtype=torch.float32)
        m.eval()
        inputs = {k: saved[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in saved}
        labels = {k: saved[k] for k in ("labels", "start_positions", "end_positions") if k in saved}
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(**inputs)
        if "start_positions" in labels:
            logits = torch.stack([out.start_logits, out.end_logits], -1)
        else:
            logits = out.logits
        autocast[f"{case}.logits"] = logits.float().contiguous()
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(**inputs, **labels).loss
        loss = loss.float()
        loss.backward()
        autocast[f"{case}.loss"] = loss.detach().reshape(1)
        for name, p in m.named_parameters():
            if p.grad is not None:
                autocast[f"{case}.grad.{name}"] = p.grad.detach().contiguous()
    save_file(autocast, str(OUT / "autocast.safetensors"))

    # --- real MiniLM (BertModel, checkpoint without the `bert.` prefix)
    m = tf.BertModel.from_pretrained(ASSETS / "minilm")
    ids, mask = batch(m.config.vocab_size, seq=12)
    record("minilm", m, ids, mask, None, output="last_hidden_state")
    # MiniLM under a fresh sequence-classification head: the loaded body gets `bert.`
    torch.manual_seed(0)
    m = tf.BertForSequenceClassification.from_pretrained(ASSETS / "minilm", num_labels=2)
    m.save_pretrained(OUT / "minilm_seqcls")
    record(
        "minilm_seqcls", m, ids, mask, torch.tensor([1, 0]),
        grads=["bert.encoder.layer.0.attention.self.query.weight", "classifier.weight", "bert.embeddings.word_embeddings.weight"],
    )

    # --- real SmolLM2-135M
    m = tf.LlamaForCausalLM.from_pretrained(ASSETS / "smollm2-135m", dtype=torch.float32)
    ids, mask = batch(m.config.vocab_size, seq=10)
    labels = ids.masked_fill(mask == 0, -100)
    record(
        "smollm2", m, ids, mask, labels,
        grads=["model.layers.0.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight", "model.norm.weight", "model.embed_tokens.weight"],
    )

    # --- tokenizers on a hamlet paragraph
    text = (ASSETS / "text" / "hamlet.txt").read_text(encoding="utf-8")
    paragraph = text[2000:2600]
    # transformers 5.x: the constructor takes `vocab` / `merges` (file paths or objects).
    gpt2 = tf.GPT2TokenizerFast(
        vocab=str(ASSETS / "gpt2-tokenizer" / "vocab.json"),
        merges=str(ASSETS / "gpt2-tokenizer" / "merges.txt"),
    )
    assert gpt2("Hello world")["input_ids"] == [15496, 995], "GPT-2 tokenizer did not load its vocab"
    minilm = tf.AutoTokenizer.from_pretrained(ASSETS / "minilm")
    smol = tf.AutoTokenizer.from_pretrained(ASSETS / "smollm2-135m")
    out = {
        "paragraph": paragraph,
        "gpt2": gpt2(paragraph)["input_ids"],
        "minilm": minilm(paragraph)["input_ids"],
        "smollm2": smol(paragraph)["input_ids"],
    }
    (OUT / "tokenizers.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
