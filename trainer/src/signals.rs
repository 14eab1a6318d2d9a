//! Graceful stop on SIGINT / SIGTERM (upstream's `enable_jit_checkpoint`): while a
//! [`StopSignals`] guard lives, the first of these signals only records itself, so that
//! the training loop can finish the current optimizer step, save a checkpoint and return;
//! a second one exits the process at once with the shell's status (128 + the signal:
//! 130 for SIGINT, 143 for SIGTERM).
//!
//! std and tch have no signal API; this module declares the two libc functions it needs
//! (libc is linked by std on every Unix, so no crate is added). It is the only unsafe code
//! of the crate, and the handler does only async-signal-safe work (atomics and `_exit`).
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

/// `SIGINT` (Ctrl-C).
pub(crate) const SIGINT: i32 = 2;
/// `SIGTERM` (what orchestrators send before killing a job).
pub(crate) const SIGTERM: i32 = 15;
/// The signals a graceful stop answers.
const HANDLED: [i32; 2] = [SIGINT, SIGTERM];
/// `SIG_ERR`: `signal`'s failure value, `(sighandler_t) -1`.
const SIG_ERR: usize = usize::MAX;

unsafe extern "C" {
    /// libc `signal`: the handler is a `sighandler_t`, passed as an address (which also
    /// carries `SIG_DFL` = 0 and `SIG_IGN` = 1 when restoring). glibc and musl give it BSD
    /// semantics (the handler stays installed, interrupted calls restart).
    fn signal(signum: c_int, handler: usize) -> usize;
    /// libc `_exit`: ends the process without running atexit handlers (async-signal-safe).
    fn _exit(status: c_int) -> !;
}

/// The first stop signal received while a guard is installed, 0 when none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// How many guards are alive and the handlers they replaced (restored by the last one).
static INSTALLED: Mutex<(usize, [usize; 2])> = Mutex::new((0, [0; 2]));

extern "C" fn on_signal(sig: c_int) {
    // Atomics and `_exit` only: async-signal-safe.
    if RECEIVED
        .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // SAFETY: `_exit` is async-signal-safe and never returns.
        unsafe { _exit(128 + sig) }
    }
}

/// Records SIGINT / SIGTERM instead of their default action while it lives (see the
/// module docs); dropping the last guard restores the handlers that were there before.
#[derive(Debug)]
pub(crate) struct StopSignals(());

impl StopSignals {
    /// Installs the handler (once for nested guards) and forgets any earlier stop request.
    pub(crate) fn install() -> std::io::Result<Self> {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if installed.0 == 0 {
            RECEIVED.store(0, Ordering::SeqCst);
            let handler = on_signal as extern "C" fn(c_int) as usize;
            let mut previous = [0; 2];
            for (i, &sig) in HANDLED.iter().enumerate() {
                // SAFETY: `on_signal` is an `extern "C" fn(c_int)` doing only
                // async-signal-safe work.
                let old = unsafe { signal(sig, handler) };
                if old == SIG_ERR {
                    let err = std::io::Error::last_os_error();
                    restore(&previous[..i]);
                    return Err(err);
                }
                previous[i] = old;
            }
            installed.1 = previous;
        }
        installed.0 += 1;
        Ok(Self(()))
    }

    /// The stop signal received since the guard was installed, if any.
    pub(crate) fn received(&self) -> Option<i32> {
        match RECEIVED.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }
}

/// Puts back `previous[i]` as the handler of `HANDLED[i]`.
fn restore(previous: &[usize]) {
    for (&sig, &old) in HANDLED.iter().zip(previous) {
        // SAFETY: `old` is what `signal` returned for this signal: a valid handler,
        // `SIG_DFL` or `SIG_IGN`.
        unsafe { signal(sig, old) };
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        installed.0 = installed.0.saturating_sub(1);
        if installed.0 == 0 {
            let previous = installed.1;
            restore(&previous);
            RECEIVED.store(0, Ordering::SeqCst);
        }
    }
}

/// The name of a stop signal, for the log.
pub(crate) fn name(sig: i32) -> &'static str {
    match sig {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "signal",
    }
}
