//! Graceful stop on SIGINT / SIGTERM (upstream's `enable_jit_checkpoint`): while a
//! [`StopSignals`] guard lives, the first of these signals only records itself, so that
//! the training loop can finish the current optimizer step, save a checkpoint and return;
//! a second one exits the process at once with the shell's status (128 + the signal:
//! 130 for SIGINT, 143 for SIGTERM). With no guard alive the signals keep their default
//! action (the process is terminated by them).
//!
//! Built on `signal-hook`'s safe flag actions, registered once per process for each signal,
//! in this order (signal-hook runs a signal's actions in registration order):
//! 1. `register_conditional_default(sig, OUTSIDE)`: no guard alive, the default action;
//! 2. `register_conditional_shutdown(sig, 128 + sig, ARMED)`: a signal already recorded,
//!    exit at once;
//! 3. `register(sig, ARMED)` and `register_usize(sig, RECEIVED, sig)`: record this one.
//!
//! signal-hook never uninstalls its handler, so "restoring" is these flags going back to
//! the no-guard state; a handler the process had before the first guard is chained by
//! signal-hook after these actions.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use signal_hook::consts::{SIGINT as SIGINT_C, SIGTERM as SIGTERM_C};
use signal_hook::flag;

/// `SIGINT` (Ctrl-C).
pub(crate) const SIGINT: i32 = SIGINT_C;
/// `SIGTERM` (what orchestrators send before killing a job).
pub(crate) const SIGTERM: i32 = SIGTERM_C;
/// The signals a graceful stop answers.
const HANDLED: [i32; 2] = [SIGINT, SIGTERM];

/// The flags the registered actions read and write.
struct Flags {
    /// No guard alive: the signals take their default action.
    outside: Arc<AtomicBool>,
    /// A stop signal was recorded since the guards were installed.
    armed: Arc<AtomicBool>,
    /// The last stop signal recorded, 0 when none.
    received: Arc<AtomicUsize>,
}

/// The actions, registered on the first guard.
static FLAGS: OnceLock<Flags> = OnceLock::new();

/// How many guards are alive.
static GUARDS: Mutex<usize> = Mutex::new(0);

fn register() -> std::io::Result<Flags> {
    let flags = Flags {
        outside: Arc::new(AtomicBool::new(true)),
        armed: Arc::new(AtomicBool::new(false)),
        received: Arc::new(AtomicUsize::new(0)),
    };
    for sig in HANDLED {
        flag::register_conditional_default(sig, Arc::clone(&flags.outside))?;
        flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&flags.armed))?;
        flag::register(sig, Arc::clone(&flags.armed))?;
        flag::register_usize(sig, Arc::clone(&flags.received), sig as usize)?;
    }
    Ok(flags)
}

fn flags() -> std::io::Result<&'static Flags> {
    if let Some(f) = FLAGS.get() {
        return Ok(f);
    }
    let f = register()?;
    Ok(FLAGS.get_or_init(|| f))
}

/// Records SIGINT / SIGTERM instead of their default action while it lives (see the
/// module docs); when the last guard drops, they take their default action again.
#[derive(Debug)]
pub(crate) struct StopSignals(());

impl StopSignals {
    /// Arms the handling (once for nested guards) and forgets any earlier stop request.
    pub(crate) fn install() -> std::io::Result<Self> {
        let mut guards = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
        let f = flags()?;
        if *guards == 0 {
            f.armed.store(false, Ordering::SeqCst);
            f.received.store(0, Ordering::SeqCst);
            f.outside.store(false, Ordering::SeqCst);
        }
        *guards += 1;
        Ok(Self(()))
    }

    /// The stop signal received since the guard was installed, if any.
    pub(crate) fn received(&self) -> Option<i32> {
        match FLAGS.get().map(|f| f.received.load(Ordering::SeqCst)) {
            None | Some(0) => None,
            Some(s) => Some(s as i32),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        let mut guards = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
        *guards = guards.saturating_sub(1);
        if *guards == 0
            && let Some(f) = FLAGS.get()
        {
            f.outside.store(true, Ordering::SeqCst);
            f.armed.store(false, Ordering::SeqCst);
            f.received.store(0, Ordering::SeqCst);
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
