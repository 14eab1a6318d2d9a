//! Order-keeping parallel map over scoped threads, for the data preparation that touches
//! every row (tokenisation): `datasets`' `map(num_proc=...)` without processes.

use crate::error::Error;

/// Rows per thread below which a thread does not pay for itself.
const MIN_ROWS_PER_THREAD: usize = 256;

/// `items.iter().enumerate().map(f).collect()`, split into contiguous chunks over the
/// machine's cores (`std::thread::available_parallelism`, or `TCHTRAIN_NUM_PROC`). The
/// output keeps the input order; the error returned is the one of the first failing item,
/// as the sequential map would return. A thread that panics is [`Error::Tokenizer`]
/// (tokenisation is what runs here) converted into `E`.
pub fn parallel_map<T, R, E, F>(items: &[T], f: F) -> Result<Vec<R>, E>
where
    T: Sync,
    R: Send,
    E: Send + From<Error>,
    F: Fn(usize, &T) -> Result<R, E> + Sync,
{
    let cores = std::env::var("TCHTRAIN_NUM_PROC")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads = cores.min(items.len() / MIN_ROWS_PER_THREAD).max(1);
    if threads == 1 {
        return items.iter().enumerate().map(|(i, x)| f(i, x)).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .enumerate()
            .map(|(c, part)| {
                s.spawn(move || {
                    part.iter()
                        .enumerate()
                        .map(|(j, x)| f(c * chunk + j, x))
                        .collect::<Result<Vec<R>, E>>()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(items.len());
        for h in handles {
            let part = h.join().map_err(|_| {
                E::from(Error::Tokenizer {
                    what: "a data preparation thread".into(),
                    detail: "it panicked; rerun with TCHTRAIN_NUM_PROC=1 to see where".into(),
                })
            })??;
            out.extend(part);
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_returns_the_first_error() {
        let items: Vec<usize> = (0..5000).collect();
        let out = parallel_map(&items, |i, x| Ok::<_, Error>(i * 1000 + x)).unwrap();
        assert_eq!(out, items.iter().map(|x| x * 1001).collect::<Vec<_>>());
        let err = parallel_map(&items, |i, _| {
            if i == 3100 || i == 4000 {
                Err(Error::Tokenizer {
                    what: format!("row {i}"),
                    detail: String::new(),
                })
            } else {
                Ok(i)
            }
        })
        .unwrap_err();
        assert!(err.to_string().contains("row 3100"), "{err}");
    }
}
