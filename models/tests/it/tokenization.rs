//! Token ids of our tokenizers equal upstream's on a hamlet.txt paragraph
//! (`scripts/reference/models.py` → tokenizers.json): GPT-2 from vocab.json + merges.txt,
//! MiniLM and SmolLM2 from tokenizer.json. Exact equality, special tokens included.

use std::path::Path;
use tchtrain_testing::{assets, lock, temp_dir};

use anyhow::{Context, Result};
use tchtrain_models::AutoTokenizer;

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
    let tok = AutoTokenizer::from_pretrained(assets().join("gpt2-tokenizer"))?;
    let tok = tok.tokenizer();
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
        let tok = AutoTokenizer::from_pretrained(assets().join(dir))?;
        let tok = tok.tokenizer();
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
    let err = AutoTokenizer::from_pretrained(Path::new("/nonexistent/model")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model"), "{err}");
    let empty = temp_dir("no-tokenizer");
    let err = AutoTokenizer::from_pretrained(empty.path()).unwrap_err();
    assert!(
        err.to_string().contains("tokenizer.json") && err.to_string().contains("vocab.json"),
        "{err}"
    );
}

/// `save_pretrained` writes what `from_pretrained` reads back: the same ids and the same
/// facts, for a tokenizer.json tokenizer and for GPT-2's vocab.json + merges.txt.
#[test]
fn save_pretrained_round_trips() -> Result<()> {
    let _g = lock();
    let (text, _) = expected("minilm")?;
    for dir in ["minilm", "smollm2-135m", "gpt2-tokenizer"] {
        let tok = AutoTokenizer::from_pretrained(assets().join(dir))?;
        let out = temp_dir(&format!("saved-{dir}"));
        tok.save_pretrained(out.path())?;
        let again = AutoTokenizer::from_pretrained(out.path())?;
        assert_eq!(again.info(), tok.info(), "{dir}");
        let ids = |t: &AutoTokenizerOutput| -> Result<Vec<u32>> {
            Ok(t.tokenizer()
                .encode(text.as_str(), true)
                .map_err(anyhow::Error::msg)?
                .get_ids()
                .to_vec())
        };
        assert_eq!(ids(&again)?, ids(&tok)?, "{dir}");
    }
    // GPT-2 from its vocabulary: upstream's special tokens.
    let gpt2 = AutoTokenizer::from_pretrained(assets().join("gpt2-tokenizer"))?;
    assert_eq!(
        gpt2.info()
            .all_special_ids
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        [50256]
    );
    // MiniLM's facts from its tokenizer_config.json.
    let minilm = AutoTokenizer::from_pretrained(assets().join("minilm"))?;
    assert_eq!(minilm.info().pad_token_id, Some(0));
    assert_eq!(minilm.info().mask_token_id, Some(103));
    Ok(())
}

type AutoTokenizerOutput = tchtrain_models::PreTrainedTokenizerFast;
