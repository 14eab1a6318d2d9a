//! `load_tokenizer` on a `tokenizer.json`; a tokenizer that loads must also encode and
//! decode a short text.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tchtrain_models::load_tokenizer;

fuzz_target!(|data: &[u8]| {
    let path = tchtrain_fuzz::scratch_file("tokenizer.json", data);
    let Ok(tokenizer) = load_tokenizer(&path) else {
        return;
    };
    if let Ok(encoding) = tokenizer.encode("Hello, world! A b c.", true) {
        let _ = tokenizer.decode(encoding.get_ids(), true);
    }
});
