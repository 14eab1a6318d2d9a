//! Reading files torch wrote: the real `checkpoint-2/` of a transformers Trainer run and more
//! `torch.save` outputs (scripts/reference/torch_pickles.py), each compared exactly with what
//! Python's `torch.load` gives for it.

use anyhow::{Context, Result, ensure};
use tchtrain_serialization::{Error, Globals, LoadOptions, TorchFile, Value, load, load_with};

use crate::common::{REFERENCE_FILES, assert_matches, description, reference};

/// Every file parses to exactly the value (structure, scalars, tensor dtypes, views, bytes,
/// shared storages) Python loads from it.
#[test]
fn reference_files_read_as_python_reads_them() -> Result<()> {
    for file in REFERENCE_FILES {
        let path = reference(file);
        let value = load(&path).with_context(|| file.to_string())?;
        let expected = description(&path)?;
        assert_matches(&value, &expected["value"], file)?;
    }
    Ok(())
}

/// The globals each file names are on the default allow-list, and only those files that
/// torch itself loads with `weights_only=True` (no extra safe globals) load with
/// [`Globals::weights_only`]; the others are refused by name, as torch refuses them.
#[test]
fn weights_only_allow_list_matches_torch() -> Result<()> {
    let defaults = Globals::trainer_checkpoint();
    for file in REFERENCE_FILES {
        let expected = description(&reference(file))?;
        for name in expected["globals"].as_array().context("globals")? {
            let name = name.as_str().context("a name")?;
            let (module, attr) = name.rsplit_once('.').context("module.name")?;
            let module = if module == "__builtin__" {
                "builtins"
            } else {
                module
            };
            ensure!(
                defaults.allows(module, attr),
                "{file}: {name} is not allowed"
            );
        }
    }
    let options = LoadOptions::weights_only();
    for file in [
        "trainer/optimizer.pt",
        "trainer/scheduler.pt",
        "trainer/scaler.pt",
        "extra/adamw_fused.pt",
        "extra/adafactor.pt",
        "extra/values.pt",
    ] {
        load_with(reference(file), &options).with_context(|| file.to_string())?;
    }
    let refused = |file: &str| match load_with(reference(file), &options) {
        Err(Error::UnsupportedGlobal { module, name, .. }) => format!("{module}.{name}"),
        other => panic!("{file}: expected an unsupported global, got {other:?}"),
    };
    assert_eq!(
        refused("trainer/rng_state.pth"),
        "numpy._core.multiarray._reconstruct"
    );
    assert_eq!(
        refused("trainer/training_args.bin"),
        "transformers.training_args.TrainingArguments"
    );
    Ok(())
}

/// What each Trainer file holds, in the terms a resuming Rust trainer uses.
#[test]
fn trainer_checkpoint_contents() -> Result<()> {
    // optimizer.pt: AdamW (fused) state per parameter index, and the param groups.
    let optimizer = load(reference("trainer/optimizer.pt"))?;
    let state = optimizer
        .get("state")
        .and_then(Value::as_dict)
        .context("state")?;
    assert_eq!(
        state.len(),
        3,
        "three parameters: a.weight, a.bias, b.weight"
    );
    let (index, slots) = &state[0];
    assert_eq!(index, &Value::Int(0));
    let step = slots
        .get("step")
        .and_then(Value::as_tensor)
        .context("step")?;
    assert!(step.size.is_empty(), "step is a 0-dim tensor");
    assert_eq!(step.to_f64_vec()?, Some(vec![2.0]));
    let exp_avg = slots
        .get("exp_avg")
        .and_then(Value::as_tensor)
        .context("exp_avg")?;
    assert_eq!(exp_avg.size, [2, 3]);
    let groups = optimizer
        .get("param_groups")
        .and_then(Value::as_seq)
        .context("groups")?;
    assert_eq!(groups.len(), 2, "decay and no-decay groups");
    assert_eq!(groups[0].get("fused"), Some(&Value::Bool(true)));

    // scheduler.pt: LambdaLR without its lambdas (partials save an empty __dict__).
    let scheduler = load(reference("trainer/scheduler.pt"))?;
    assert_eq!(scheduler.get("last_epoch"), Some(&Value::Int(2)));
    assert_eq!(
        scheduler.get("lr_lambdas"),
        Some(&Value::List(vec![Value::Dict(vec![]), Value::Dict(vec![])]))
    );

    // rng_state.pth: python's random state, numpy's MT19937 array, torch's CPU generator.
    let rng = load(reference("trainer/rng_state.pth"))?;
    let python = rng
        .get("python")
        .and_then(Value::as_seq)
        .context("python")?;
    assert_eq!(python[0], Value::Int(3));
    assert_eq!(python[1].as_seq().map(<[Value]>::len), Some(625));
    let numpy = rng.get("numpy").and_then(Value::as_seq).context("numpy")?;
    assert_eq!(numpy[0], Value::Str("MT19937".into()));
    let Value::Object(array) = &numpy[1] else {
        panic!("numpy's state array is an object record: {:?}", numpy[1]);
    };
    assert_eq!(array.class(), "numpy._core.multiarray._reconstruct");
    let array_state = array
        .state
        .as_deref()
        .and_then(Value::as_seq)
        .context("array state")?;
    assert!(matches!(&array_state[4], Value::Bytes(b) if b.len() == 624 * 4));
    let cpu = rng.get("cpu").and_then(Value::as_tensor).context("cpu")?;
    assert_eq!(
        (cpu.dtype.name(), cpu.size.as_slice()),
        ("uint8", &[5056i64][..])
    );

    // scaler.pt: GradScaler's state, plain floats and ints.
    let scaler = load(reference("trainer/scaler.pt"))?;
    assert_eq!(scaler.get("scale"), Some(&Value::Float(1024.0)));
    assert_eq!(scaler.get("_growth_tracker"), Some(&Value::Int(2)));

    // training_args.bin: an inert TrainingArguments record with its enums.
    let args = load(reference("trainer/training_args.bin"))?;
    let Value::Object(args_object) = &args else {
        panic!("TrainingArguments is an object record");
    };
    assert_eq!(
        args_object.class(),
        "transformers.training_args.TrainingArguments"
    );
    assert_eq!(args.get("max_steps"), Some(&Value::Int(2)));
    let Some(Value::Object(scheduler_type)) = args.get("lr_scheduler_type") else {
        panic!("lr_scheduler_type is an enum record");
    };
    assert_eq!(scheduler_type.args, [Value::Str("cosine".into())]);
    Ok(())
}

/// The archive's records, as torch lays them out.
#[test]
fn torch_file_records() -> Result<()> {
    let mut file = TorchFile::open(reference("trainer/optimizer.pt"))?;
    assert_eq!(file.archive_name(), "optimizer");
    let names = file.record_names();
    assert_eq!(
        names[..4],
        [
            "data.pkl",
            ".format_version",
            ".storage_alignment",
            "byteorder"
        ]
    );
    assert_eq!(
        names[names.len() - 2..],
        ["version", ".data/serialization_id"]
    );
    assert_eq!(file.record("version")?.as_deref(), Some(&b"3\n"[..]));
    assert_eq!(file.record("nope")?, None);
    Ok(())
}

/// Pickles of other protocols, as `pickle.dumps` writes them: protocol 0's text opcodes
/// (`I`, `L`, `F`, `V`, `p`, `d`) and protocol 5's (`FRAME`, `MEMOIZE`, `STACK_GLOBAL`, sets,
/// `BYTEARRAY8`, short strings and bytes).
#[test]
fn other_protocols_read() -> Result<()> {
    use tchtrain_serialization::{LoadOptions, ObjectKind, loads};
    let s = |t: &str| Value::Str(t.into());
    // pickle.dumps([1, 'sé', 2.5, 2**70, -3, (1,), {'d': None}], protocol=0)
    let p0 = b"(lp0\x0aI1\x0aaVs\xe9\x0ap1\x0aaF2.5\x0aaL1180591620717411303424L\x0aaI-3\x0aa(I1\x0atp2\x0aa(dp3\x0aVd\x0ap4\x0aNsa.";
    assert_eq!(
        loads(p0, &LoadOptions::default())?,
        Value::List(vec![
            Value::Int(1),
            s("sé"),
            Value::Float(2.5),
            Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 0x40]),
            Value::Int(-3),
            Value::Tuple(vec![Value::Int(1)]),
            Value::Dict(vec![(s("d"), Value::None)]),
        ])
    );
    // pickle.dumps({'a': [1, 2.5, 'x', b'yz', {1, 2}, frozenset({3}), bytearray(b'q'),
    //   (1, 2, 3, 4), None, True, 2**70, -5], 'o': OrderedDict([('k', 1)])}, protocol=5)
    let p5 = b"\x80\x05\x95\x82\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01G@\x04\x00\x00\x00\x00\x00\x00\x8c\x01x\x94C\x02yz\x94\x8f\x94(K\x01K\x02\x90(K\x03\x91\x94\x96\x01\x00\x00\x00\x00\x00\x00\x00q\x94(K\x01K\x02K\x03K\x04t\x94N\x88\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@J\xfb\xff\xff\xffe\x8c\x01o\x94\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94\x8c\x01k\x94K\x01su.";
    let builtin = |name: &str, args: Vec<Value>| {
        Value::Object(tchtrain_serialization::Object {
            module: "builtins".into(),
            name: name.into(),
            kind: ObjectKind::Reduce,
            args,
            state: None,
        })
    };
    let ints = |v: &[i64]| Value::List(v.iter().map(|&i| Value::Int(i)).collect());
    assert_eq!(
        loads(p5, &LoadOptions::default())?,
        Value::Dict(vec![
            (
                s("a"),
                Value::List(vec![
                    Value::Int(1),
                    Value::Float(2.5),
                    s("x"),
                    Value::Bytes(b"yz".to_vec()),
                    builtin("set", vec![ints(&[1, 2])]),
                    builtin("frozenset", vec![ints(&[3])]),
                    builtin("bytearray", vec![Value::Bytes(b"q".to_vec())]),
                    Value::Tuple((1..=4).map(Value::Int).collect()),
                    Value::None,
                    Value::Bool(true),
                    Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 0x40]),
                    Value::Int(-5),
                ])
            ),
            (s("o"), Value::OrderedDict(vec![(s("k"), Value::Int(1))])),
        ])
    );
    Ok(())
}
