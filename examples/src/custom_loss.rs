//! `custom_loss`: the Trainer documentation's custom loss, a subclass overriding
//! `compute_loss` with class weights in the cross entropy —
//!
//! ```python
//! class CustomTrainer(Trainer):
//!     def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
//!         labels = inputs.pop("labels")
//!         outputs = model(**inputs)
//!         logits = outputs.get("logits")
//!         loss_fct = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0], device=model.device))
//!         loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
//!         return (loss, outputs) if return_outputs else loss
//! ```
//!
//! — as [`TrainerHooks`]: `Trainer::builder(model, args).hooks(WeightedLoss::new(vec![1.0,
//! 3.0]))`. The rest of the step is upstream's (the loss, a per-batch mean, is divided over
//! gradient accumulation by upstream's rule). Tested against upstream's `CustomTrainer` on
//! MiniLM classification: every logged loss, gradient norm and evaluation loss equal.

use tch::{Kind, Tensor};
use tchtrain_collators::Batch;
use tchtrain_models::{ModelOutput, TrainableModel};
use tchtrain_trainer::{Error, Result, StepContext, TrainerHooks, model_forward, model_inputs};

/// `compute_loss` with `nn.CrossEntropyLoss(weight=class_weights)` on the model's logits.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedLoss {
    /// One weight per class.
    pub class_weights: Vec<f64>,
}

impl WeightedLoss {
    /// The hooks with `class_weights` (one per label of the model's head).
    pub fn new(class_weights: Vec<f64>) -> Self {
        Self { class_weights }
    }
}

impl TrainerHooks for WeightedLoss {
    fn compute_loss(
        &self,
        ctx: &StepContext<'_>,
        model: &dyn TrainableModel,
        inputs: &Batch,
        _num_items_in_batch: Option<&Tensor>,
    ) -> Result<(Tensor, ModelOutput)> {
        // labels = inputs.pop("labels"); outputs = model(**inputs)
        let labels = inputs.get("labels").ok_or_else(|| Error::MissingLoss {
            keys: inputs.keys().collect::<Vec<_>>().join(", "),
        })?;
        let mut without_labels = model_inputs(inputs);
        without_labels.labels = None;
        let outputs = model_forward(ctx, model, &without_labels)?;
        let logits = outputs.logits()?;
        let num_labels = logits.size().last().copied().unwrap_or(1);
        if self.class_weights.len() as i64 != num_labels {
            return Err(Error::InvalidArgument {
                field: "class_weights",
                detail: format!(
                    "{} weights for a head of {num_labels} labels: give one weight per label",
                    self.class_weights.len()
                ),
            });
        }
        let weight = Tensor::f_from_slice(&self.class_weights)?
            .f_to_kind(Kind::Float)?
            .f_to_device(logits.device())?;
        let loss = logits.f_view([-1, num_labels])?.f_cross_entropy_loss(
            &labels.f_view([-1])?,
            Some(&weight),
            tch::Reduction::Mean,
            -100,
            0.0,
        )?;
        Ok((loss, outputs))
    }
}
