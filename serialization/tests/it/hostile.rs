//! Hostile and broken input: pickles that try to import or call things, lie about lengths,
//! reach outside the memo or the stack, nest without end; zips that are cut short or lack
//! records; storages that are missing or too small. Each is refused with its own error.

use std::io::{Cursor, Write};

use tchtrain_serialization::{Error, Globals, LoadOptions, TorchFile, Value, loads, save_to_vec};

fn refuse(pickle: &[u8]) -> Error {
    match loads(pickle, &LoadOptions::default()) {
        Ok(v) => panic!("accepted {pickle:?} as {v:?}"),
        Err(e) => e,
    }
}

/// A zip checkpoint with `archive/<name>` records, as any zip tool would write it.
fn archive(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, data) in records {
        zip.start_file(format!("archive/{name}"), options).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn load_archive(bytes: Vec<u8>) -> Result<Value, Error> {
    TorchFile::from_bytes(bytes, "hostile.pt")?.load(&LoadOptions::default())
}

/// `_rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', numel), 0, (size,), (1,),
/// False, OrderedDict())`.
fn tensor_pickle(numel: u8, size: u8) -> Vec<u8> {
    let mut p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage".to_vec();
    p.extend(b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu");
    p.extend([
        b'K', numel, b't', b'Q', b'K', 0, b'K', size, 0x85, b'K', 1, 0x85, 0x89,
    ]);
    p.extend(b"ccollections\nOrderedDict\n)RtR.");
    p
}

#[test]
fn globals_outside_the_allow_list_are_never_resolved() {
    let cases: [(&[u8], &str); 5] = [
        (
            b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.",
            "os.system",
        ),
        (
            b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R.",
            "builtins.eval",
        ),
        (
            b"\x80\x02c__builtin__\n__import__\nX\x02\x00\x00\x00os\x85R.",
            "builtins.__import__",
        ),
        (
            b"\x80\x04\x8c\x08builtins\x8c\x0a__import__\x93.",
            "builtins.__import__",
        ),
        (b"\x80\x02cposix\nsystem\n.", "posix.system"),
    ];
    for (pickle, name) in cases {
        match refuse(pickle) {
            Error::UnsupportedGlobal {
                module,
                name: n,
                offset,
                ..
            } => {
                assert_eq!(format!("{module}.{n}"), name);
                assert!(
                    matches!(pickle[offset], b'c' | 0x93),
                    "refused at the GLOBAL, before any call"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    // Calling something that is not a global at all.
    assert!(matches!(
        refuse(b"\x80\x02X\x01\x00\x00\x00a)R."),
        Error::BadOperand {
            opcode: "REDUCE",
            ..
        }
    ));
    // An allowed storage class is not callable; an allowed dtype is no storage type.
    assert!(matches!(
        refuse(b"\x80\x02ctorch\nFloatStorage\n)R."),
        Error::BadArguments { .. }
    ));
    // Opcodes that build arbitrary instances or reach the extension registry.
    for (pickle, opcode) in [
        (&b"(ios\nsystem\n."[..], b'i'),
        (b"(o.", b'o'),
        (b"\x82\x01.", 0x82),
        (b"Pid\n.", b'P'),
        (b"\x80\x05\x97.", 0x97),
    ] {
        match refuse(pickle) {
            Error::UnsupportedOpcode { opcode: o, .. } => assert_eq!(o, opcode),
            other => panic!("{opcode:#x}: {other:?}"),
        }
    }
}

#[test]
fn lengths_memo_and_stack_are_bounded() {
    // Length fields larger than the input.
    for (pickle, opcode) in [
        (&b"\x80\x02X\xff\xff\xff\x7fab."[..], "BINUNICODE"),
        (b"\x80\x03B\xff\xff\xff\xff.", "BINBYTES"),
        (
            b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff.",
            "BINUNICODE8",
        ),
        (b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f.", "FRAME"),
        (b"\x80\x02\x8b\x00\x00\x00\x10.", "LONG4"),
    ] {
        match refuse(pickle) {
            Error::OversizedLength { opcode: o, .. } => assert_eq!(o, opcode),
            other => panic!("{opcode}: {other:?}"),
        }
    }
    assert!(matches!(
        refuse(b"\x80\x02X\x05\x00"),
        Error::Truncated { .. }
    ));
    assert!(
        matches!(refuse(b"\x80\x02N"), Error::Truncated { .. }),
        "no STOP"
    );
    assert!(matches!(refuse(b"\x80\x02cos\n"), Error::Truncated { .. }));
    // Memo indices that were never set.
    assert!(matches!(
        refuse(b"\x80\x02h\x05."),
        Error::MissingMemo { index: 5, .. }
    ));
    assert!(matches!(
        refuse(b"\x80\x02Nq\x00j\xff\xff\xff\xff."),
        Error::MissingMemo {
            index: 0xffff_ffff,
            ..
        }
    ));
    // Stack underflow.
    for (pickle, opcode) in [
        (&b"\x80\x02."[..], "STOP"),
        (b"\x80\x02a.", "APPEND"),
        (b"\x80\x02Nt.", "TUPLE"),
        (b"\x80\x02N\x87.", "TUPLE3"),
        (b"\x80\x02N1.", "POP_MARK"),
        (b"\x80\x02}Ns.", "SETITEM"),
        (b"\x80\x02R.", "REDUCE"),
    ] {
        match refuse(pickle) {
            Error::StackUnderflow { opcode: o, .. } => assert_eq!(o, opcode),
            other => panic!("{opcode}: {other:?}"),
        }
    }
    // Wrong operands.
    assert!(matches!(
        refuse(b"\x80\x02}Na."),
        Error::BadOperand {
            opcode: "APPEND",
            ..
        }
    ));
    assert!(
        matches!(
            refuse(b"\x80\x02}(NNNNu."),
            Error::BadOperand {
                opcode: "SETITEMS",
                ..
            }
        ),
        "duplicate key"
    );
    assert!(
        matches!(
            refuse(b"\x80\x02}]Ns."),
            Error::BadOperand {
                opcode: "SETITEM",
                ..
            }
        ),
        "unhashable key"
    );
    assert!(matches!(
        refuse(b"\x80\x02X\x02\x00\x00\x00\xff\xfe."),
        Error::BadOperand {
            opcode: "BINUNICODE",
            ..
        }
    ));
    assert!(matches!(
        refuse(b"\x80\x09N."),
        Error::BadOperand {
            opcode: "PROTO",
            ..
        }
    ));
}

#[test]
fn nesting_and_expansion_are_bounded() {
    // 100k nested lists.
    let mut deep = b"\x80\x02".to_vec();
    deep.extend(std::iter::repeat_n(b']', 100_000));
    deep.extend(std::iter::repeat_n(b'a', 99_999));
    deep.push(b'.');
    assert!(matches!(refuse(&deep), Error::TooDeep { limit: 256, .. }));
    // 100k MARKs.
    let mut marks = b"\x80\x02".to_vec();
    marks.extend(std::iter::repeat_n(b'(', 100_000));
    marks.push(b'.');
    assert!(matches!(refuse(&marks), Error::StackUnderflow { .. }));
    // A list that contains itself.
    assert!(matches!(
        refuse(b"\x80\x02]q\x00h\x00a."),
        Error::TooDeep { .. }
    ));
    // 40 levels of [x, x]: 2^40 values from 250 bytes.
    let mut bomb = b"\x80\x02]q\x00".to_vec();
    for i in 0..40u8 {
        bomb.extend([b'(', b'h', i, b'h', i, b'l', b'q', i + 1]);
    }
    bomb.push(b'.');
    assert!(matches!(refuse(&bomb), Error::TooLarge { .. }));
    // A lower depth limit is honoured.
    let options = LoadOptions {
        max_depth: 3,
        ..LoadOptions::default()
    };
    assert!(loads(b"\x80\x02]]]aa.", &options).is_ok());
    assert!(matches!(
        loads(b"\x80\x02]]]]aaa.", &options),
        Err(Error::TooDeep { limit: 3, .. })
    ));
}

#[test]
fn broken_zips_are_refused() {
    let good = save_to_vec(&Value::List(vec![Value::Int(1)])).unwrap();
    assert!(load_archive(good.clone()).is_ok());
    for cut in [0, 10, good.len() / 2, good.len() - 1] {
        let result = load_archive(good[..cut].to_vec());
        assert!(
            matches!(result, Err(Error::Zip { .. })),
            "cut at {cut}: {result:?}"
        );
    }
    assert!(matches!(
        load_archive(b"PK\x05\x06garbage".to_vec()),
        Err(Error::Zip { .. })
    ));
    assert!(matches!(
        load_archive(b"PYTORCH1 legacy".to_vec()),
        Err(Error::Zip { .. })
    ));
    // A corrupted record (CRC mismatch).
    let mut flipped = good.clone();
    let at = flipped.windows(4).position(|w| w == b"\x80\x02]q").unwrap() + 5;
    flipped[at] ^= 0x40;
    assert!(matches!(load_archive(flipped), Err(Error::Zip { .. })));

    let pkl = b"\x80\x02N.";
    assert!(matches!(
        load_archive(archive(&[("version", b"3\n")])),
        Err(Error::MissingRecord { record, .. }) if record == "archive/data.pkl"
    ));
    assert!(matches!(
        load_archive(archive(&[("data.pkl", pkl)])),
        Err(Error::MissingRecord { record, .. }) if record == "archive/version"
    ));
    assert!(matches!(
        load_archive(archive(&[("data.pkl", pkl), ("version", b"99\n")])),
        Err(Error::BadRecord { .. })
    ));
    assert!(matches!(
        load_archive(archive(&[
            ("data.pkl", pkl),
            ("version", b"3\n"),
            ("byteorder", b"middle")
        ])),
        Err(Error::BadRecord { .. })
    ));
    assert_eq!(
        load_archive(archive(&[("data.pkl", pkl), ("version", b"3\n")])).unwrap(),
        Value::None
    );
}

#[test]
fn storages_are_checked() {
    let version: (&str, &[u8]) = ("version", b"3\n");
    let four_floats = [0u8; 16];
    // The tensor's storage record is missing.
    let result = load_archive(archive(&[("data.pkl", &tensor_pickle(4, 4)), version]));
    assert!(
        matches!(result, Err(Error::MissingStorage { ref key, .. }) if key == "0"),
        "{result:?}"
    );
    // A view past the storage's end.
    let result = load_archive(archive(&[
        ("data.pkl", &tensor_pickle(4, 5)),
        version,
        ("data/0", &four_floats),
    ]));
    assert!(
        matches!(
            result,
            Err(Error::StorageOutOfBounds {
                needed: 5,
                available: 4,
                ..
            })
        ),
        "{result:?}"
    );
    // The record is smaller than the persistent id says.
    let result = load_archive(archive(&[
        ("data.pkl", &tensor_pickle(5, 4)),
        version,
        ("data/0", &four_floats),
    ]));
    assert!(
        matches!(result, Err(Error::BadStorage { .. })),
        "{result:?}"
    );
    // And the well-formed one loads.
    let ok = load_archive(archive(&[
        ("data.pkl", &tensor_pickle(4, 4)),
        version,
        ("data/0", &four_floats),
    ]))
    .unwrap();
    assert_eq!(ok.as_tensor().map(|t| t.size.clone()), Some(vec![4]));
    // A bare pickle has no storages.
    assert!(matches!(
        refuse(&tensor_pickle(4, 4)),
        Error::MissingStorage { .. }
    ));
    // Unknown storage types and dtypes, even when allow-listed.
    let mut odd = tensor_pickle(4, 4);
    let at = odd.windows(12).position(|w| w == b"FloatStorage").unwrap();
    odd.splice(at..at + 12, b"FooStorage".iter().copied());
    let options = LoadOptions {
        globals: Globals::trainer_checkpoint().with("torch.FooStorage"),
        ..LoadOptions::default()
    };
    let result = TorchFile::from_bytes(
        archive(&[("data.pkl", &odd), version, ("data/0", &four_floats)]),
        "odd.pt",
    )
    .unwrap()
    .load(&options);
    assert!(
        matches!(result, Err(Error::UnknownDType { ref name, .. }) if name == "torch.FooStorage"),
        "{result:?}"
    );
    // Bad arguments to allow-listed functions.
    assert!(matches!(
        refuse(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00rot13\x86R."),
        Error::BadArguments { .. }
    ));
    assert!(matches!(
        refuse(b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nN\x85R."),
        Error::BadArguments { .. }
    ));
    // Persistent ids that are not storages.
    assert!(matches!(
        refuse(b"\x80\x02X\x03\x00\x00\x00abc\x85Q."),
        Error::BadOperand {
            opcode: "BINPERSID",
            ..
        }
    ));
}
