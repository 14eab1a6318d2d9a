"""A local stand-in for a ClearML API server (`CLEARML_API_HOST`), answering the calls
`Task.import_offline_session` makes, as the ClearML server answers them, and recording each
call: `auth.login`, `projects.*`, `tasks.*` (create, edit, started, completed, ...) and the
events (`events.add_batch`: scalars, single values, console lines). ClearML's server cannot run
here; clearml 2.1 imports upstream's offline session (scripts/reference/clearml_callback.py) and
tchtrain-callbacks' (callbacks/tests/it/clearml.rs) into this one, both read by `read` below.

Usage: python _clearml_server.py read SESSION_ZIP   (prints the session as written and what the
                                                    server received when clearml imported it,
                                                    folded, as JSON)
"""

import base64
import copy
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from pathlib import Path

API_VERSION = "2.30"


def b64(obj):
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


# A JWT as the server signs it; clearml reads its claims without checking the signature.
TOKEN = b64({"alg": "HS256", "typ": "JWT"}) + "." + b64({"exp": 4102444800, "api_version": API_VERSION}) + ".c2ln"


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []
        self.projects = {}
        self.tasks = {}
        self.models = {}

    def merge(self, obj, fields):
        for k, v in fields.items():
            obj[k] = copy.deepcopy(v)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, *args):
        pass

    def answer(self, endpoint, data, code=200, msg="OK"):
        body = json.dumps({"meta": {"id": uuid.uuid4().hex, "trx": uuid.uuid4().hex,
                                    "endpoint": {"name": endpoint, "requested_version": API_VERSION,
                                                 "actual_version": API_VERSION},
                                    "result_code": code, "result_subcode": 0, "result_msg": msg,
                                    "error_stack": "", "alarms": {}},
                           "data": data}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_call(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        endpoint = self.path.split("?")[0].strip("/").split("/")[-1]
        if endpoint == "events.add_batch":
            body = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        else:
            body = json.loads(raw) if raw.strip() else {}
        st = self.state
        with st.lock:
            st.calls.append({"endpoint": endpoint, "body": body})
            data = self.dispatch(endpoint, body, st)
        if data is None:
            self.answer(endpoint, {}, 400, f"{endpoint} is not answered by the stand-in server")
        else:
            self.answer(endpoint, data)

    do_GET = do_POST = do_PUT = handle_call

    @staticmethod
    def dispatch(endpoint, body, st):
        if endpoint == "auth.login":
            return {"token": TOKEN}
        if endpoint == "projects.get_all":
            name = body.get("name", "").strip("^$").replace("\\", "")
            return {"projects": [{"id": i, "name": p["name"]} for i, p in st.projects.items() if p["name"] == name]}
        if endpoint == "projects.create":
            pid = uuid.uuid4().hex
            st.projects[pid] = {"id": pid, "name": body["name"]}
            return {"id": pid}
        if endpoint == "tasks.create":
            tid = uuid.uuid4().hex
            task = {"id": tid, "status": "created", "project": body.get("project")}
            st.merge(task, {k: v for k, v in body.items() if k != "method"})
            st.tasks[tid] = task
            return {"id": tid}
        if endpoint in ("tasks.get_by_id", "tasks.get_by_id_ex"):
            ids = body.get("task") or body.get("id")
            if isinstance(ids, list):
                return {"tasks": [st.tasks[i] for i in ids if i in st.tasks]}
            return {"task": st.tasks.get(ids)} if ids in st.tasks else None
        if endpoint in ("tasks.get_all", "tasks.get_all_ex"):
            ids = body.get("id") or list(st.tasks)
            return {"tasks": [st.tasks[i] for i in ids if i in st.tasks]}
        if endpoint == "tasks.edit":
            task = st.tasks.get(body.get("task"))
            if task is None:
                return None
            st.merge(task, {k: v for k, v in body.items() if k not in ("task", "force", "method")})
            return {"updated": 1, "fields": {}}
        if endpoint in ("tasks.started", "tasks.completed", "tasks.stopped", "tasks.close", "tasks.reset"):
            task = st.tasks.get(body.get("task"))
            if task is None:
                return None
            task["status"] = {"tasks.started": "in_progress", "tasks.completed": "completed",
                              "tasks.stopped": "stopped", "tasks.close": "closed",
                              "tasks.reset": "created"}[endpoint]
            return {"updated": 1, "fields": {"status": task["status"]}}
        if endpoint in ("tasks.add_or_update_artifacts", "tasks.edit_hyper_params",
                        "tasks.edit_configuration", "tasks.add_or_update_model", "tasks.update"):
            return {"updated": 1}
        if endpoint == "events.add_batch":
            return {"added": len(body), "errors": 0, "errors_info": {}}
        if endpoint in ("server.info", "debug.ping"):
            return {"version": "2.0.0", "api_version": API_VERSION}
        return None


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass


def start():
    """Serves in a thread; returns (server, state, url)."""
    state = State()
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state, f"http://127.0.0.1:{server.server_address[1]}"


IMPORT = "import sys\nfrom clearml import Task\nprint(Task.import_offline_session(sys.argv[1]))\n"


def import_session(session_zip):
    """`Task.import_offline_session(session_zip)` in a clearml process pointed at a fresh
    stand-in server; returns the server's state."""
    server, state, url = start()
    home = tempfile.mkdtemp(prefix="tchtrain-clearml-import-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLEARML_", "TRAINS_"))}
    env.update({"HOME": home, "CLEARML_API_HOST": url, "CLEARML_WEB_HOST": url, "CLEARML_FILES_HOST": url,
                "CLEARML_API_ACCESS_KEY": "reference-key", "CLEARML_API_SECRET_KEY": "reference-secret"})
    out = subprocess.run([sys.executable, "-c", IMPORT, str(session_zip)], env=env, capture_output=True, text=True)
    server.shutdown()
    if out.returncode != 0:
        raise RuntimeError(f"Task.import_offline_session failed:\n{out.stdout}\n{out.stderr}")
    return state


def fold(st):
    """What the server holds after the import: the project, the task (its name, type, status,
    hyperparameters, configuration objects, execution; not its script, which describes the
    process that ran it) and the scalar events in the order they came (metric, variant,
    iteration, value); console lines are counted, not compared."""
    (task,) = st.tasks.values()
    scalars, log_lines = [], 0
    for call in st.calls:
        if call["endpoint"] != "events.add_batch":
            continue
        for event in call["body"]:
            assert event["task"] == task["id"], event
            if event["type"] == "log":
                log_lines += 1
            elif event["type"] == "training_stats_scalar" and not event["metric"].startswith(":monitor:"):
                scalars.append([event["metric"], event["variant"], event["iter"], event["value"]])
            elif event["type"] != "training_stats_scalar":
                raise AssertionError(f"unexpected event {event}")
    return {"project": st.projects[task["project"]]["name"],
            "task": {k: task.get(k) for k in ("name", "type", "status", "hyperparams", "configuration", "execution")},
            "script_keys": sorted(task.get("script") or {}),
            "scalars": scalars, "log_events": log_lines,
            "endpoints": sorted({c["endpoint"] for c in st.calls})}


def read_session(session_zip):
    """The session as written: the zip's file names, task.json without its id and folder
    (per run; the folder's name checked to be the id) and `script` by its keys (it describes
    the process that ran), the metric events in order without their timestamps and task id
    (checked to be the task's)."""
    with zipfile.ZipFile(session_zip) as z:
        names = sorted(z.namelist())
        task = json.loads(z.read("task.json"))
        events = []
        if "metrics.jsonl" in names:
            for line in z.read("metrics.jsonl").decode().splitlines():
                for event in json.loads(line):
                    assert event.pop("task") == task["id"], event
                    event.pop("timestamp")
                    events.append(event)
    assert Path(task.pop("offline_folder")).name == task.pop("id")
    assert Path(session_zip).stem == Path(session_zip).name[: -len(".zip")]
    task["script"] = sorted(task["script"])
    return {"files": names, "task": task, "events": events}


if __name__ == "__main__" and sys.argv[1:2] == ["read"]:
    print(json.dumps({"session": read_session(sys.argv[2]), "imported": fold(import_session(sys.argv[2]))},
                     indent=1))
