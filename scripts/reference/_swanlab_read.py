"""Reads a SwanLab run folder with swanlab's own code, for swanlab_callback.py and
callbacks/tests/it/swanlab.rs: the record log through swanlab's DataStoreReader (the header,
each fragment's CRC) and its protobuf Record, the run's start as `swanlab sync` opens it
(CoreSyncPython.deliver_sync_start), and config.yaml through PyYAML as its uploader loads it.

Prints one JSON object:
  gitignore      the log folder's .gitignore;
  run_dir        the run folder's name with its timestamp and id checked;
  files          the run folder's files and folders (relative; the run's id as <id>), those
                 set aside excluded;
  records        every record but the saves and console lines, in order, as protobuf's
                 MessageToDict gives them, with `num` checked (start -1, finish -2, the others
                 counting up) and removed, times checked and replaced by "<time>", the run's
                 id, a generated name or color and the working directory's name (the default
                 project) replaced by placeholders;
  config_saves   the SAVE_TYPE_CONFIG records (paths relative to the run folder), in order;
  config_yaml    files/config.yaml's text, and config its PyYAML load;
  sync_start     what CoreSyncPython.deliver_sync_start answers for the run file;
  set_aside      what the reader set aside: upstream's records about its own Python process
                 (console lines, the metadata and requirements saves and their files, the
                 SDK's debug log).

Usage: python _swanlab_read.py RUN_DIR CWD
"""

import json
import re
import sys
from pathlib import Path

import yaml
from google.protobuf.json_format import MessageToDict
from swanlab.proto.swanlab.record.v1.record_pb2 import Record
from swanlab.proto.swanlab.save.v1.save_pb2 import SaveType
from swanlab.sdk.internal.core_python.store import DataStoreReader

PROCESS_FILES = {"files/swanlab-metadata.json", "files/requirements.txt", "files/conda.yaml", "debug/debug.log"}
NAME = re.compile(r"^[a-z]+-[a-z]+-[1-9][0-9]$")
COLOR = re.compile(r"^#[0-9a-f]{6}$")


def times(value, path=""):
    """Timestamps (dicts of seconds/nanos, or RFC 3339 strings from MessageToDict) checked and
    replaced."""
    if isinstance(value, dict):
        return {k: times(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [times(v, path) for v in value]
    if path in ("timestamp", "started_at", "finished_at", "startedAt", "finishedAt"):
        assert isinstance(value, str) and re.match(r"^20[2-9][0-9]-[0-9]{2}-[0-9]{2}T", value), value
        return "<time>"
    return value


def read(run_dir, cwd):
    run_dir, cwd = Path(run_dir).resolve(), Path(cwd).resolve()
    set_aside = []
    out = {"gitignore": (run_dir.parent / ".gitignore").read_text()}
    files = []
    for p in sorted(run_dir.rglob("*")):
        rel = p.relative_to(run_dir).as_posix()
        if rel in PROCESS_FILES:
            set_aside.append(rel)
        else:
            files.append(rel + ("/" if p.is_dir() else ""))
    out["files"] = files
    reader = DataStoreReader()
    reader.open(run_dir / next(f for f in files if f.endswith(".swanlab")))
    records, config_saves, last_num = [], [], 0
    run_id = None
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        num = record.num
        if kind == "log":
            set_aside.append(f"console line {record.log.line!r}")
            continue
        if kind == "save":
            if record.save.type == SaveType.SAVE_TYPE_CONFIG:
                assert num == -3, num
                save = MessageToDict(record.save, preserving_proto_field_name=True)
                save["source_path"] = Path(save["source_path"]).resolve().relative_to(run_dir).as_posix()
                config_saves.append(save)
            else:
                set_aside.append(f"save {SaveType.Name(record.save.type)}")
            continue
        if kind == "start":
            assert num == -1, num
        elif kind == "finish":
            assert num == -2, num
        else:
            assert num > last_num, (num, last_num)
            last_num = num
        d = times(MessageToDict(record, preserving_proto_field_name=True))
        del d["num"]
        if kind == "start":
            s = d["start"]
            run_id = s["id"]
            s["id"] = "<id>"
            assert COLOR.match(s.pop("color")), record.start.color
            if NAME.match(s["name"]):
                s["name"] = "<generated name>"
            if s.get("project") == cwd.name:
                s["project"] = "<working directory's name>"
        records.append(d)
    reader.close()
    out["files"] = [f.replace(f"run-{run_id}.swanlab", "run-<id>.swanlab") for f in files]
    out["records"] = records
    out["config_saves"] = config_saves
    m = re.match(r"^run-([0-9]{8}_[0-9]{6})-(.+)$", run_dir.name)
    out["run_dir"] = {"timestamp": bool(m), "id_is_the_runs": bool(m) and m.group(2) == run_id,
                      "run_file": f"run-{run_id}.swanlab" in files}
    config_yaml = (run_dir / "files" / "config.yaml").read_text()
    out["config_yaml"] = config_yaml
    out["config"] = yaml.safe_load(config_yaml)
    out["sync_start"] = sync_start(run_dir, run_id)
    out["set_aside"] = set_aside
    return out


def sync_start(run_dir, run_id):
    """What `swanlab sync` checks before it talks to a server: the header and the start record."""
    from swanlab.proto.swanlab.grpc.core.v1.sync_pb2 import DeliverSyncStartRequest
    from swanlab.sdk.internal.core_python.sync import CoreSyncPython
    from swanlab.sdk.internal.settings import Settings

    core_settings = Settings().to_core_proto(run_id=run_id, run_dir=run_dir)
    resp = CoreSyncPython().deliver_sync_start(DeliverSyncStartRequest(core_settings=core_settings))
    return {"success": resp.success, "message": resp.message}


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1], sys.argv[2])))
