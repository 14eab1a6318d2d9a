//! The error type of `tchtrain-distributed`.

/// Errors returned by `tchtrain-distributed`; engine failures carry libtorch's message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A launcher variable is missing or malformed.
    #[error("environment variable {name}={value}: {fix}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What to do.
        fix: &'static str,
    },
    /// The TCPStore rendezvous or the Gloo group could not be set up (wrong
    /// MASTER_ADDR/MASTER_PORT, a rank that never joined, the timeout elapsed).
    #[error(
        "RANK={rank} of WORLD_SIZE={world_size} could not join the process group at MASTER_ADDR:MASTER_PORT={addr} within ddp_timeout={timeout_s}s: {message}. Check that all {world_size} ranks are started with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE and each its own RANK, and that rank 0 (which serves the store at that address) is running; raise ddp_timeout if ranks start far apart"
    )]
    Rendezvous {
        /// `MASTER_ADDR:MASTER_PORT`.
        addr: String,
        /// This rank.
        rank: i32,
        /// The world size.
        world_size: i32,
        /// The timeout that applied (`ddp_timeout`), in seconds.
        timeout_s: f64,
        /// libtorch's message.
        message: String,
    },
    /// A backend this build or this machine cannot provide (NCCL without the `cuda`
    /// feature or without a CUDA device, a name c10d does not have here).
    #[error("process group backend '{backend}' is unavailable: {detail}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: String,
        /// Why, and what to do.
        detail: String,
    },
    /// A collective failed (a peer died or the timeout elapsed).
    #[error("rank {rank}: {op} failed: {message}")]
    Collective {
        /// The collective.
        op: &'static str,
        /// This rank.
        rank: i32,
        /// libtorch's message.
        message: String,
    },
    /// A tensor cannot take part in a collective (layout, size).
    #[error("{op}: {detail}")]
    InvalidTensor {
        /// The collective.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// An error raised by libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
