//! `DebugOption`: upstream `debug_utils.py`, the values of the `debug` field.

use crate::string_enum::string_enum;

string_enum! {
    /// A debug feature enabled through `debug`: upstream `DebugOption`.
    pub enum DebugOption ("DebugOption") {
        /// Detect overflow/underflow in activations and weights.
        UnderflowOverflow = "underflow_overflow",
        /// Print TPU metrics (upstream's TPU debug; no effect in tchtrain).
        TpuMetricsDebug = "tpu_metrics_debug",
    }
    default = UnderflowOverflow;
}
