//! What the loggers' file formats share: table-driven CRC-32 variants (TFRecord's CRC-32C,
//! W&B's zlib CRC-32), UTC calendar times for run-folder names, and the random words of run
//! and log ids.

/// The byte table of a reflected CRC-32 with polynomial `poly`.
pub(crate) const fn crc_table(poly: u32) -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ poly
            } else {
                crc >> 1
            };
            k += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// The CRC of `parts` (one message in pieces) under `table`.
pub(crate) fn crc(table: &[u32; 256], parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for part in parts {
        for &b in *part {
            crc = table[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
        }
    }
    !crc
}

/// UTC `(year, month, day, hour, minute, second)` of `secs` since the epoch (Howard
/// Hinnant's civil-from-days).
pub(crate) fn utc_parts(secs: i64) -> (i64, i64, i64, i64, i64, i64) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// `n` characters drawn from `alphabet` (run ids, temporary file names): not for secrets.
pub(crate) fn random_chars(alphabet: &[u8], n: usize) -> String {
    let mut next = random_stream();
    (0..n)
        .map(|_| alphabet[(next() % alphabet.len() as u64) as usize] as char)
        .collect()
}

/// A stream of random 64-bit words for run and log ids (splitmix64 over the time, the process
/// id and a per-process counter, so two streams of one process differ): not for secrets.
pub(crate) fn random_stream() -> impl FnMut() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut state = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0xd6e8_feb8_6659_fd93);
    move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
