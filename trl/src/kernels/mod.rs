//! `trl/kernels/`: the kernels TRL's trainers call.

pub mod chunked_logprob;

pub use chunked_logprob::{
    CHUNKED_LOGPROB_CHUNK_SIZE, ChunkedLogProbs, LogProbOutputs, chunked_logprob,
};
