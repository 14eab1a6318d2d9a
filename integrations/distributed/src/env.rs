//! torchrun's environment contract: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (upstream's `env://` init method).

use crate::{Error, Result};

/// The rendezvous facts a launcher hands each rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedEnv {
    /// Global rank, `0..world_size`.
    pub rank: i32,
    /// Number of processes.
    pub world_size: i32,
    /// Rank on this node.
    pub local_rank: i32,
    /// Processes on this node.
    pub local_world_size: i32,
    /// Address of rank 0's TCPStore.
    pub master_addr: String,
    /// Port of rank 0's TCPStore.
    pub master_port: u16,
}

fn read<T: std::str::FromStr>(name: &'static str, default: Option<T>) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map_err(|_| Error::Env {
            name,
            value: v,
            fix: "expected a non-negative integer",
        }),
        Err(_) => default.ok_or(Error::Env {
            name,
            value: "<unset>".into(),
            fix: "launch with `cargo xtask launch` or torchrun, or set it",
        }),
    }
}

impl DistributedEnv {
    /// Reads the environment; `None` when `WORLD_SIZE` is unset or 1 (a single process).
    pub fn from_env() -> Result<Option<Self>> {
        let world_size: i32 = read("WORLD_SIZE", Some(1))?;
        if world_size <= 1 {
            return Ok(None);
        }
        let rank: i32 = read("RANK", None)?;
        if rank < 0 || rank >= world_size {
            return Err(Error::Env {
                name: "RANK",
                value: rank.to_string(),
                fix: "RANK must be in 0..WORLD_SIZE",
            });
        }
        let local_rank = read("LOCAL_RANK", Some(rank))?;
        let env = Self {
            rank,
            world_size,
            local_rank,
            local_world_size: read("LOCAL_WORLD_SIZE", Some(world_size))?,
            master_addr: std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into()),
            master_port: read("MASTER_PORT", Some(29500))?,
        };
        Ok(Some(env))
    }

    /// The environment variables a launcher sets for `rank` of `world_size` on one node.
    pub fn vars_for(
        rank: i32,
        world_size: i32,
        master_addr: &str,
        master_port: u16,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("WORLD_SIZE", world_size.to_string()),
            ("LOCAL_WORLD_SIZE", world_size.to_string()),
            ("MASTER_ADDR", master_addr.to_string()),
            ("MASTER_PORT", master_port.to_string()),
        ]
    }
}
