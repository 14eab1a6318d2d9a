"""Reference for models/tests/it/module_repr.rs: what `print(model)` shows (torch 2.13's module
tree with transformers 5.23's class names), the text W&B's model artifacts carry as
`model_architecture.txt`.

Usage: python module_reprs.py OUT_DIR

OUT_DIR/<case>/: a tiny model of each architecture whose tree tchtrain writes out, saved with
`save_pretrained`, and `repr.txt`, `str(model)`. The configs change what shows in the text:
sizes, grouped key-value heads, biases, norms' epsilons, dropout probabilities, the padding
index, the activation. The peft cases: LoRA / DoRA adapters (one or two) over some of them, with
`modules_to_save` (the sequence classifiers' heads).
"""

import sys
from pathlib import Path

import torch

import transformers as tf

OUT = Path(sys.argv[1])
SMALL = dict(vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2)

ENCODER = dict(vocab_size=96, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=40,
               max_position_embeddings=40, type_vocab_size=3)

DISTILBERT = dict(vocab_size=96, dim=16, n_layers=2, n_heads=2, hidden_dim=40, max_position_embeddings=40)

MODERNBERT = dict(vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=4, num_attention_heads=2,
                  max_position_embeddings=40, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                  sep_token_id=2)

DEBERTA_V3 = dict(vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                  max_position_embeddings=40, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                  max_relative_positions=16, norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                  type_vocab_size=0)

CASES = {
    "gpt2_lm": (tf.GPT2LMHeadModel, tf.GPT2Config(
        vocab_size=96, n_positions=40, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.05, embd_pdrop=0.0,
        attn_pdrop=0.25, layer_norm_epsilon=1e-6, bos_token_id=0, eos_token_id=0)),
    "gpt2_cls": (tf.GPT2ForSequenceClassification, tf.GPT2Config(
        vocab_size=96, n_positions=40, n_embd=16, n_layer=3, n_head=2, n_inner=24, activation_function="relu",
        num_labels=3, bos_token_id=0, eos_token_id=0, pad_token_id=0)),
    "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**SMALL, rms_norm_eps=1e-5, pad_token_id=0)),
    "llama_bias_cls": (tf.LlamaForSequenceClassification, tf.LlamaConfig(
        **SMALL, attention_bias=True, mlp_bias=True, num_labels=5, pad_token_id=1)),
    "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**SMALL, head_dim=8, tie_word_embeddings=True)),
    "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**SMALL)),
    "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config(**SMALL, head_dim=6)),
    "qwen3_cls": (tf.Qwen3ForSequenceClassification, tf.Qwen3Config(**SMALL, num_labels=2, pad_token_id=0)),
    "gemma": (tf.GemmaForCausalLM, tf.GemmaConfig(**SMALL, head_dim=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gemma2_cls": (tf.Gemma2ForSequenceClassification, tf.Gemma2Config(
        **SMALL, head_dim=8, num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gemma3_text": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig(
        **SMALL, head_dim=4, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config(**SMALL, resid_pdrop=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "phi3_cls": (tf.Phi3ForSequenceClassification, tf.Phi3Config(
        **SMALL, num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "t5": (tf.T5ForConditionalGeneration, tf.T5Config(
        vocab_size=96, d_model=16, d_kv=4, d_ff=40, num_layers=2, num_decoder_layers=3, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.05)),
    "flan_t5": (tf.T5ForConditionalGeneration, tf.T5Config(
        vocab_size=96, d_model=16, d_kv=8, d_ff=40, num_layers=2, num_heads=2, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False)),
    "bart": (tf.BartForConditionalGeneration, tf.BartConfig(
        vocab_size=96, d_model=16, encoder_layers=2, decoder_layers=3, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=40, decoder_ffn_dim=24, max_position_embeddings=40)),
    "mbart": (tf.MBartForConditionalGeneration, tf.MBartConfig(
        vocab_size=96, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=40,
        activation_function="relu")),
    "distilbert_cls": (tf.DistilBertForSequenceClassification, tf.DistilBertConfig(**DISTILBERT, num_labels=3)),
    "distilbert_mlm": (tf.DistilBertForMaskedLM, tf.DistilBertConfig(**DISTILBERT, activation="relu", dropout=0.05)),
    "distilbert_qa": (tf.DistilBertForQuestionAnswering, tf.DistilBertConfig(**DISTILBERT, qa_dropout=0.3)),
    "distilbert_ner": (tf.DistilBertForTokenClassification, tf.DistilBertConfig(**DISTILBERT, num_labels=4)),
    "granite": (tf.GraniteForCausalLM, tf.GraniteConfig(**SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "smollm3": (tf.SmolLM3ForCausalLM, tf.SmolLM3Config(**SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "olmo2": (tf.Olmo2ForCausalLM, tf.Olmo2Config(**SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "olmo3": (tf.Olmo3ForCausalLM, tf.Olmo3Config(
        **SMALL, sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gpt_oss": (tf.GptOssForCausalLM, tf.GptOssConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2, head_dim=4)),
    "qwen3_5_text": (tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig(
        vocab_size=96, hidden_size=16, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, linear_conv_kernel_dim=4, linear_key_head_dim=4, linear_value_head_dim=6,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention"])),
    "gemma4_text": (tf.Gemma4ForCausalLM, tf.Gemma4TextConfig(
        vocab_size=96, vocab_size_per_layer_input=80, hidden_size=32, intermediate_size=40, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=4, pad_token_id=0, num_hidden_layers=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2, global_head_dim=16,
        num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2, use_double_wide_mlp=True,
        hidden_size_per_layer_input=4)),
    "gemma4_text_moe": (tf.Gemma4ForCausalLM, tf.Gemma4TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        sliding_window=4, pad_token_id=0, num_hidden_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], global_head_dim=16,
        hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=8)),
    "qwen3_5_moe_text": (tf.Qwen3_5MoeForCausalLM, tf.Qwen3_5MoeTextConfig(
        vocab_size=96, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        linear_conv_kernel_dim=4, linear_key_head_dim=4, linear_value_head_dim=6, linear_num_key_heads=2,
        linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"], num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=8, shared_expert_intermediate_size=12)),
    "mixtral": (tf.MixtralForCausalLM, tf.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": (tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig(
        **SMALL, moe_intermediate_size=8, shared_expert_intermediate_size=12, num_experts=4, num_experts_per_tok=2,
        mlp_only_layers=[1])),
    "qwen3_moe": (tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig(
        **SMALL, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=2)),
    "olmoe": (tf.OlmoeForCausalLM, tf.OlmoeConfig(
        **SMALL, num_experts=4, num_experts_per_tok=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "modernbert_cls": (tf.ModernBertForSequenceClassification, tf.ModernBertConfig(**MODERNBERT, num_labels=3)),
    "modernbert_mlm": (tf.ModernBertForMaskedLM, tf.ModernBertConfig(
        **MODERNBERT, attention_dropout=0.1, norm_bias=True, classifier_activation="relu", mlp_dropout=0.05)),
    "modernbert_ner": (tf.ModernBertForTokenClassification, tf.ModernBertConfig(
        **MODERNBERT, num_labels=5, classifier_bias=True, classifier_dropout=0.2)),
    "deberta_v3_cls": (tf.DebertaV2ForSequenceClassification, tf.DebertaV2Config(**DEBERTA_V3, num_labels=3)),
    "deberta_v3_mlm": (tf.DebertaV2ForMaskedLM, tf.DebertaV2Config(**DEBERTA_V3, hidden_act="gelu_new")),
    "deberta_v3_ner": (tf.DebertaV2ForTokenClassification, tf.DebertaV2Config(**DEBERTA_V3, num_labels=4)),
    "deberta_v2_cls": (tf.DebertaV2ForSequenceClassification, tf.DebertaV2Config(
        **{**DEBERTA_V3, "share_att_key": False, "pos_att_type": "c2p|p2c"}, num_labels=2)),
    "deberta_v2_c2p_ner": (tf.DebertaV2ForTokenClassification, tf.DebertaV2Config(
        **{**DEBERTA_V3, "share_att_key": False, "pos_att_type": ["c2p"], "position_biased_input": True}, num_labels=3)),
    "deberta_v3_new_head_mlm": (tf.DebertaV2ForMaskedLM, tf.DebertaV2Config(**DEBERTA_V3, legacy=False)),
    "vit_img": (tf.ViTForImageClassification, tf.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=40, image_size=8, patch_size=4,
        num_labels=3, hidden_dropout_prob=0.1)),
    "vit_base": (tf.ViTModel, tf.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24, image_size=[8, 12],
        patch_size=[4, 6], num_channels=1, qkv_bias=False, pooler_output_size=8, hidden_act="relu")),
    "siglip_img": (tf.SiglipForImageClassification, tf.SiglipConfig(
        vision_config=dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=40,
                           image_size=12, patch_size=4, num_channels=1, layer_norm_eps=1e-5, hidden_act="gelu"),
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20),
        num_labels=3)),
    "gemma3_vlm": (tf.Gemma3ForConditionalGeneration, tf.Gemma3Config(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                         layer_types=["sliding_attention", "full_attention"]),
        vision_config=dict(hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                           image_size=28, patch_size=7, vision_use_head=False),
        mm_tokens_per_image=4, boi_token_index=60, eoi_token_index=61, image_token_index=62)),
    "whisper": (tf.WhisperForConditionalGeneration, tf.WhisperConfig(
        vocab_size=96, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=40, decoder_ffn_dim=24, num_mel_bins=8, max_source_positions=10,
        max_target_positions=12, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)),
    "bert_base": (tf.BertModel, tf.BertConfig(**ENCODER, hidden_act="relu")),
    "bert_cls": (tf.BertForSequenceClassification, tf.BertConfig(**ENCODER, num_labels=3, classifier_dropout=0.2)),
    "bert_mlm": (tf.BertForMaskedLM, tf.BertConfig(**ENCODER, layer_norm_eps=1e-6, hidden_act="gelu_new")),
    "bert_ner": (tf.BertForTokenClassification, tf.BertConfig(**ENCODER, num_labels=5, pad_token_id=3)),
    "bert_qa": (tf.BertForQuestionAnswering, tf.BertConfig(**ENCODER, attention_probs_dropout_prob=0.0)),
    "roberta_mlm": (tf.RobertaForMaskedLM, tf.RobertaConfig(**ENCODER)),
    "roberta_cls": (tf.RobertaForSequenceClassification, tf.RobertaConfig(**ENCODER, num_labels=4)),
    "xlm_roberta_ner": (tf.XLMRobertaForTokenClassification, tf.XLMRobertaConfig(**ENCODER, num_labels=3)),
    "xlm_roberta_cls": (tf.XLMRobertaForSequenceClassification, tf.XLMRobertaConfig(**ENCODER, num_labels=2)),
}


# peft models (peft 0.21.2's `print`): the base in OUT_DIR/<case>/, the adapters in
# OUT_DIR/<case>/adapter/ (a second adapter in adapter/second/).
PEFT_CASES = {
    "peft_llama": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1,
                                 task_type="CAUSAL_LM"), dict(r=2, target_modules=["q_proj", "k_proj"])),
    "peft_bert_cls_dora": ("bert_cls", dict(r=4, target_modules=["query", "value", "dense"], use_dora=True,
                                            task_type="SEQ_CLS"), None),
    "peft_roberta_cls": ("roberta_cls", dict(r=2, target_modules=["query"], task_type="SEQ_CLS"), None),
    "peft_gpt2": ("gpt2_lm", dict(r=4, target_modules=["c_attn"], fan_in_fan_out=True), None),
}


def main():
    for case, (cls, config) in CASES.items():
        torch.manual_seed(0)
        model = cls(config)
        model.save_pretrained(OUT / case)
        (OUT / case / "repr.txt").write_text(str(model), encoding="utf-8")
    import peft

    for case, (base, config, second) in PEFT_CASES.items():
        cls, base_config = CASES[base]
        torch.manual_seed(0)
        model = cls(base_config)
        model.save_pretrained(OUT / case)
        model = peft.get_peft_model(model, peft.LoraConfig(**config))
        if second:
            model.add_adapter("second", peft.LoraConfig(**second))
        model.save_pretrained(OUT / case / "adapter")
        (OUT / case / "repr.txt").write_text(str(model), encoding="utf-8")
    print("module_reprs:", len(CASES) + len(PEFT_CASES), "cases")


if __name__ == "__main__":
    main()
