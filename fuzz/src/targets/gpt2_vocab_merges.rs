//! `AutoTokenizer::from_pretrained` on GPT-2's `vocab.json` + `merges.txt`: the input is
//! `vocab.json`, a NUL byte, then `merges.txt`; a tokenizer that loads must also encode and
//! decode a short text.

use tchtrain_models::AutoTokenizer;

/// One input.
pub fn run(data: &[u8]) {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let vocab = crate::scratch_file("vocab.json", &data[..split]);
    let merges = crate::scratch_file("merges.txt", data.get(split + 1..).unwrap_or(&[]));
    let (Some(dir), Some(_)) = (vocab.parent(), merges.parent()) else {
        return;
    };
    let Ok(tok) = AutoTokenizer::from_pretrained(dir) else {
        return;
    };
    let tokenizer = tok.tokenizer();
    if let Ok(encoding) = tokenizer.encode("Hello, world! A b c.", true) {
        let _ = tokenizer.decode(encoding.get_ids(), true);
    }
}
