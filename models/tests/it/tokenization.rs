//! Token ids of our tokenizers equal upstream's on a hamlet.txt paragraph
//! (`scripts/reference/models.py` → tokenizers.json): GPT-2 from vocab.json + merges.txt,
//! MiniLM and SmolLM2 from tokenizer.json. Exact equality, special tokens included.

use std::path::Path;
use tchtrain_testing::{assets, lock};

use anyhow::{Context, Result};
use tchtrain_models::{gpt2_tokenizer, load_tokenizer};

fn expected(key: &str) -> Result<(String, Vec<u32>)> {
    let path = assets().join("reference/models/tokenizers.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run `cargo xtask setup`)", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let ids = v[key]
        .as_array()
        .context("ids")?
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    Ok((
        v["paragraph"].as_str().context("paragraph")?.to_string(),
        ids,
    ))
}

#[test]
fn gpt2_bpe_from_vocab_and_merges() -> Result<()> {
    let _g = lock();
    let (text, ids) = expected("gpt2")?;
    let dir = assets().join("gpt2-tokenizer");
    let tok = gpt2_tokenizer(&dir.join("vocab.json"), &dir.join("merges.txt"))?;
    let enc = tok
        .encode(text.as_str(), true)
        .map_err(anyhow::Error::msg)?;
    assert_eq!(enc.get_ids(), ids.as_slice());
    assert_eq!(tok.decode(&ids, false).map_err(anyhow::Error::msg)?, text);
    Ok(())
}

#[test]
fn minilm_and_smollm2_tokenizer_json() -> Result<()> {
    let _g = lock();
    for (key, dir) in [("minilm", "minilm"), ("smollm2", "smollm2-135m")] {
        let (text, ids) = expected(key)?;
        let tok = load_tokenizer(&assets().join(dir))?;
        let enc = tok
            .encode(text.as_str(), true)
            .map_err(anyhow::Error::msg)?;
        assert_eq!(enc.get_ids(), ids.as_slice(), "{key}");
    }
    Ok(())
}

#[test]
fn missing_tokenizer_files_are_typed_errors() {
    let _g = lock();
    let err = load_tokenizer(Path::new("/nonexistent/model")).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    let err =
        gpt2_tokenizer(Path::new("/nope/vocab.json"), Path::new("/nope/merges.txt")).unwrap_err();
    assert!(err.to_string().contains("vocab.json"), "{err}");
}
