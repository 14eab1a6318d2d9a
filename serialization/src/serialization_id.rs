//! The `.data/serialization_id` record torch writes last (caffe2 `inline_container.cc`,
//! `writeSerializationId`): 20 digits of a hash over the record names, then 20 digits of a
//! hash over the records' CRC-32s. The names are visited in the iteration order of the
//! writer's `std::unordered_set<std::string>`, so this file reproduces libstdc++'s
//! `std::hash<std::string>` (`_Hash_bytes`) and its hashtable's bucket layout to give the
//! same id torch gives.

/// `c10::hash_combine`.
pub(crate) fn hash_combine(seed: u64, value: u64) -> u64 {
    seed ^ value
        .wrapping_add(0x9e37_79b9)
        .wrapping_add(seed << 6)
        .wrapping_add(seed >> 2)
}

/// libstdc++'s `std::_Hash_bytes` (64-bit MurmurHash2 variant) with `std::hash<std::string>`'s
/// seed.
fn hash_bytes(bytes: &[u8]) -> u64 {
    const SEED: u64 = 0xc70f_6907;
    const MUL: u64 = (0xc6a4_a793u64 << 32) + 0x5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let len = bytes.len() as u64;
    let mut hash = SEED ^ len.wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut le = [0u8; 8];
        le.copy_from_slice(chunk);
        let data = shift_mix(u64::from_le_bytes(le).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let data = rest
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) + b as u64);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

/// libstdc++'s `__prime_list` (bucket counts), up to what a checkpoint with a few hundred
/// thousand records needs.
const PRIMES: [u64; 128] = [
    2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
    103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313,
    337, 359, 383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031, 1109,
    1193, 1289, 1381, 1493, 1613, 1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739,
    4027, 4349, 4703, 5087, 5503, 5953, 6427, 6949, 7517, 8123, 8783, 9497, 10273, 11113, 12011,
    12983, 14033, 15173, 16411, 17749, 19183, 20753, 22447, 24281, 26267, 28411, 30727, 33223,
    35933, 38873, 42043, 45481, 49201, 53201, 57557, 62233, 67307, 72817, 78779, 85229, 92203,
    99733, 107897, 116731, 126271, 136607, 147793, 159871, 172933, 187091,
];

/// `_Prime_rehash_policy::_M_next_bkt`: the bucket count for at least `n` buckets, and the
/// element count that triggers the next rehash (max load factor 1).
fn next_bucket_count(n: u64) -> (u64, u64) {
    const FAST: [u64; 14] = [2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13];
    if n < FAST.len() as u64 {
        if n == 0 {
            return (1, 0);
        }
        let b = FAST[n as usize];
        return (b, b);
    }
    // lower_bound over the primes from index 6; past the table, n itself (only checkpoints
    // with more records than any seen get an id that differs from torch's).
    let b = PRIMES[6..].iter().copied().find(|&p| p >= n).unwrap_or(n);
    (b, b)
}

/// The iteration order of a libstdc++ `std::unordered_set<std::string>` after inserting
/// `names` in order (unique keys, cached hash codes).
fn unordered_set_order(names: &[&str]) -> Vec<usize> {
    // A singly linked list through `next`; `before_begin` is the list head. `buckets[b]` is the
    // node *before* bucket b's first node: `Some(HEAD)` for the head.
    const HEAD: usize = usize::MAX;
    let hashes: Vec<u64> = names.iter().map(|n| hash_bytes(n.as_bytes())).collect();
    let mut next: Vec<Option<usize>> = vec![None; names.len()];
    let mut head: Option<usize> = None;
    let mut bucket_count: u64 = 1;
    let mut buckets: Vec<Option<usize>> = vec![None; 1];
    let mut next_resize: u64 = 0;
    for (node, &code) in hashes.iter().enumerate() {
        let n_elt = node as u64;
        // _M_need_rehash(bucket_count, n_elt, 1)
        if n_elt + 1 > next_resize {
            let min_buckets = (n_elt + 1).max(if next_resize == 0 { 11 } else { 0 });
            if min_buckets >= bucket_count {
                let (n, resize) = next_bucket_count((min_buckets + 1).max(bucket_count * 2));
                next_resize = resize;
                // _M_rehash_aux(n, true_type)
                let mut new_buckets: Vec<Option<usize>> = vec![None; n as usize];
                let mut p = head.take();
                let mut bbegin_bucket = 0usize;
                while let Some(cur) = p {
                    let after = next[cur];
                    let b = (hashes[cur] % n) as usize;
                    match new_buckets[b] {
                        None => {
                            next[cur] = head;
                            head = Some(cur);
                            new_buckets[b] = Some(HEAD);
                            if next[cur].is_some() {
                                new_buckets[bbegin_bucket] = Some(cur);
                            }
                            bbegin_bucket = b;
                        }
                        // The bucket of the list's first node: insert at the front.
                        Some(HEAD) => {
                            next[cur] = head;
                            head = Some(cur);
                        }
                        Some(before) => {
                            next[cur] = next[before];
                            next[before] = Some(cur);
                        }
                    }
                    p = after;
                }
                buckets = new_buckets;
                bucket_count = n;
            } else {
                next_resize = bucket_count;
            }
        }
        // _M_insert_bucket_begin(bkt, node)
        let b = (code % bucket_count) as usize;
        match buckets[b] {
            Some(HEAD) => {
                next[node] = head;
                head = Some(node);
            }
            Some(before) => {
                next[node] = next[before];
                next[before] = Some(node);
            }
            None => {
                next[node] = head;
                head = Some(node);
                if let Some(old_first) = next[node] {
                    buckets[(hashes[old_first] % bucket_count) as usize] = Some(node);
                }
                buckets[b] = Some(HEAD);
            }
        }
    }
    let mut order = Vec::with_capacity(names.len());
    let mut p = head;
    while let Some(cur) = p {
        order.push(cur);
        p = next[cur];
    }
    order
}

/// The id torch writes for records `names` (without the archive folder, in the order written)
/// whose data descriptors combined to `combined_crc`.
pub(crate) fn serialization_id(names: &[&str], combined_crc: u64) -> String {
    let combined_names = unordered_set_order(names)
        .into_iter()
        .fold(0u64, |seed, i| {
            hash_combine(seed, hash_bytes(names[i].as_bytes()))
        });
    format!("{combined_names:020}{combined_crc:020}")
}
