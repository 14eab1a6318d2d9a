//! Writing: files Rust writes load in Python with `torch.load(weights_only=True)` and give the
//! values written; torch re-saving them gives the same bytes; the reference files rewritten
//! come out as torch wrote them; and reading what was written gives the value back.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use tchtrain_serialization::{
    DType, LoadOptions, Object, ObjectKind, Storage, Tensor, Value, dumps, load, loads, save,
    save_to_vec,
};
use tchtrain_testing::TempDir;

use crate::common::{REFERENCE_FILES, assert_matches, description, python_describe, reference};

fn s(text: &str) -> Value {
    Value::Str(text.into())
}

fn f32_tensor(shape: &[i64], values: &[f32]) -> Tensor {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::from_bytes(DType::Float32, shape, bytes).expect("sizes match")
}

/// A checkpoint as a Rust trainer would write one: AdamW-like state with 0-dim steps, several
/// dtypes (legacy storages and `_rebuild_tensor_v3` ones), views sharing a storage, a
/// parameter, and the Python values state dicts hold.
fn rust_built() -> Value {
    let weight = f32_tensor(&[2, 3], &[0.5, -1.0, 2.0, 3.5, -0.25, 8.0]);
    let transposed = Tensor {
        size: vec![3, 2],
        stride: vec![1, 3],
        ..weight.clone()
    };
    let row = Tensor {
        storage_offset: 3,
        size: vec![3],
        stride: vec![1],
        ..weight.clone()
    };
    let step = Tensor::from_bytes(DType::Float32, &[], 2f32.to_le_bytes().to_vec()).unwrap();
    let bf16 = Tensor::from_bytes(DType::BFloat16, &[2], vec![0x80, 0x3f, 0x00, 0xc0]).unwrap();
    let half = Tensor::from_bytes(DType::Float16, &[1], vec![0x00, 0x3c]).unwrap();
    let long = Tensor::from_bytes(
        DType::Int64,
        &[2],
        [7i64, -9].iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
    .unwrap();
    let u16s = Tensor::from_bytes(DType::UInt16, &[3], vec![1, 0, 2, 0, 0xff, 0xff]).unwrap();
    let fp8 = Tensor::from_bytes(DType::Float8E4M3Fn, &[2], vec![0x38, 0xb8]).unwrap();
    let flags = Tensor::from_bytes(DType::Bool, &[2, 1], vec![1, 0]).unwrap();
    let mut param = f32_tensor(&[2], &[1.0, 2.0]);
    param.parameter = true;
    param.requires_grad = true;
    let storage = Arc::new(Storage {
        bytes: vec![0; 16],
        device: "cpu".into(),
    });
    let zeros = Tensor {
        dtype: DType::Float32,
        storage,
        storage_offset: 0,
        size: vec![4],
        stride: vec![1],
        requires_grad: false,
        parameter: false,
    };
    let slot = |t: &Tensor| {
        Value::Dict(vec![
            (s("step"), Value::Tensor(step.clone())),
            (s("exp_avg"), Value::Tensor(t.clone())),
            (s("exp_avg_sq"), Value::Tensor(zeros.clone())),
        ])
    };
    Value::Dict(vec![
        (
            s("state"),
            Value::Dict(vec![
                (Value::Int(0), slot(&weight)),
                (Value::Int(1), slot(&row)),
            ]),
        ),
        (
            s("param_groups"),
            Value::List(vec![Value::Dict(vec![
                (s("lr"), Value::Float(1e-3)),
                (
                    s("betas"),
                    Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)]),
                ),
                (s("eps"), Value::Float(1e-8)),
                (s("weight_decay"), Value::Float(0.01)),
                (s("amsgrad"), Value::Bool(false)),
                (s("foreach"), Value::None),
                (s("params"), Value::List(vec![Value::Int(0), Value::Int(1)])),
            ])]),
        ),
        (
            s("tensors"),
            Value::List(
                [
                    transposed,
                    bf16,
                    half,
                    long,
                    u16s,
                    fp8,
                    flags,
                    param,
                    weight.clone(),
                ]
                .into_iter()
                .map(Value::Tensor)
                .collect(),
            ),
        ),
        (
            s("python"),
            Value::Tuple(vec![
                Value::Int(-1),
                Value::Int(70000),
                Value::Int(1 << 40),
                Value::Int(i64::MIN),
                Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 0x40]),
                Value::Float(f64::NAN),
                Value::Float(-0.0),
                Value::Float(f64::INFINITY),
                Value::Bytes(vec![0, 1, 0xfe, 0xff]),
                s("ünïcödé ✓"),
                Value::Tuple(vec![]),
                Value::List((0..1500).map(Value::Int).collect()),
            ]),
        ),
        (
            s("ordered"),
            Value::OrderedDict(vec![(s("b"), Value::Int(1)), (s("a"), Value::None)]),
        ),
        (
            s("device"),
            Value::Object(Object {
                module: "torch".into(),
                name: "device".into(),
                kind: ObjectKind::Reduce,
                args: vec![s("cpu")],
                state: None,
            }),
        ),
        (
            s("dtype"),
            Value::Global {
                module: "torch".into(),
                name: "bfloat16".into(),
            },
        ),
    ])
}

/// Rewriting each file torch wrote gives torch's bytes: the same pickle opcodes and memo
/// puts, the same zip layout, the same serialization id.
#[test]
fn rewriting_torch_files_is_byte_identical() -> Result<()> {
    let dir = TempDir::new("serialization-rewrite");
    for file in REFERENCE_FILES {
        let path = reference(file);
        let value = load(&path)?;
        let name = path.file_name().context("name")?;
        let ours = dir.join(name);
        save(&ours, &value)?;
        let (a, b) = (std::fs::read(&path)?, std::fs::read(&ours)?);
        ensure!(
            a == b,
            "{file}: rewritten bytes differ (first at {:?}, {} vs {} bytes)",
            a.iter().zip(&b).position(|(x, y)| x != y),
            a.len(),
            b.len()
        );
    }
    Ok(())
}

/// Python's `torch.load(weights_only=True)` reads what Rust writes (the Rust-built checkpoint
/// and every reference value rewritten) to the values written, and `torch.save` of what it
/// read reproduces the file byte for byte.
#[test]
fn python_reads_what_rust_writes() -> Result<()> {
    let dir = TempDir::new("serialization-python");
    let resaved = dir.join("resaved");
    std::fs::create_dir(&resaved)?;
    let mut written = vec![(dir.join("rust_built.pt"), rust_built())];
    for file in REFERENCE_FILES {
        let path = reference(file);
        let name = format!("re_{}", path.file_name().context("name")?.to_string_lossy());
        written.push((dir.join(name), load(&path)?));
    }
    for (path, value) in &written {
        save(path, value)?;
    }
    let paths: Vec<_> = written.iter().map(|(p, _)| p.clone()).collect();
    python_describe(&paths, Some(&resaved))?;
    for (path, value) in &written {
        let what = path.display().to_string();
        assert_matches(value, &description(path)?["value"], &what)?;
    }
    // A fixed point of torch: what it reads from our file, it writes back to the same bytes.
    // (Only for the Rust-built file: torch's own files are not all fixed points, e.g.
    // rng_state.pth, whose dict key "cpu" shared the interned location string when first
    // written but is a separate string once loaded. The rewrite test covers those files.)
    let ours = &written[0].0;
    let again = std::fs::read(resaved.join(ours.file_name().context("name")?))?;
    ensure!(
        std::fs::read(ours)? == again,
        "torch.save of rust_built.pt differs"
    );
    Ok(())
}

/// `load(save(x)) == x` and `loads(dumps(x)) == x`.
#[test]
fn round_trips() -> Result<()> {
    let dir = TempDir::new("serialization-round-trip");
    let mut values = vec![rust_built()];
    for file in REFERENCE_FILES {
        values.push(load(reference(file))?);
    }
    for (i, value) in values.iter().enumerate() {
        let path = dir.join(format!("value{i}.pt"));
        save(&path, value)?;
        assert_eq!(&load(&path)?, value, "value {i} through a file");
        let bytes = save_to_vec(value)?;
        let mut file = tchtrain_serialization::TorchFile::from_bytes(bytes, "in memory")?;
        assert_eq!(file.archive_name(), "archive");
        assert_eq!(
            &file.load(&LoadOptions::default())?,
            value,
            "value {i} in memory"
        );
    }
    let scheduler = load(reference("trainer/scheduler.pt"))?;
    assert_eq!(
        loads(&dumps(&scheduler)?, &LoadOptions::default())?,
        scheduler
    );
    assert!(
        dumps(&rust_built()).is_err(),
        "a bare pickle cannot hold tensors"
    );
    Ok(())
}

/// What `save` refuses instead of writing a file torch would not load.
#[test]
fn unwritable_values_are_refused() {
    let t = f32_tensor(&[2], &[1.0, 2.0]);
    let as_int = Tensor {
        dtype: DType::Int32,
        ..t.clone()
    };
    let mixed = Value::List(vec![Value::Tensor(t.clone()), Value::Tensor(as_int)]);
    assert!(
        save_to_vec(&mixed).is_err(),
        "one storage viewed as two dtypes"
    );
    let past_end = Tensor { size: vec![3], ..t };
    assert!(save_to_vec(&Value::Tensor(past_end)).is_err());
    assert!(Tensor::from_bytes(DType::Float32, &[3], vec![0; 8]).is_err());
    let mut deep = Value::None;
    for _ in 0..2000 {
        deep = Value::List(vec![deep]);
    }
    assert!(save_to_vec(&deep).is_err());
    let dir = TempDir::new("serialization-names");
    assert!(
        save(dir.join(".pt"), &Value::None).is_err(),
        "torch: invalid file name"
    );
}
