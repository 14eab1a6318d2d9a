//! Upstream `debug_utils.py`: `DebugUnderflowOverflow`, the forward-hook tracer that reports
//! the absolute min / max of every module's parameters, inputs and outputs and stops at the
//! first inf / nan, printing the frames that led to it.
//!
//! Upstream registers a forward hook on every `nn.Module` of the model. Here each part
//! reports its own forward, and the models call
//! [`Context::hook`](crate::Context::hook) after each of upstream's other modules would
//! have run (the same fully qualified names, class names, parameters in registration
//! order, and the positional inputs and outputs upstream's hook receives, `None` and
//! non-tensor arguments included), and [`Context::model_frame`](crate::Context::model_frame)
//! for the model itself, which counts the batches and returns the tracer's error. A tracer
//! listens to a model inside [`Context::with_tracer`](crate::Context::with_tracer); the
//! layers a checkpoint recomputes in the backward report again, as upstream's reentrant
//! checkpoint calls the modules again.
//!
//! Output goes to stdout as upstream's `print`, or to the writer given with
//! [`DebugUnderflowOverflow::with_output`]. One difference: upstream fails on a boolean
//! tensor (`abs` is not implemented for `Bool`; GPT-2's block gets one as its padding
//! mask); here its absolute values are its values, 0 and 1.

use std::collections::VecDeque;
use std::io::Write;

use tch::{Kind, Tensor};

/// What upstream's hook sees in one position of a module's inputs or outputs.
#[derive(Debug, Clone, Copy)]
pub enum Var<'a> {
    /// A tensor: its absolute min and max.
    T(&'a Tensor),
    /// `None`.
    None,
    /// Anything else (a cache object, a `ModelOutput`).
    NotTensor,
}

/// A module's output as upstream's hook receives it: one value or a tuple.
#[derive(Debug)]
pub enum Out<'a> {
    /// `output`.
    One(Var<'a>),
    /// `output[0]`, `output[1]`, ...
    Tuple(&'a [Var<'a>]),
}

/// Upstream `DebugUnderflowOverflow(model, max_frames_to_save=21, trace_batch_nums=[],
/// abort_after_batch_num=None)`.
pub struct DebugUnderflowOverflow {
    trace_batch_nums: Vec<i64>,
    abort_after_batch_num: Option<i64>,
    max_frames_to_save: usize,
    /// Upstream's `deque(maxlen=max_frames_to_save)`, which becomes a plain list (unbounded)
    /// once it is reset by the tracing mode or a dump, as upstream's code does.
    frames: VecDeque<String>,
    bounded: bool,
    frame: Vec<String>,
    batch_number: i64,
    total_calls: u64,
    detected_overflow: bool,
    /// The error raised by the last hook, until the model returns it.
    pending: Option<String>,
    out: Box<dyn Write + Send>,
}

impl std::fmt::Debug for DebugUnderflowOverflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugUnderflowOverflow")
            .field("trace_batch_nums", &self.trace_batch_nums)
            .field("abort_after_batch_num", &self.abort_after_batch_num)
            .field("max_frames_to_save", &self.max_frames_to_save)
            .field("batch_number", &self.batch_number)
            .field("detected_overflow", &self.detected_overflow)
            .finish_non_exhaustive()
    }
}

const PREFIX: &str = "                 ";

/// Upstream's `print`: stdout through `print!`, so that a test harness capturing output
/// captures the report too.
struct PrintStdout;

impl Write for PrintStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        print!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

impl Default for DebugUnderflowOverflow {
    fn default() -> Self {
        Self::new(21, Vec::new(), None)
    }
}

impl DebugUnderflowOverflow {
    /// Upstream's constructor: keep the last `max_frames_to_save` frames; trace (print
    /// every frame of) the batches numbered in `trace_batch_nums`, which turns detection off
    /// for them; stop with an error once `abort_after_batch_num` batches have finished.
    pub fn new(
        max_frames_to_save: usize,
        trace_batch_nums: Vec<i64>,
        abort_after_batch_num: Option<i64>,
    ) -> Self {
        Self {
            trace_batch_nums,
            abort_after_batch_num,
            max_frames_to_save,
            frames: VecDeque::new(),
            bounded: true,
            frame: Vec::new(),
            batch_number: 0,
            total_calls: 0,
            detected_overflow: false,
            pending: None,
            out: Box::new(PrintStdout),
        }
    }

    /// Writes the report to `out` instead of stdout.
    pub fn with_output(mut self, out: Box<dyn Write + Send>) -> Self {
        self.out = out;
        self
    }

    /// Upstream's `batch_number`: how many forwards of the whole model have finished.
    pub fn batch_number(&self) -> i64 {
        self.batch_number
    }

    fn print(&mut self, text: &str) {
        // A report that cannot be written is not worth failing the training for.
        let _ = writeln!(self.out, "{text}");
    }

    fn save_frame(&mut self) {
        let frame = std::mem::take(&mut self.frame).join("\n");
        if self.bounded && self.frames.len() == self.max_frames_to_save {
            self.frames.pop_front();
        }
        if !self.bounded || self.max_frames_to_save > 0 {
            self.frames.push_back(frame);
        }
    }

    fn trace_frames(&mut self) {
        let text = Vec::from(std::mem::take(&mut self.frames)).join("\n");
        self.print(&text);
        self.bounded = false;
    }

    fn reset_saved_frames(&mut self) {
        self.frames.clear();
        self.bounded = false;
    }

    fn dump_saved_frames(&mut self) {
        let header = format!(
            "\nDetected inf/nan during batch_number={}\nLast {} forward frames:\n{:8} {:8} metadata",
            self.batch_number,
            self.frames.len(),
            "abs min",
            "abs max"
        );
        self.print(&header);
        self.trace_frames();
        self.print("\n\n");
    }

    fn batch_start_frame(&mut self) {
        self.frame.push(format!(
            "\n\n{PREFIX} *** Starting batch number={} ***",
            self.batch_number
        ));
        self.frame
            .push(format!("{:8} {:8} metadata", "abs min", "abs max"));
    }

    fn analyse_variable(&mut self, var: Var<'_>, ctx: &str) {
        match var {
            Var::T(t) => {
                self.frame.push(abs_min_max(t, ctx));
                if self.detect_overflow(t, ctx) {
                    self.detected_overflow = true;
                }
            }
            Var::None => self.frame.push(format!("{:>17} {ctx}", "None")),
            Var::NotTensor => self.frame.push(format!("{:>17} {ctx}", "not a tensor")),
        }
    }

    /// Upstream `detect_overflow`: prints which of nan / inf the tensor holds.
    fn detect_overflow(&mut self, t: &Tensor, ctx: &str) -> bool {
        if !t.is_floating_point() {
            return false;
        }
        let any = |m: Tensor| m.any().int64_value(&[]) != 0;
        let (nans, infs) = tch::no_grad(|| (any(t.isnan()), any(t.isinf())));
        if nans {
            self.print(&format!("{ctx} has nans"));
        }
        if infs {
            self.print(&format!("{ctx} has infs"));
        }
        nans || infs
    }

    fn create_frame(
        &mut self,
        name: &str,
        class: &str,
        params: &[(&str, &Tensor)],
        inputs: &[Var<'_>],
        output: &Out<'_>,
    ) {
        self.frame.push(format!("{PREFIX} {name} {class}"));
        for (n, p) in params {
            self.analyse_variable(Var::T(p), n);
        }
        for (i, x) in inputs.iter().enumerate() {
            self.analyse_variable(*x, &format!("input[{i}]"));
        }
        match output {
            Out::One(x) => self.analyse_variable(*x, "output"),
            Out::Tuple(xs) => {
                for (i, x) in xs.iter().enumerate() {
                    self.analyse_variable(*x, &format!("output[{i}]"));
                }
            }
        }
        self.save_frame();
    }

    /// Upstream `forward_hook`; the model itself is the module named `""`.
    pub(crate) fn forward_hook(
        &mut self,
        name: &str,
        class: &str,
        params: &[(&str, &Tensor)],
        inputs: &[Var<'_>],
        output: &Out<'_>,
    ) {
        if self.pending.is_some() {
            // Upstream raised: nothing runs after the hook that raised.
            return;
        }
        let trace_mode = self.trace_batch_nums.contains(&self.batch_number);
        if trace_mode {
            self.reset_saved_frames();
        }
        if self.total_calls == 0 {
            self.batch_start_frame();
        }
        self.total_calls += 1;
        let last_frame_of_batch = name.is_empty();
        if last_frame_of_batch {
            self.batch_number += 1;
        }
        self.create_frame(name, class, params, inputs, output);
        if trace_mode {
            self.trace_frames();
        }
        if last_frame_of_batch {
            self.batch_start_frame();
        }
        if self.detected_overflow && !trace_mode {
            self.dump_saved_frames();
            self.pending = Some(
                "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further. Please scroll up above this traceback to see the activation values prior to this event.".into(),
            );
            return;
        }
        if let Some(abort) = self.abort_after_batch_num
            && self.batch_number > abort
        {
            self.pending = Some(format!(
                "DebugUnderflowOverflow: aborting after {} batches due to `abort_after_batch_num={abort}` arg",
                self.batch_number
            ));
        }
    }
}

/// Upstream `get_abs_min_max`: `f"{abs.min():8.2e} {abs.max():8.2e} {ctx}"`.
fn abs_min_max(t: &Tensor, ctx: &str) -> String {
    if t.numel() == 0 {
        // Upstream's `min()` raises on an empty tensor; say what it is instead.
        return format!("{:>17} {ctx}", "empty");
    }
    let (lo, hi) = tch::no_grad(|| {
        let a = match t.kind() {
            Kind::Bool => t.to_kind(Kind::Int64),
            _ => t.abs(),
        };
        (a.min().double_value(&[]), a.max().double_value(&[]))
    });
    format!("{} {} {ctx}", python_e(lo), python_e(hi))
}

/// Python's `format(x, "8.2e")`: two decimals, an exponent of at least two digits, right
/// aligned in 8 columns.
fn python_e(x: f64) -> String {
    let s = if x.is_nan() {
        "nan".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        let r = format!("{x:.2e}");
        let (mantissa, exp) = r.split_once('e').unwrap_or((&r, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    };
    format!("{s:>8}")
}

impl DebugUnderflowOverflow {
    /// The error the last hook raised, until the model returns it.
    pub(crate) fn take_pending(&mut self) -> Option<String> {
        self.pending.take()
    }
}

/// `"{prefix}.{rest}"`, or `rest` under an empty prefix (a bare base model).
pub fn join(prefix: &str, rest: &str) -> String {
    if prefix.is_empty() {
        rest.to_string()
    } else if rest.is_empty() {
        prefix.to_string()
    } else {
        format!("{prefix}.{rest}")
    }
}

#[cfg(test)]
mod tests {
    use super::python_e;

    #[test]
    fn numbers_are_formatted_as_pythons_8_2e() {
        assert_eq!(python_e(1.5625e-8), "1.56e-08");
        assert_eq!(python_e(6.0), "6.00e+00");
        assert_eq!(python_e(0.0), "0.00e+00");
        assert_eq!(python_e(f64::INFINITY), "     inf");
        assert_eq!(python_e(f64::NAN), "     nan");
        assert_eq!(python_e(2.5e123), "2.50e+123");
        assert_eq!(python_e(9.996), "1.00e+01");
    }
}
