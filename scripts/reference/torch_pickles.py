"""Reference for serialization/tests/it/: torch zip checkpoints as torch 2.13 and transformers
5.23 write them, with the values they hold.

Usage: python torch_pickles.py OUT_DIR
       python torch_pickles.py --describe [--resave DIR] FILE...
The second form is what serialization/tests/it/writer.rs runs on files written by Rust: it
loads each FILE as the Trainer does (`torch.load(weights_only=True)` under transformers'
`safe_globals()`; `weights_only=False` for `*.bin`, as for training_args.bin), writes
FILE.json as below, and with --resave also `torch.save`s the value to DIR/<file name>.

trainer/   the real files of `checkpoint-2/` after a 2-step `transformers.Trainer` run
           (save_steps 2) on a tiny two-layer model (a plain nn.Module returning its loss),
           CPU, default optimizer (adamw_torch_fused), cosine schedule with 1 warmup step,
           and, as accelerate sets up for fp16 on a GPU, `accelerator.scaler =
           torch.amp.GradScaler("cpu", init_scale=1024, growth_interval=4)`:
           optimizer.pt, scheduler.pt, rng_state.pth, scaler.pt, training_args.bin.
extra/     torch.save of: AdamW state dicts after 2 steps (foreach=True; fused=True on the CPU),
           SGD with momentum, transformers' Adafactor, the LambdaLR of
           `get_cosine_schedule_with_warmup` after 3 steps, a GradScaler("cpu") after 3 steps
           with one overflow, a second TrainingArguments (debug, eval steps, hub strategy), and
           values.pt: every dtype, views sharing a storage, a parameter, and Python values
           (big ints, nan / -0.0, bytes, nested containers, batches over 1000 items);
           python_values.bin: b"" and a bytearray (b"" only loads with weights_only=False).

Beside each FILE, FILE.json holds what `torch.load(FILE, weights_only=False)` gives, as
pickle records it: null / true / ints (`{"bigint": "..."}` beyond i64), `{"float": repr}`,
strings, `{"bytes": hex}`, `{"tuple": [...]}`, lists, `{"dict": [[k, v], ...]}`,
`{"ordered_dict": [...]}`, `{"global": "module.name"}` (classes and torch dtypes),
`{"object": {"class", "kind": "reduce" | "newobj", "args", "state"}}` (from
`__reduce_ex__(2)`, what the pickler writes), and
`{"tensor": {"dtype", "shape", "stride", "storage_offset", "requires_grad", "parameter",
"device", "storage": n (the n-th distinct storage met), "bytes": hex of the row-major
elements, "values": [...] (real dtypes)}}`; plus "globals", every GLOBAL name in data.pkl.
"""

import collections
import copyreg
import json
import math
import os
import pickletools
import random
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

import transformers as tf

torch.set_num_threads(2)

REAL = {
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.uint16, torch.uint32, torch.uint64,
}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.b = nn.Linear(2, 1, bias=False)

    def forward(self, x, labels=None):
        y = self.b(torch.tanh(self.a(x))).squeeze(-1)
        return {"loss": ((y.float() - labels) ** 2).mean(), "logits": y}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 3, generator=g)
        self.y = torch.randn(n, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Json:
    """`to_json` over one file: numbers storages in the order they are met."""

    def __init__(self):
        self.storages = {}

    def tensor(self, t):
        data = t.detach()
        ptr = data.untyped_storage().data_ptr()
        storage = self.storages.setdefault(ptr, len(self.storages))
        dense = data.clone(memory_format=torch.contiguous_format)
        out = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "storage_offset": t.storage_offset(),
            "requires_grad": t.requires_grad,
            "parameter": isinstance(t, nn.Parameter),
            "device": str(t.device),
            "storage": storage,
            "bytes": bytes(dense.untyped_storage()).hex(),
        }
        if t.dtype in REAL:
            out["values"] = [self(v) for v in dense.flatten().tolist()]
        return out

    def __call__(self, x):
        # Exact types: transformers' enums subclass str and are pickled as objects.
        if x is None or type(x) is bool:
            return x
        if type(x) is int:
            return x if -(2**63) <= x < 2**63 else {"bigint": str(x)}
        if type(x) is float:
            return {"float": repr(x)}
        if type(x) is str:
            return x
        if type(x) is bytes:
            return {"bytes": x.hex()}
        if isinstance(x, torch.Tensor):
            return {"tensor": self.tensor(x)}
        if type(x) is tuple:
            return {"tuple": [self(v) for v in x]}
        if type(x) is list:
            return [self(v) for v in x]
        if type(x) is collections.OrderedDict:
            return {"ordered_dict": [[self(k), self(v)] for k, v in x.items()]}
        if type(x) is dict:
            return {"dict": [[self(k), self(v)] for k, v in x.items()]}
        if isinstance(x, torch.dtype):
            return {"global": str(x)}
        if isinstance(x, type):
            return {"global": f"{x.__module__}.{x.__qualname__}"}
        if type(x) is bytearray:
            # The C pickler writes (bytearray, (bytes(x),)) below protocol 5, not what
            # bytearray.__reduce_ex__(2) says.
            args = [self(bytes(x))]
            return {"object": {"class": "builtins.bytearray", "kind": "reduce", "args": args, "state": None}}
        rv = x.__reduce_ex__(2)
        func, args = rv[0], rv[1]
        state = rv[2] if len(rv) > 2 else None
        if func is copyreg.__newobj__:
            cls, args, kind = args[0], args[1:], "newobj"
        else:
            cls, kind = func, "reduce"
        return {
            "object": {
                "class": f"{cls.__module__}.{cls.__qualname__}",
                "kind": kind,
                "args": [self(a) for a in args],
                "state": None if state is None else self(state),
            }
        }


def globals_in(path):
    with zipfile.ZipFile(path) as z:
        pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        data = z.read(pkl)
    return sorted({arg.replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"})


def load_as_trainer(path):
    """torch.load as transformers' Trainer loads each checkpoint file."""
    if Path(path).suffix == ".bin":
        return torch.load(path, weights_only=False)
    with tf.trainer_pt_utils.safe_globals():
        return torch.load(path, weights_only=True)


def describe(path, value=None):
    value = load_as_trainer(path) if value is None else value
    doc = {"value": Json()(value), "globals": globals_in(path)}
    Path(f"{path}.json").write_text(json.dumps(doc, indent=1, allow_nan=False))
    return value


def trainer_checkpoint(folder):
    torch.manual_seed(0)
    run = folder.parent / ".trainer-run"
    cwd = os.getcwd()
    run.mkdir()
    os.chdir(run)  # output_dir (pickled in training_args.bin) stays a stable relative path
    try:
        args = tf.TrainingArguments(
            output_dir="out", max_steps=2, save_steps=2, save_strategy="steps",
            per_device_train_batch_size=2, learning_rate=1e-2, lr_scheduler_type="cosine",
            warmup_steps=1, weight_decay=0.01, seed=42, report_to="none", use_cpu=True,
            logging_steps=1, disable_tqdm=True,
        )
        trainer = tf.Trainer(model=Tiny(), args=args, train_dataset=Rows(8))
        trainer.accelerator.native_amp = True
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=4)
        trainer.train()
        folder.mkdir()
        for name in ["optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt", "training_args.bin"]:
            shutil.copy(Path("out/checkpoint-2") / name, folder / name)
    finally:
        os.chdir(cwd)
        shutil.rmtree(run, ignore_errors=True)


def two_steps(opt_cls, **kw):
    torch.manual_seed(0)
    model = Tiny()
    opt = opt_cls(model.parameters(), **kw)
    data = Rows(4)
    for step in range(2):
        loss = model(data.x[2 * step : 2 * step + 2], data.y[2 * step : 2 * step + 2])["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad()
    return opt


def values():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dtypes = {}
    for dt in [
        torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
        torch.int8, torch.uint8, torch.bool, torch.complex64, torch.uint16, torch.uint32,
        torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
    ]:
        base = torch.tensor([0.0, 1.5, -2.0, 3.25]) if dt.is_floating_point or dt.is_complex else torch.tensor([0, 1, 7, 100])
        dtypes[str(dt).removeprefix("torch.")] = base.to(dt)
    return {
        "dtypes": dtypes,
        "views": {"base": x, "t": x.t(), "rows": x[1:], "again": x, "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)},
        "param": nn.Parameter(torch.ones(2)),
        "frozen": nn.Parameter(torch.full((2, 2), 3.0), requires_grad=False),
        "grad": torch.ones(2, requires_grad=True),
        "ints": [0, 255, 256, 65535, 65536, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, -(2**63), 2**70, -(2**70)],
        "floats": (math.nan, math.inf, -math.inf, -0.0, 1e-300, 0.1),
        "text": ["", "héllo ✓", "a\nb"],
        "bytes": [b"\x00\xff", b"b", bytes(range(256))],
        "nested": {"t": (1, (2, (3, ())), [4, {"k": None}]), 5: True, (6, 7): [False]},
        "ordered": collections.OrderedDict([("z", 1), ("a", 2)]),
        "long_list": list(range(1001)),
        "long_dict": {i: i * 0.5 for i in range(1001)},
        "set": {3, 1, 2},
        "device": torch.device("cpu"),
        "dtype": torch.float32,
    }


def extra(folder):
    folder.mkdir()
    torch.save(two_steps(torch.optim.AdamW, lr=1e-2, foreach=True).state_dict(), folder / "adamw_foreach.pt")
    torch.save(two_steps(torch.optim.AdamW, lr=1e-2, fused=True).state_dict(), folder / "adamw_fused.pt")
    torch.save(two_steps(torch.optim.SGD, lr=1e-2, momentum=0.9).state_dict(), folder / "sgd_momentum.pt")
    torch.save(two_steps(tf.Adafactor, lr=1e-2, relative_step=False, scale_parameter=False).state_dict(), folder / "adafactor.pt")

    opt = two_steps(torch.optim.AdamW, lr=1e-2)
    sched = tf.get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=10)
    for _ in range(3):
        opt.step()
        sched.step()
    torch.save(sched.state_dict(), folder / "lambda_lr.pt")

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2)
    p = nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([p], lr=0.1)
    for g in [1.0, math.inf, 1.0]:
        scaler.scale(torch.tensor(1.0))
        p.grad = torch.full((2,), g) * scaler.get_scale()
        scaler.step(sgd)
        scaler.update()
    torch.save(scaler.state_dict(), folder / "grad_scaler.pt")

    args = tf.TrainingArguments(
        output_dir="other", debug="underflow_overflow", eval_strategy="steps", eval_steps=5,
        hub_strategy="checkpoint", lr_scheduler_type="linear", optim="adamw_torch",
        report_to="none", use_cpu=True,
    )
    torch.save(args, folder / "training_args_variant.bin")
    torch.save(values(), folder / "values.pt")
    # Python pickles b"" as `builtins.bytes()`, which weights_only=True refuses.
    torch.save({"empty": b"", "bytearray": bytearray(b"ab")}, folder / "python_values.bin")


def main():
    if sys.argv[1] == "--describe":
        files = sys.argv[2:]
        resave = None
        if files[:1] == ["--resave"]:
            resave, files = Path(files[1]), files[2:]
        for path in files:
            value = describe(path)
            if resave is not None:
                torch.save(value, resave / Path(path).name)
        return
    out = Path(sys.argv[1])
    random.seed(0)
    np.random.seed(0)
    trainer_checkpoint(out / "trainer")
    extra(out / "extra")
    for path in sorted(out.glob("*/*")):
        if path.suffix != ".json":
            # The reference values: what the objects are, whatever torch.load allows.
            describe(path, torch.load(path, weights_only=False))


if __name__ == "__main__":
    main()
