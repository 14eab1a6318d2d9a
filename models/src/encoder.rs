//! An encoder with one of upstream's task heads, generic over the family: upstream's
//! `...Model`, `...ForMaskedLM`, `...ForSequenceClassification`,
//! `...ForTokenClassification` and `...ForQuestionAnswering` all put a base model under
//! `base_model_prefix` (at the root for the base model) and a head at the root.
//!
//! [`EncoderFor`] owns what the five share: the variable store, training mode,
//! padding-free execution, `from_pretrained`, the Trainer's plumbing. A family
//! ([`EncoderArchitecture`], implemented by its config) says what differs: its body, its
//! heads and their forward.

use std::marker::PhantomData;
use std::path::Path;

use tch::{Device, nn};
use tchtrain_nn::Context;

use crate::PreTrainedModel;
use crate::checkpoint::ActivationCheckpointing;
use crate::configuration_utils::{LabelConfig, PretrainedConfig};
use crate::heads::{HeadKind, TaskHead};
use crate::loading::{self, LoadOptions};
use crate::modeling_utils::{LabelCheck, Loaded, ModelInputs, ModelOutput, TrainableModel};
use crate::padding_free::EncoderHead;
use crate::{Error, Result};

/// What an encoder family puts in [`EncoderFor`]; its config type is the family.
pub trait EncoderArchitecture:
    PretrainedConfig + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// The base model (upstream's `...Model`).
    type Body: std::fmt::Debug + Send;
    /// The family's heads (one value per head kind).
    type Head: std::fmt::Debug + Send;

    /// Reads and checks `config.json`.
    fn config_from_file(path: &Path) -> Result<Self>;
    /// `num_labels`, `id2label`, `problem_type` (to set `num_labels`).
    fn labels_mut(&mut self) -> &mut LabelConfig;
    /// Keys not interpreted (`use_cache`, ...), kept so that `config.json` round-trips.
    fn extra_mut(&mut self) -> &mut serde_json::Map<String, serde_json::Value>;
    /// `tie_word_embeddings`: the masked-LM decoder is the word embeddings (the only
    /// decoder implemented).
    fn tie_word_embeddings(&self) -> bool;
    /// Upstream's `base_model_prefix`: where the body sits under a head.
    fn base_model_prefix(&self) -> &'static str;
    /// Upstream's class names: base, masked LM, sequence classification, token
    /// classification, question answering.
    fn classes(&self) -> [&'static str; 5];
    /// What a head of `kind` reads of the last hidden state (whether it can run
    /// padding-free).
    fn encoder_head(&self, kind: HeadKind) -> EncoderHead {
        EncoderHead::of(kind)
    }
    /// The body under `body` and the head of `kind` under `root`, their variables created
    /// in upstream's order.
    fn build(
        &self,
        kind: HeadKind,
        root: &tchtrain_nn::Path<'_>,
        body: tchtrain_nn::Path<'_>,
    ) -> Result<(Self::Body, Self::Head)>;
    /// The body's activation-checkpointing settings.
    fn checkpointing(body: &mut Self::Body) -> &mut Option<ActivationCheckpointing>;
    /// Whether the body checkpoints its layers.
    fn is_checkpointing(body: &Self::Body) -> bool;
    /// The body and the head on `inputs` (the logits, the loss when there are labels).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        kind: HeadKind,
        body: &Self::Body,
        head: &Self::Head,
        ctx: &Context,
        inputs: &ModelInputs<'_>,
        train: bool,
        padding_free: bool,
    ) -> Result<ModelOutput>;
    /// Whether the body's parameter `name` (without the prefix) is an embedding weight
    /// (no weight decay under upstream's rule).
    fn is_embedding_weight(&self, name: &str) -> bool;
    /// What `print(model)` shows of the model with the head of `kind` (upstream's module
    /// tree and class names); `None` where the family's tree is not written out.
    fn module_repr(&self, kind: HeadKind, body: &Self::Body) -> Option<tchtrain_nn::ModuleRepr> {
        let _ = (kind, body);
        None
    }
    /// The head's parameters tied to another (`(tied, source)`), not stored in checkpoints.
    fn tied_weights(&self, kind: HeadKind) -> Vec<(String, String)>;
    /// What the Trainer checks of the labels before the first step.
    fn label_check(&self, kind: HeadKind) -> Option<LabelCheck> {
        kind.label_check(self.labels().num_labels())
    }
    /// Upstream's `loss_type` when it is not the class name's default.
    fn loss_type(_kind: HeadKind) -> Option<&'static str> {
        None
    }
    /// Upstream's `main_input_name` (`input_ids`; a vision family's `pixel_values`).
    fn main_input_name(&self) -> &'static str {
        "input_ids"
    }
    /// Whether a checkpoint's unused key is reported as unexpected (upstream's
    /// `_keys_to_ignore_on_load_unexpected` say no).
    fn reports_unexpected(_key: &str) -> bool {
        true
    }
}

/// An encoder of family `C` with the head `K`; use the families' type aliases
/// ([`BertForMaskedLM`](crate::BertForMaskedLM), ...).
#[derive(Debug)]
pub struct EncoderFor<C: EncoderArchitecture, K: TaskHead> {
    task: PhantomData<K>,
    vs: nn::VarStore,
    ctx: Context,
    body: C::Body,
    head: C::Head,
    config: C,
    training: bool,
    /// Run the layers on the real tokens only (see [`TrainableModel::set_padding_free`];
    /// off unless `TCHTRAIN_PADDING_FREE` turns it on).
    padding_free: bool,
}

impl<C: EncoderArchitecture, K: TaskHead> EncoderFor<C, K> {
    /// A freshly initialised model (upstream `...For...(config)`), seeded by tch's RNG.
    pub fn new(config: &C, device: Device) -> Result<Self> {
        Self::new_in(config, device, &Context::new())
    }

    /// [`new`](Self::new) with the parts sharing `ctx` (a deferred one in
    /// `from_pretrained`).
    pub(crate) fn new_in(config: &C, device: Device, ctx: &Context) -> Result<Self> {
        let vs = nn::VarStore::new(device);
        let root = tchtrain_nn::Path::root(&vs, ctx);
        let body = if K::KIND == HeadKind::Base {
            root.clone()
        } else {
            &root / config.base_model_prefix()
        };
        if K::KIND == HeadKind::MaskedLm && !config.tie_word_embeddings() {
            return Err(Error::InvalidConfig {
                field: "tie_word_embeddings",
                value: "false".into(),
                fix: "only the masked-LM decoder tied to the word embeddings is implemented; set tie_word_embeddings to true",
            });
        }
        let (body, head) = config.build(K::KIND, &root, body)?;
        Ok(Self {
            task: PhantomData,
            vs,
            ctx: ctx.clone(),
            body,
            head,
            config: config.clone(),
            training: false,
            padding_free: config.encoder_head(K::KIND) != EncoderHead::AllPositions
                && crate::modeling_utils::padding_free_from_env(),
        })
    }

    /// Upstream `from_pretrained(dir, num_labels=...)` on a resolved local folder: a base
    /// checkpoint (no prefix, e.g. MiniLM) loads into a head model and back.
    pub fn from_pretrained_dir(
        dir: &Path,
        num_labels: Option<i64>,
        device: Device,
        options: &LoadOptions,
    ) -> Result<Loaded<Self>> {
        let mut config = C::config_from_file(&dir.join(loading::CONFIG_NAME))?;
        if let Some(n) = num_labels {
            config.labels_mut().set_num_labels(n)?;
        }
        let prefix = config.base_model_prefix();
        let mut loaded = loading::from_pretrained_with(dir, prefix, &[], options, |ctx| {
            Self::new_in(&config, device, ctx)
        })?;
        loaded
            .info
            .unexpected_keys
            .retain(|k| C::reports_unexpected(k));
        Ok(loaded)
    }

    /// The base model.
    pub fn body(&self) -> &C::Body {
        &self.body
    }
}

impl<C: EncoderArchitecture, K: TaskHead> PreTrainedModel for EncoderFor<C, K> {
    fn architecture(&self) -> &'static str {
        K::KIND.class(&self.config.classes())
    }
    fn config(&self) -> &dyn PretrainedConfig {
        &self.config
    }
    fn module_repr(&self) -> Option<tchtrain_nn::ModuleRepr> {
        self.config.module_repr(K::KIND, &self.body)
    }
}

impl<C: EncoderArchitecture, K: TaskHead> TrainableModel for EncoderFor<C, K> {
    crate::modeling_utils::model_plumbing!(@common);
    fn set_use_cache(&mut self, use_cache: bool) {
        self.config
            .extra_mut()
            .insert("use_cache".into(), serde_json::Value::Bool(use_cache));
    }
    fn activation_checkpointing_enable(&mut self, settings: ActivationCheckpointing) -> Result<()> {
        *C::checkpointing(&mut self.body) = Some(settings);
        Ok(())
    }
    fn activation_checkpointing_disable(&mut self) {
        *C::checkpointing(&mut self.body) = None;
    }
    fn is_activation_checkpointing(&self) -> bool {
        C::is_checkpointing(&self.body)
    }
    fn loss_type(&self) -> Option<&str> {
        C::loss_type(K::KIND)
    }
    /// The sequence classifiers when the tokens they pool are real (the first token, or
    /// the mean of the real tokens); the masked-LM and token classifiers in training when
    /// the labels ignore the padding (-100 there: the loss reads no padding position);
    /// otherwise the forward runs padded. The base model and the question answerer (whose
    /// loss is a softmax over every position, padding included) refuse it.
    fn set_padding_free(&mut self, on: bool) -> Result<()> {
        self.config
            .encoder_head(K::KIND)
            .check(on, self.architecture())?;
        self.padding_free = on;
        Ok(())
    }
    fn label_check(&self) -> Option<LabelCheck> {
        self.config.label_check(K::KIND)
    }
    fn label_names(&self) -> Vec<String> {
        K::KIND.label_names()
    }
    fn main_input_name(&self) -> &'static str {
        self.config.main_input_name()
    }
    fn is_embedding_weight(&self, name: &str) -> bool {
        let prefix = self.config.base_model_prefix();
        let name = name
            .strip_prefix(prefix)
            .and_then(|n| n.strip_prefix('.'))
            .unwrap_or(name);
        self.config.is_embedding_weight(name)
    }
    fn tied_weights(&self) -> Vec<(String, String)> {
        self.config.tied_weights(K::KIND)
    }
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput> {
        let train = self.training;
        let padding_free =
            self.config
                .encoder_head(K::KIND)
                .runs_padding_free(self.padding_free, train, inputs);
        let out = self.config.forward(
            K::KIND,
            &self.body,
            &self.head,
            &self.ctx,
            inputs,
            train,
            padding_free,
        )?;
        self.ctx.model_frame(self.architecture())?;
        Ok(out)
    }
}
