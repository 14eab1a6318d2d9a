//! The record log W&B (`run-<id>.wandb`) and SwanLab (`run-<id>.swanlab`) write a run into:
//! LevelDB's log format (32 KiB blocks; each record split into fragments — full, or first /
//! middle / last — that never cross a block, behind a 7-byte header: CRC-32 of the type byte
//! and the data, length, type; a block's tail too short for a header padded with zeros),
//! after a 7-byte file header naming the writer (`:W&B` / `:SWL`, a magic, a version).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const CRC32_TABLE: [u32; 256] = crate::checksum_time::crc_table(0xedb8_8320);

/// CRC-32 (zlib's), what the log checks each fragment with.
pub fn crc32(parts: &[&[u8]]) -> u32 {
    crate::checksum_time::crc(&CRC32_TABLE, parts)
}

/// The log's block size.
const BLOCK: usize = 32 * 1024;
/// A fragment's header: CRC-32 (of the type byte and the data), length, type.
const FRAGMENT_HEADER: usize = 7;

/// A record log being written.
pub(crate) struct LevelDbLog {
    file: File,
    path: PathBuf,
    /// Bytes written so far (the file header included).
    offset: usize,
}

impl LevelDbLog {
    /// A new file (an existing one is an error: a run's log is never overwritten) starting
    /// with `header`.
    pub(crate) fn create(path: &Path, header: &[u8; 7]) -> Result<Self> {
        let io = |e| Error::Io {
            action: "writing",
            path: path.to_path_buf(),
            source: e,
        };
        let mut file = File::create_new(path).map_err(io)?;
        file.write_all(header).map_err(io)?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            offset: header.len(),
        })
    }

    /// One record, split into fragments that do not cross a block, a block's tail too short
    /// for a fragment header padded with zeros.
    pub(crate) fn append(&mut self, record: &[u8]) -> Result<()> {
        let mut out = Vec::with_capacity(record.len() + 2 * FRAGMENT_HEADER);
        let mut rest = record;
        let mut first = true;
        loop {
            let left = BLOCK - self.offset % BLOCK;
            if left < FRAGMENT_HEADER {
                out.extend(std::iter::repeat_n(0u8, left));
                self.offset += left;
                continue;
            }
            let room = left - FRAGMENT_HEADER;
            let take = rest.len().min(room);
            let last = take == rest.len();
            let kind: u8 = match (first, last) {
                (true, true) => 1,
                (true, false) => 2,
                (false, false) => 3,
                (false, true) => 4,
            };
            let (chunk, tail) = rest.split_at(take);
            out.extend_from_slice(&crc32(&[&[kind], chunk]).to_le_bytes());
            out.extend_from_slice(&(take as u16).to_le_bytes());
            out.push(kind);
            out.extend_from_slice(chunk);
            self.offset += FRAGMENT_HEADER + take;
            rest = tail;
            first = false;
            if last {
                break;
            }
        }
        self.file
            .write_all(&out)
            .and_then(|()| self.file.flush())
            .map_err(|e| Error::Io {
                action: "writing",
                path: self.path.clone(),
                source: e,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(&[b"123456789"]), 0xcbf4_3926);
        assert_eq!(crc32(&[b"1234", b"56789"]), 0xcbf4_3926);
    }

    #[test]
    fn records_longer_than_a_block_are_fragmented() {
        let dir = std::env::temp_dir().join(format!("tchtrain-leveldb-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.wandb");
        let mut log = LevelDbLog::create(&path, b":W&B\xe1\xbe\x00").unwrap();
        log.append(&vec![7u8; 40_000]).unwrap();
        log.append(&[9u8; 10]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        // first fragment fills block 0, the last one starts block 1.
        assert_eq!(bytes[7 + 6], 2);
        assert_eq!(bytes[BLOCK + 6], 4);
        let first = BLOCK - 7 - 7;
        let last = u16::from_le_bytes([bytes[BLOCK + 4], bytes[BLOCK + 5]]) as usize;
        assert_eq!(first + last, 40_000);
        // A run's log is never overwritten.
        assert!(LevelDbLog::create(&path, b":W&B\xe1\xbe\x00").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
