//! Whole-word masking helpers of `DataCollatorForLanguageModeling`: word ids from
//! offsets (`_calc_word_ids_and_prob_mask`) and mask expansion (`_whole_word_mask`).

/// Word id of every token (`-1` for special tokens) and the tokens that must not be
/// drawn (every token but the first of each word), for rows of length `len`
/// flattened row-major. A token starts a new word when it is not special and either
/// its start differs from the previous token's end or the previous token is special.
pub(crate) fn whole_word_ids(
    offsets: &[Vec<(i64, i64)>],
    special: &[i64],
    len: usize,
) -> (Vec<i64>, Vec<bool>) {
    let mut word_ids = Vec::with_capacity(special.len());
    let mut no_mask = Vec::with_capacity(special.len());
    for (r, row) in offsets.iter().enumerate() {
        let mut word = 0i64;
        for i in 0..len {
            let k = r * len + i;
            let (start, _) = row.get(i).copied().unwrap_or((0, 0));
            let prev_end = if i == 0 {
                -1
            } else {
                row.get(i - 1).map_or(0, |o| o.1)
            };
            let prev_special = i > 0 && special[k - 1] == 1;
            let is_special = special[k] != 0;
            let new_word = !is_special && (start != prev_end || prev_special);
            word += i64::from(new_word);
            word_ids.push(if is_special { -1 } else { word });
            no_mask.push(!new_word);
        }
    }
    (word_ids, no_mask)
}

/// A token is masked when any token of its word (same row, same id, not -1) is.
pub(crate) fn whole_word_mask(word_ids: &[i64], mask: &[bool], len: usize) -> Vec<bool> {
    let mut out = vec![false; mask.len()];
    for (r, (ids, m)) in word_ids.chunks(len).zip(mask.chunks(len)).enumerate() {
        for i in 0..len {
            if ids[i] == -1 {
                continue;
            }
            out[r * len + i] = (0..len).any(|j| ids[j] == ids[i] && m[j]);
        }
    }
    out
}
