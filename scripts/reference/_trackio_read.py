"""What trackio's own API reads from a trackio project database: used by
scripts/reference/trackio_callback.py (on the databases upstream's TrackioCallback writes) and
by callbacks/tests/it/trackio.rs (on the ones ours writes), so that both are read the same way.

`read(project)` returns {"user_version", "schema": [sql of every sqlite_master entry, sorted],
"runs": [{"name", "config", "logs": [...]}]}: the runs as `trackio.Api().runs(project)` lists
them, each run's config (`Run.config`) and its logs (`SQLiteStorage.get_logs`: the metrics,
`step`, `timestamp`), with the values that differ from run to run (times, ids) replaced by
their kind, so that two runs of the same logs compare equal.

trackio reads TRACKIO_DIR when it is imported: set it before importing this module.

Usage: TRACKIO_DIR=DIR python _trackio_read.py PROJECT  (prints the JSON)
"""

import json
import re
import sqlite3
import sys

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00$")


def _stable(value):
    """Times as "<iso time>" (checked to be one), nested values alike."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if hasattr(value, "isoformat"):
        return "<time>"
    if isinstance(value, str) and ISO.match(value):
        return "<iso time>"
    return value


def read(project):
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    db = SQLiteStorage.get_project_db_path(project)
    conn = sqlite3.connect(db)
    # Sorted: trackio re-creates some indexes when it opens an existing database, which moves
    # them in sqlite_master; the order means nothing to it.
    schema = sorted(sql for (sql,) in conn.execute("SELECT sql FROM sqlite_master") if sql)
    user_version = conn.execute("PRAGMA user_version").fetchone()[0]
    ids = [len(i) == 32 and int(i, 16) >= 0 for (i,) in conn.execute("SELECT run_id FROM metrics")]
    conn.close()
    runs = []
    for run in trackio.Api().runs(project):
        logs = SQLiteStorage.get_logs(project, run.name, run_id=run.id)
        runs.append({"name": run.name, "config": _stable(run.config), "logs": _stable(logs)})
    return {"user_version": user_version, "schema": schema, "run_ids_are_uuid_hex": all(ids), "runs": runs}


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1]), indent=1))
