"""A local stand-in for a W&B server (`WANDB_BASE_URL`), answering the requests a run in online
mode makes, as W&B's API answers them, and recording each request: the GraphQL queries
(`Viewer`, `UpsertBucket`, `CreateRunFiles`, ...), the file stream
(`/files/<entity>/<project>/<run>/file_stream`: history lines, summary, events, the final
`complete` / `exitcode`), the files uploaded to the URLs `CreateRunFiles` hands out, and the
artifacts `run.log_artifact` sends (`CreateArtifact`, `CreateArtifactManifest`,
`CreateArtifactFiles`, the uploads, `CommitArtifact`). W&B's
server itself cannot run here; wandb-core (wandb 0.31) runs its whole online path against this
one (scripts/reference/wandb_callback.py's `online` case), and so does tchtrain-callbacks'
WandbCallback in callbacks/tests/it/wandb.rs, both folded by `fold` below.

Usage: python _wandb_server.py serve LOG_FILE    (prints "listening on <port>", serves until
                                                 killed; one JSON line per request in LOG_FILE)
       python _wandb_server.py fold LOG_FILE     (prints the folded run as JSON)
"""

import base64
import http.server
import json
import sys
import threading

ENTITY = "reference-entity"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_file = None
    lock = threading.Lock()
    artifacts = 0

    def log_message(self, *args):
        pass

    def record(self, entry):
        with self.lock:
            self.log_file.write(json.dumps(entry) + "\n")
            self.log_file.flush()

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def answer(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        import hashlib

        data = self.body()
        self.record({"method": "PUT", "path": self.path, "body": data.decode("utf-8", "replace"),
                     "md5": base64.b64encode(hashlib.md5(data).digest()).decode(), "size": len(data)})
        self.answer(200, {})

    def do_GET(self):
        self.record({"method": "GET", "path": self.path})
        self.answer(404, {"error": "not found"})

    def do_POST(self):
        data = self.body()
        if self.path.startswith("/sdk/otel"):  # wandb-core's own telemetry: not the run's
            self.answer(200, {})
            return
        try:
            body = json.loads(data)
        except ValueError:
            self.answer(400, {"error": "not JSON"})
            return
        self.record({"method": "POST", "path": self.path, "body": body,
                     "authorization": self.headers.get("Authorization")})
        if self.path.startswith("/graphql"):
            self.answer(200, {"data": self.graphql(body.get("operationName"), body.get("variables") or {})})
        elif self.path.endswith("/file_stream"):
            self.answer(200, {"exitcode": None, "limits": {}})
        else:
            self.answer(404, {"error": "not found"})

    def graphql(self, operation, v):
        port = self.server.server_address[1]
        if operation == "Viewer":
            return {"viewer": {"id": "VXNlcjox", "entity": ENTITY, "username": "reference-user", "email": None,
                               "flags": "{}", "teams": {"edges": []}}}
        if operation == "UpsertBucket":
            return {"upsertBucket": {"inserted": True, "bucket": {
                "id": "UnVuOjE=", "name": v.get("name"), "displayName": v.get("displayName") or v.get("name"),
                "description": "", "config": "{}", "sweepName": None, "historyLineCount": 0,
                "project": {"id": "UHJvamVjdDox", "name": v.get("project") or "uncategorized",
                            "entity": {"id": "RW50aXR5OjE=", "name": v.get("entity") or ENTITY}}}}}
        if operation == "CreateRunFiles":
            base = f"http://127.0.0.1:{port}/upload/{v['entity']}/{v['project']}/{v['run']}"
            return {"createRunFiles": {"runID": "UnVuOjE=", "uploadHeaders": [],
                                       "files": [{"name": f, "uploadUrl": f"{base}/{f}"} for f in v["files"]]}}
        if operation == "OrganizationCoreWeaveOrganizationID":
            return {"entity": {"organization": None}}
        # Artifacts (`run.log_artifact` online): the type check the SDK makes first (no
        # operation name), then wandb-core's CreateArtifact, CreateArtifactManifest (twice:
        # before the files, and with its digest and upload URL after them),
        # CreateArtifactFiles (upload URLs, in the order asked), CommitArtifact.
        if not operation and "name" in v:
            return {"project": {"artifact": None}}
        if operation == "CreateArtifact":
            with self.lock:
                Handler.artifacts += 1
                n = Handler.artifacts
            artifact_id = base64.b64encode(f"Artifact:{n}".encode()).decode()
            return {"createArtifact": {"artifact": {"id": artifact_id, "state": "PENDING",
                                                    "artifactSequence": {"latestArtifact": None}}}}
        if operation == "CreateArtifactManifest":
            file = {"id": "RmlsZTox"}
            if v.get("includeUpload"):
                file |= {"uploadUrl": f"http://127.0.0.1:{port}/upload/manifest/{v['artifactID']}", "uploadHeaders": []}
            return {"createArtifactManifest": {"artifactManifest": {"id": f"manifest-{v['artifactID']}", "file": file}}}
        if operation == "CreateArtifactFiles":
            return {"createArtifactFiles": {"files": {"edges": [
                {"node": {"storagePath": f"wandb_artifacts/{f['md5']}", "uploadMultipartUrls": None, "uploadHeaders": [],
                          "uploadUrl": f"http://127.0.0.1:{port}/upload/artifact/{f['artifactID']}/{f['name']}",
                          "artifact": {"id": f["artifactID"]}}}
                for f in v["input"]["artifactFiles"]]}}}
        if operation == "CommitArtifact":
            return {"commitArtifact": {"artifact": {"id": v["artifactID"], "digest": "committed"}}}
        return {}


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client dropping its connection
        pass


def serve(log_path):
    Handler.log_file = open(log_path, "a")
    server = Server(("127.0.0.1", 0), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


def start(log_path):
    """Serves in a thread of this process; returns the server (its port in `server_address`)."""
    Handler.log_file = open(log_path, "a")
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


TIMING = {"_timestamp", "_runtime"}


def fold_artifacts(entries):
    """The artifacts logged, in the order created: the type asked first (`ArtifactType`'s
    variables), CreateArtifact's input (the random client ids as "<client id>", the aliases
    sorted, the metadata parsed), the
    CreateArtifactManifest calls, the files asked for (CreateArtifactFiles' inputs: name, MD5,
    manifest id; sorted by name) and uploaded (name -> [MD5, size] of the bytes received), the manifest uploaded
    (its files' `local_path`, the staged copy, as "<staged>"), and whether it was committed."""
    ids = {}
    out = []
    type_queries = [e["body"]["variables"] for e in entries if e["method"] == "POST" and e["path"].startswith("/graphql")
                    and not e["body"].get("operationName") and "name" in (e["body"].get("variables") or {})]
    n = 0
    for e in entries:
        if e["method"] != "POST" or not e["path"].startswith("/graphql"):
            continue
        op, v = e["body"].get("operationName"), e["body"].get("variables") or {}
        if op == "CreateArtifact":
            n += 1
            artifact_id = base64.b64encode(f"Artifact:{n}".encode()).decode()
            create = dict(v["input"])
            for k in ("clientID", "sequenceClientID"):
                create[k] = "<client id>" if create.get(k) else create.get(k)
            # wandb-core sends the aliases and the metadata's keys in Go's map order (random).
            create["aliases"] = sorted(create.get("aliases") or [], key=lambda a: a["alias"])
            if create.get("metadata"):
                create["metadata"] = json.loads(create["metadata"])
            ids[artifact_id] = len(out)
            out.append({"type_query": type_queries[n - 1] if n <= len(type_queries) else None, "create": create,
                        "manifests": [], "files": [], "uploads": {}, "manifest": None, "committed": False})
        elif op == "CreateArtifactManifest":
            out[ids[v["artifactID"]]]["manifests"].append({k: x for k, x in v.items() if k != "artifactID"})
        elif op == "CreateArtifactFiles":
            for f in v["input"]["artifactFiles"]:
                a = out[ids[f["artifactID"]]]
                a["files"].append({k: x for k, x in f.items() if k != "artifactID"})
                a["storage_layout"] = v["input"].get("storageLayout")
        elif op == "CommitArtifact":
            out[ids[v["artifactID"]]]["committed"] = True
    manifest_md5 = {}
    for e in entries:
        if e["method"] != "PUT":
            continue
        if e["path"].startswith("/upload/manifest/"):
            manifest_md5[e["path"][len("/upload/manifest/"):]] = e["md5"]
    for a in out:  # asked for in Go's map order too
        a["files"].sort(key=lambda f: f["name"])
    for artifact_id, i in ids.items():
        # The manifest's digest is its uploaded bytes' MD5 (which hold the staged paths).
        for m in out[i]["manifests"]:
            if m.get("digest"):
                m["digest"] = ("<MD5 of the manifest uploaded>" if m["digest"] == manifest_md5.get(artifact_id)
                               else f"<not the manifest's MD5: {m['digest']}>")
    for e in entries:
        if e["method"] != "PUT":
            continue
        if e["path"].startswith("/upload/artifact/"):
            artifact_id, name = e["path"][len("/upload/artifact/"):].split("/", 1)
            out[ids[artifact_id]]["uploads"][name] = [e["md5"], e["size"]]
        elif e["path"].startswith("/upload/manifest/"):
            manifest = json.loads(e["body"])
            for entry in manifest.get("contents", {}).values():
                if "local_path" in entry:
                    entry["local_path"] = "<staged>"
            out[ids[e["path"][len("/upload/manifest/"):]]]["manifest"] = manifest
    return out


def untimed(row):
    """A history row or summary with its timing values as "<time>"."""
    out = {k: "<time>" if k in TIMING else v for k, v in row.items()}
    if isinstance(out.get("_wandb"), dict) and "runtime" in out["_wandb"]:
        out["_wandb"] = {**out["_wandb"], "runtime": "<time>"}
    return out


def wandb_reduced(config):
    """A config with `_wandb` reduced to the metric definitions (`m`): the rest is wandb's own
    (its version, telemetry, the Python environment)."""
    if config is None:
        return None
    m = (config.get("_wandb") or {}).get("value", {}).get("m")
    return {k: v for k, v in config.items() if k != "_wandb"} | {"_wandb": {"value": {"m": m}}}


def fold(log_path):
    """The run the requests in `log_path` made: the API keys sent (`api:<key>` in basic
    authentication), the run's fields (the first `UpsertBucket`; its id as "<run id>"), its
    config (the last one sent, `wandb_reduced`), the history lines in order (from the file
    stream's offsets: every line sent once, none missing), the last summary, the file stream's
    end (`complete`, `exitcode`, `uploaded`, the stream's path) and the files uploaded
    (`config.yaml` and `wandb-summary.json` read back, the others by name)."""
    import re

    import yaml

    class Yaml12(yaml.SafeLoader):
        """PyYAML with YAML 1.2's floats (`1e-08` without a dot), as W&B's server (and
        wandb-core, which writes it so) reads config.yaml."""

    Yaml12.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"),
        list("-+0123456789."),
    )

    entries = [json.loads(line) for line in open(log_path)]
    upserts, history, summary, end, files, keys = [], {}, None, {}, {}, set()
    artifacts = fold_artifacts(entries)
    for e in entries:
        if e["method"] == "PUT":
            if not e["path"].startswith(("/upload/artifact/", "/upload/manifest/")):
                files[e["path"].rsplit("/", 1)[1]] = e["body"]
            continue
        auth = e.get("authorization") or ""
        if auth.startswith("Basic "):
            keys.add(base64.b64decode(auth[6:]).decode())
        body = e["body"]
        if e["path"].startswith("/graphql"):
            if body.get("operationName") == "UpsertBucket":
                upserts.append(body["variables"])
            continue
        for name, chunk in body.get("files", {}).items():
            if name == "wandb-history.jsonl":
                for i, line in enumerate(chunk["content"]):
                    if chunk["offset"] + i in history:
                        raise ValueError(f"history line {chunk['offset'] + i} sent twice")
                    history[chunk["offset"] + i] = json.loads(line)
            elif name == "wandb-summary.json":
                summary = json.loads(chunk["content"][-1])
        for k in ("complete", "exitcode", "uploaded"):
            if k in body:
                end[k] = sorted(body[k]) if k == "uploaded" else body[k]
        end["stream_path"] = e["path"]
    if sorted(history) != list(range(len(history))):
        raise ValueError(f"history lines missing: {sorted(history)}")
    config = None
    for u in upserts:
        if u.get("config"):
            config = json.loads(u["config"])
    first = upserts[0] if upserts else {}
    run_id = first.get("name") or "<none>"
    if "stream_path" in end:
        end["stream_path"] = end["stream_path"].replace(run_id, "<run id>")
    read = {"config.yaml": lambda t: wandb_reduced(yaml.load(t, Loader=Yaml12)), "wandb-summary.json": lambda t: untimed(json.loads(t))}
    run_name = first.get("name")
    for a in artifacts:
        a["create"]["runName"] = "<run id>" if a["create"].get("runName") == run_name else a["create"].get("runName")
        for m in a["manifests"]:
            m["runName"] = "<run id>" if m.get("runName") == run_name else m.get("runName")
    return {
        "artifacts": artifacts,
        "api_keys": sorted(keys),
        "run": {k: first.get(k) for k in ("project", "entity", "groupName", "displayName", "notes", "jobType", "tags")}
        | {"name": "<run id>" if first.get("name") else None},
        "config": wandb_reduced(config),
        "history": [untimed(history[i]) for i in range(len(history))],
        "summary": untimed(summary) if summary is not None else None,
        "end": end,
        "files": {name: read[name](body) if name in read else "<uploaded>" for name, body in sorted(files.items())},
    }


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "fold":
        print(json.dumps(fold(sys.argv[2]), indent=1, sort_keys=True))
    else:
        raise SystemExit(__doc__)
