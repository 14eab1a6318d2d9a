//! `AutoTokenizer::from_pretrained` on a folder with a `tokenizer.json`; a tokenizer that
//! loads must also encode and decode a short text.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tchtrain_models::AutoTokenizer;

fuzz_target!(|data: &[u8]| {
    let path = tchtrain_fuzz::scratch_file("tokenizer.json", data);
    let Some(dir) = path.parent() else {
        return;
    };
    let Ok(tok) = AutoTokenizer::from_pretrained(dir) else {
        return;
    };
    let tokenizer = tok.tokenizer();
    if let Ok(encoding) = tokenizer.encode("Hello, world! A b c.", true) {
        let _ = tokenizer.decode(encoding.get_ids(), true);
    }
});
