"""Reads a W&B run's transaction log (`run-<id>.wandb`: the LevelDB-style log of `wandb.proto`
`Record`s that wandb-core writes, and that `wandb sync` uploads) with the wandb package's own
message definitions, and folds it into what the run holds: the run record's fields, the config
and summary (every update applied in order), the metric definitions, the history rows and the
exit record. Timing values (`_timestamp`, `_runtime`, `_wandb.runtime`) are kept as keys with
the value replaced by "<time>"; the logged artifacts (`ArtifactRecord`s) with their staged
files checked against their manifest. Used by wandb_callback.py on upstream's run and by
callbacks/tests/it/wandb.rs on ours.

Usage: python _wandb_records.py RUN_FILE    (prints the folded run as JSON)
"""

import base64
import hashlib
import json
import struct
import sys
import zlib
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
TIMING = {"_timestamp", "_runtime"}


def records(path):
    data = open(path, "rb").read()
    if data[:4] != b":W&B" or data[4:7] != b"\xe1\xbe\x00":
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    pos, buf, out = 7, b"", []
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            if data[pos:pos + left] != b"\x00" * left:
                raise ValueError(f"{path}: block trailer at {pos} is not zero")
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) != length:
            raise ValueError(f"{path}: record at {pos} is cut")
        check = zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF
        if check != crc:
            raise ValueError(f"{path}: checksum of the record at {pos}")
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            out.append(r)
    return out


def path_of(item):
    return list(item.nested_key) if item.nested_key else [item.key]


def value(keys, text):
    return "<time>" if keys[-1] in TIMING or keys == ["_wandb", "runtime"] else json.loads(text)


def apply(tree, keys, v):
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = v


def staged(entry):
    """Whether a manifest entry's staged copy is what wandb stages: a read-only `tmp*` file in
    an `artifacts/staging` folder, of the entry's size and MD5."""
    path = Path(entry.local_path)
    data = path.read_bytes()
    return (
        path.parent.name == "staging" and path.parent.parent.name == "artifacts" and path.name.startswith("tmp")
        and (path.stat().st_mode & 0o777) == 0o400 and len(data) == entry.size
        and base64.b64encode(hashlib.md5(data).digest()).decode() == entry.digest
    )


def artifact(a, run_id):
    """An `ArtifactRecord` as its fields, the staged copies checked (`staged`), the random
    client ids as their lengths, the run's id in the name as `<run id>`, the aliases sorted (wandb's
come from a set)."""
    manifest = a.manifest
    contents = [
        {"path": e.path, "digest": e.digest, "size": e.size, "skip_cache": e.skip_cache, "staged": staged(e)}
        for e in manifest.contents
    ]
    check = hashlib.md5(b"wandb-artifact-manifest-v1\n")
    for e in sorted(manifest.contents, key=lambda e: e.path):
        check.update(f"{e.path}:{e.digest}\n".encode())
    return {
        "run_id_is_the_runs": a.run_id == run_id, "project": a.project, "entity": a.entity, "type": a.type,
        "name": a.name.replace(run_id, "<run id>") if run_id else a.name, "digest": a.digest, "digest_checks": check.hexdigest() == a.digest,
        "metadata": json.loads(a.metadata) if a.metadata else None, "aliases": sorted(a.aliases),
        "user_created": a.user_created, "use_after_commit": a.use_after_commit, "finalize": a.finalize,
        "client_id_lengths": [len(a.client_id), len(a.sequence_client_id)], "digest_algorithm": a.digest_algorithm,
        "manifest": {
            "version": manifest.version, "storage_policy": manifest.storage_policy,
            "storage_policy_config": {i.key: json.loads(i.value_json) for i in manifest.storage_policy_config},
            "manifest_file_path": manifest.manifest_file_path, "contents": contents,
        },
    }


def fold(path):
    run, config, summary, metrics, history, exits, kinds = None, {}, {}, [], [], [], []
    artifacts, run_id = [], None
    for r in records(path):
        kind = r.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "run":
            fields = MessageToDict(r.run, preserving_proto_field_name=True)
            for item in r.run.config.update:
                apply(config, path_of(item), value(path_of(item), item.value_json))
            run = {k: v for k, v in fields.items() if k in ("project", "display_name", "run_group", "job_type", "notes", "tags", "entity")}
            run_id = r.run.run_id
        elif kind == "artifact":
            artifacts.append(artifact(r.artifact, run_id))
        elif kind == "config":
            for item in r.config.update:
                apply(config, path_of(item), value(path_of(item), item.value_json))
        elif kind == "summary":
            for item in r.summary.update:
                apply(summary, path_of(item), value(path_of(item), item.value_json))
        elif kind == "metric":
            metrics.append(MessageToDict(r.metric, preserving_proto_field_name=True))
        elif kind == "history":
            row = {}
            for item in r.history.item:
                row["/".join(path_of(item))] = value(path_of(item), item.value_json)
            history.append({"step": r.history.step.num, "row": row})
        elif kind == "exit":
            exits.append({"exit_code": r.exit.exit_code})
    return {
        "run": run, "config": config, "summary": summary, "metrics": metrics, "history": history,
        "exit": exits, "has_header": kinds[:1] == ["header"], "artifacts": artifacts,
    }


if __name__ == "__main__":
    print(json.dumps(fold(sys.argv[1]), indent=1, sort_keys=True))
