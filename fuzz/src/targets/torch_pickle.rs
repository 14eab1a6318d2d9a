//! torch checkpoints (`optimizer.pt`, `rng_state.pth`, ...): any bytes, read as a zip
//! checkpoint (`TorchFile`) and as a bare pickle stream (`loads`) by the restricted unpickler.
//! Nothing panics, and whatever reads is written and reads back equal. (Keep the seeds under
//! 16 KiB: a value's expansion budget grows with its input, and a rewrite may be shorter.)

use tchtrain_serialization::{Error, LoadOptions, TorchFile, dumps, loads, save_to_vec};

/// One input.
pub fn run(data: &[u8]) {
    let options = LoadOptions::default();
    if let Ok(value) = loads(data, &options) {
        let written = dumps(&value).unwrap_or_else(|e| panic!("read but not writable: {e}"));
        match loads(&written, &options) {
            Ok(again) => assert_eq!(again, value, "dumps output reads back different"),
            Err(e) => panic!("dumps output does not read again: {e}"),
        }
    }
    let Ok(mut file) = TorchFile::from_bytes(data.to_vec(), "fuzz.pt") else {
        return;
    };
    let Ok(value) = file.load(&options) else {
        return;
    };
    match save_to_vec(&value) {
        Ok(written) => {
            let again =
                TorchFile::from_bytes(written, "again.pt").and_then(|mut f| f.load(&options));
            match again {
                Ok(again) => assert_eq!(again, value, "save output reads back different"),
                Err(e) => panic!("save output does not read again: {e}"),
            }
        }
        // What torch.save refuses too: one storage viewed as two dtypes, a storage that is
        // not a whole number of elements.
        Err(Error::Unwritable { .. }) => {}
        Err(e) => panic!("read but not writable: {e}"),
    }
}
