//! `Trainer::predict`: upstream's `predict`, the evaluation loop run on a test set that
//! returns the predictions and labels themselves along with `test_`-prefixed metrics.

use std::sync::Arc;
use std::time::Instant;

use tchtrain_callbacks::JsonMap;

use crate::error::Result;
use crate::metrics::{PredictionOutput, speed_metrics};
use crate::trainer::{Trainer, TrainerHooks};
use tchtrain_data::Dataset;

impl Trainer {
    /// Upstream `predict(test_dataset, metric_key_prefix="test")`: runs the model over
    /// `test_dataset` in batches of `per_device_eval_batch_size`, in order, and returns the
    /// predictions, the labels and the metrics. The logits are kept unless
    /// `prediction_loss_only` is set (unlike [`evaluate`](Self::evaluate), also without
    /// `compute_metrics`). Calls `on_predict`; nothing is logged. Runs through the hooks
    /// ([`TrainerHooks::predict`]).
    pub fn predict(
        &mut self,
        test_dataset: Arc<dyn Dataset>,
        metric_key_prefix: &str,
    ) -> Result<PredictionOutput> {
        self.with_hooks(|h, t| h.predict(t, test_dataset, metric_key_prefix))
    }

    /// Upstream's base `predict` with `hooks` for its steps and data loader.
    pub(crate) fn predict_with<H: TrainerHooks + ?Sized>(
        &mut self,
        hooks: &H,
        test_dataset: Arc<dyn Dataset>,
        metric_key_prefix: &str,
    ) -> Result<PredictionOutput> {
        let _cache = tchtrain_sys::cpu_cache::CpuMemoryCache::from_env();
        self.diagnostics.memory_tracker.start("test");
        let loader = hooks.get_test_dataloader(self, test_dataset)?;
        let start = Instant::now();
        let prediction_loss_only = self.args.prediction_loss_only;
        let output = self.evaluation_loop(
            hooks,
            &loader,
            prediction_loss_only,
            metric_key_prefix,
            false,
        )?;
        let mut metrics = output.metrics;
        let total_batch_size = (self.args.eval_batch_size() * self.args.world_size()).max(1);
        for (k, v) in speed_metrics(
            metric_key_prefix,
            start,
            Some(output.num_samples as f64),
            Some(output.num_samples.div_ceil(total_batch_size) as f64),
            None,
        ) {
            metrics.insert(k, v);
        }
        let map: JsonMap = metrics.iter().map(|(k, v)| (k.clone(), *v)).collect();
        self.callback_handler
            .on_predict(&self.args, &self.state, &mut self.control, &map)?;
        self.diagnostics
            .memory_tracker
            .stop_and_update_metrics("test", Some(&mut metrics));
        Ok(PredictionOutput {
            predictions: output.predictions,
            label_ids: output.label_ids,
            metrics,
        })
    }
}
