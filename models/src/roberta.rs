//! RoBERTa and XLM-RoBERTa (upstream `models/roberta`, `models/xlm_roberta`, the latter
//! generated from the former): their configs with upstream's defaults, and BERT's encoder
//! with RoBERTa's embeddings (positions counted from `pad_token_id + 1` over the
//! non-padding tokens, `position_embeddings` registered last with the padding index), its
//! `lm_head` (dense, exact GELU, `layer_norm`, the tied decoder) and its
//! `RobertaClassificationHead` on the first token (dropout, dense, tanh, dropout,
//! `out_proj`); no pooler under a head. XLM-RoBERTa's heads register before its body. The
//! losses are BERT's (a plain mean).

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::bert::{Bert, BertConfig, EncoderConfig, EncoderFamily};
use crate::configuration_utils::LabelConfig;
use crate::heads;

/// A RoBERTa-shaped config: upstream's fields (BERT's plus `bos_token_id`, `eos_token_id`)
/// and defaults, its `model_type` and class names.
macro_rules! roberta_config {
    ($(#[$doc:meta])* $name:ident, $model_type:literal, $prefix:literal, vocab_size: $vocab:expr,
        head_first: $head_first:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        #[allow(missing_docs)]
        pub struct $name {
            pub vocab_size: i64,
            pub hidden_size: i64,
            pub num_hidden_layers: i64,
            pub num_attention_heads: i64,
            pub intermediate_size: i64,
            pub hidden_act: String,
            pub hidden_dropout_prob: f64,
            pub attention_probs_dropout_prob: f64,
            pub max_position_embeddings: i64,
            pub type_vocab_size: i64,
            pub initializer_range: f64,
            pub layer_norm_eps: f64,
            pub pad_token_id: Option<i64>,
            pub bos_token_id: Option<i64>,
            pub eos_token_id: Option<serde_json::Value>,
            pub classifier_dropout: Option<f64>,
            pub is_decoder: bool,
            pub tie_word_embeddings: bool,
            #[serde(flatten)]
            pub labels: LabelConfig,
            /// Keys this crate does not interpret, kept so config.json round-trips.
            #[serde(flatten)]
            pub extra: serde_json::Map<String, serde_json::Value>,
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    vocab_size: $vocab,
                    hidden_size: 768,
                    num_hidden_layers: 12,
                    num_attention_heads: 12,
                    intermediate_size: 3072,
                    hidden_act: "gelu".into(),
                    hidden_dropout_prob: 0.1,
                    attention_probs_dropout_prob: 0.1,
                    max_position_embeddings: 512,
                    type_vocab_size: 2,
                    initializer_range: 0.02,
                    layer_norm_eps: 1e-12,
                    pad_token_id: Some(1),
                    bos_token_id: Some(0),
                    eos_token_id: Some(2.into()),
                    classifier_dropout: None,
                    is_decoder: false,
                    tie_word_embeddings: true,
                    labels: LabelConfig::default(),
                    extra: Default::default(),
                }
            }
        }

        impl $crate::configuration_utils::PretrainedConfig for $name {
            fn model_type(&self) -> &'static str {
                $model_type
            }
            fn to_json_value(&self) -> Result<serde_json::Value> {
                $crate::configuration_utils::to_value(self)
            }
            fn labels(&self) -> &LabelConfig {
                &self.labels
            }
        }

        impl EncoderConfig for $name {
            fn from_file(path: &std::path::Path) -> Result<Self> {
                let c: Self = $crate::configuration_utils::read_config(path)?;
                c.bert().validate()?;
                Ok(c)
            }
            fn bert(&self) -> BertConfig {
                let mut extra = self.extra.clone();
                if let Some(bos) = self.bos_token_id {
                    extra.insert("bos_token_id".into(), bos.into());
                }
                if let Some(eos) = &self.eos_token_id {
                    extra.insert("eos_token_id".into(), eos.clone());
                }
                BertConfig {
                    vocab_size: self.vocab_size,
                    hidden_size: self.hidden_size,
                    num_hidden_layers: self.num_hidden_layers,
                    num_attention_heads: self.num_attention_heads,
                    intermediate_size: self.intermediate_size,
                    hidden_act: self.hidden_act.clone(),
                    hidden_dropout_prob: self.hidden_dropout_prob,
                    attention_probs_dropout_prob: self.attention_probs_dropout_prob,
                    max_position_embeddings: self.max_position_embeddings,
                    type_vocab_size: self.type_vocab_size,
                    initializer_range: self.initializer_range,
                    layer_norm_eps: self.layer_norm_eps,
                    pad_token_id: self.pad_token_id,
                    classifier_dropout: self.classifier_dropout,
                    is_decoder: self.is_decoder,
                    tie_word_embeddings: self.tie_word_embeddings,
                    labels: self.labels.clone(),
                    extra,
                }
            }
            fn family(&self) -> EncoderFamily {
                EncoderFamily {
                    model_type: $model_type,
                    base_model_prefix: "roberta",
                    prefix: $prefix,
                    classes: [
                        concat!($prefix, "Model"),
                        concat!($prefix, "ForMaskedLM"),
                        concat!($prefix, "ForSequenceClassification"),
                        concat!($prefix, "ForTokenClassification"),
                        concat!($prefix, "ForQuestionAnswering"),
                    ],
                    roberta: true,
                    head_first: $head_first,
                }
            }
            fn labels_mut(&mut self) -> &mut LabelConfig {
                &mut self.labels
            }
            fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value> {
                &mut self.extra
            }
        }
    };
}

roberta_config!(
    /// Upstream `RobertaConfig` with its defaults (RoBERTa base).
    RobertaConfig, "roberta", "Roberta", vocab_size: 50265, head_first: false
);
roberta_config!(
    /// Upstream `XLMRobertaConfig` with its defaults.
    XLMRobertaConfig, "xlm-roberta", "XLMRoberta", vocab_size: 30522, head_first: true
);

/// Upstream `RobertaModel` as a standalone model (weights at the root, with the pooler).
pub type RobertaModel = Bert<RobertaConfig, heads::Base>;
/// Upstream `RobertaForMaskedLM`.
pub type RobertaForMaskedLM = Bert<RobertaConfig, heads::MaskedLm>;
/// Upstream `RobertaForSequenceClassification`.
pub type RobertaForSequenceClassification = Bert<RobertaConfig, heads::SequenceClassification>;
/// Upstream `RobertaForTokenClassification`.
pub type RobertaForTokenClassification = Bert<RobertaConfig, heads::TokenClassification>;
/// Upstream `RobertaForQuestionAnswering`.
pub type RobertaForQuestionAnswering = Bert<RobertaConfig, heads::QuestionAnswering>;
/// Upstream `XLMRobertaModel` (weights at the root, with the pooler).
pub type XLMRobertaModel = Bert<XLMRobertaConfig, heads::Base>;
/// Upstream `XLMRobertaForMaskedLM`.
pub type XLMRobertaForMaskedLM = Bert<XLMRobertaConfig, heads::MaskedLm>;
/// Upstream `XLMRobertaForSequenceClassification`.
pub type XLMRobertaForSequenceClassification =
    Bert<XLMRobertaConfig, heads::SequenceClassification>;
/// Upstream `XLMRobertaForTokenClassification`.
pub type XLMRobertaForTokenClassification = Bert<XLMRobertaConfig, heads::TokenClassification>;
/// Upstream `XLMRobertaForQuestionAnswering`.
pub type XLMRobertaForQuestionAnswering = Bert<XLMRobertaConfig, heads::QuestionAnswering>;
