//! POSIX signals for `launch`: sending a signal to a rank's process group (torchrun's
//! `os.killpg`) and noticing SIGINT / SIGTERM / SIGHUP / SIGQUIT sent to the launcher, so
//! that it can stop its ranks before exiting (torchrun's `TORCHELASTIC_SIGNALS_TO_HANDLE`).
//!
//! std has no API for either; this module declares the two libc functions it needs (libc
//! is linked by std on every Unix, so no crate is added). It is the only unsafe code of
//! xtask.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};

/// `SIGINT` (Ctrl-C).
pub const SIGINT: i32 = 2;
/// `SIGKILL`.
pub const SIGKILL: i32 = 9;
/// `SIGTERM`.
pub const SIGTERM: i32 = 15;
/// `SIGCONT` (continues a stopped process).
#[cfg(not(target_vendor = "apple"))]
pub const SIGCONT: i32 = 18;
/// `SIGCONT` (continues a stopped process).
#[cfg(target_vendor = "apple")]
pub const SIGCONT: i32 = 19;
/// `SIGSTOP` (stops a process; it cannot be caught).
#[cfg(not(target_vendor = "apple"))]
pub const SIGSTOP: i32 = 19;
/// `SIGSTOP` (stops a process; it cannot be caught).
#[cfg(target_vendor = "apple")]
pub const SIGSTOP: i32 = 17;
const SIGHUP: i32 = 1;
const SIGQUIT: i32 = 3;

unsafe extern "C" {
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn signal(signum: c_int, handler: extern "C" fn(c_int)) -> usize;
}

/// The last handled signal received, 0 when none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: c_int) {
    // Only an atomic store: async-signal-safe.
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// Replaces the default action of SIGINT, SIGTERM, SIGHUP and SIGQUIT by recording the
/// signal; [`received`] reports it. Called once by the `launch` command (never by tests).
pub fn catch_termination_signals() {
    for sig in [SIGINT, SIGTERM, SIGHUP, SIGQUIT] {
        // SAFETY: `on_signal` is an `extern "C" fn(c_int)` doing one atomic store.
        unsafe { signal(sig, on_signal) };
    }
}

/// The signal caught by [`catch_termination_signals`], if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Sends `sig` to every process of the group `pgid` (`killpg`); `false` when none is left.
pub fn kill_group(pgid: u32, sig: i32) -> bool {
    let Ok(pgid) = c_int::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: plain syscall; a negative pid names a process group.
    unsafe { kill(-pgid, sig) == 0 }
}
