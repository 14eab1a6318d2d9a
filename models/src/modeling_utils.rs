//! The `PreTrainedModel` trait the Trainer drives, its inputs and outputs
//! (upstream `modeling_utils.PreTrainedModel` and `modeling_outputs`).

use std::path::Path;

use tch::{Tensor, nn::VarStore};

use crate::Result;
use crate::configuration_utils::PretrainedConfig;
use crate::loading::{self, LoadingInfo};

/// The keyword arguments of upstream's `model(**batch)`: every tensor is optional but
/// `input_ids`, as in upstream's forward signatures.
#[derive(Debug, Default, Clone, Copy)]
pub struct ModelInputs<'a> {
    /// Token ids `[batch, seq]` (int64).
    pub input_ids: Option<&'a Tensor>,
    /// 1 for tokens to attend to, 0 for padding `[batch, seq]`.
    pub attention_mask: Option<&'a Tensor>,
    /// Segment ids `[batch, seq]` (BERT, GPT-2).
    pub token_type_ids: Option<&'a Tensor>,
    /// Positions `[batch, seq]`; default `0..seq`.
    pub position_ids: Option<&'a Tensor>,
    /// Labels; when given, the output carries the loss.
    pub labels: Option<&'a Tensor>,
    /// Number of label items in the whole accumulation window (and across ranks): the
    /// loss is summed and divided by it, as upstream's `num_items_in_batch`.
    pub num_items_in_batch: Option<&'a Tensor>,
}

impl<'a> ModelInputs<'a> {
    /// Inputs with only `input_ids`.
    pub fn new(input_ids: &'a Tensor) -> Self {
        Self {
            input_ids: Some(input_ids),
            ..Self::default()
        }
    }

    pub(crate) fn ids(&self) -> Result<&'a Tensor> {
        self.input_ids
            .ok_or(crate::Error::MissingInput { name: "input_ids" })
    }
}

/// What a forward pass returns (upstream's `CausalLMOutput`, `SequenceClassifierOutput`,
/// `BaseModelOutputWithPooling`, ... folded into one struct).
#[derive(Debug)]
pub struct ModelOutput {
    /// The loss when labels were given.
    pub loss: Option<Tensor>,
    /// Logits of the head; for base models, the last hidden state.
    pub logits: Tensor,
    /// The last hidden state of the base model.
    pub last_hidden_state: Option<Tensor>,
    /// The pooled output (BERT's pooler) when the model has one.
    pub pooler_output: Option<Tensor>,
}

/// A model with upstream's parameter names, trainable through its `VarStore`.
pub trait PreTrainedModel: Send {
    /// Upstream class name, written to `config.json`'s `architectures`.
    fn architecture(&self) -> &'static str;
    /// The model's config (serialised as `config.json`).
    fn config(&self) -> &dyn PretrainedConfig;
    /// The variables, named as upstream's `state_dict` keys.
    fn var_store(&self) -> &VarStore;
    /// Mutable access to the variables (dtype / device moves, loading).
    fn var_store_mut(&mut self) -> &mut VarStore;
    /// Whether dropout is active (upstream `model.training`).
    fn is_training(&self) -> bool;
    /// Switches between training (dropout applied) and evaluation mode.
    fn set_training(&mut self, training: bool);
    /// Runs the model; with labels, computes the loss through `tchtrain-losses`.
    fn forward(&self, inputs: &ModelInputs<'_>) -> Result<ModelOutput>;

    /// Keys that are views of another parameter (tied weights) and are not saved,
    /// as upstream's `_tied_weights_keys`: `(tied key, source key)`.
    fn tied_weights(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Upstream `model.train()`.
    fn train(&mut self) {
        self.set_training(true);
    }

    /// Upstream `model.eval()`.
    fn eval(&mut self) {
        self.set_training(false);
    }

    /// Number of parameters (upstream `num_parameters()`), tied weights counted once.
    fn num_parameters(&self) -> i64 {
        self.var_store()
            .variables()
            .values()
            .map(Tensor::numel)
            .map(|n| n as i64)
            .sum()
    }

    /// Writes `config.json` and `model.safetensors` (tied weights saved once), so that
    /// upstream's `from_pretrained` loads the folder.
    fn save_pretrained(&self, dir: &Path) -> Result<()> {
        loading::save_pretrained(self, dir)
    }
}

/// The `PreTrainedModel` methods every architecture implements the same way, for a
/// struct with fields `config`, `vs` (its `VarStore`) and `training`.
macro_rules! model_plumbing {
    () => {
        fn config(&self) -> &dyn $crate::PretrainedConfig {
            &self.config
        }
        fn var_store(&self) -> &tch::nn::VarStore {
            &self.vs
        }
        fn var_store_mut(&mut self) -> &mut tch::nn::VarStore {
            &mut self.vs
        }
        fn is_training(&self) -> bool {
            self.training
        }
        fn set_training(&mut self, training: bool) {
            self.training = training;
        }
    };
}
pub(crate) use model_plumbing;

/// A freshly built or loaded model together with its loading report.
pub struct Loaded<M> {
    /// The model.
    pub model: M,
    /// Missing / unexpected / mismatched keys, as upstream's loading report.
    pub info: LoadingInfo,
}

impl<M> std::fmt::Debug for Loaded<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}
