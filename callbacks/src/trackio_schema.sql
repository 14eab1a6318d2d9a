-- The tables and indexes of a trackio 0.43 project database (its `SCHEMA_VERSION` 2): the
-- `sql` of every `sqlite_master` entry of a database `trackio.init` created, in its order.
-- `TrackioCallback` creates a new project database with these statements, so that trackio
-- reads and extends it as one of its own (`callbacks/tests/it/trackio.rs` checks the two
-- schemas are equal).
CREATE TABLE metrics (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        run_id TEXT NOT NULL,
                        timestamp TEXT NOT NULL,
                        run_name TEXT NOT NULL,
                        step INTEGER NOT NULL,
                        metrics TEXT NOT NULL
                    , log_id TEXT, space_id TEXT);
CREATE TABLE configs (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        run_id TEXT NOT NULL,
                        run_name TEXT NOT NULL,
                        config TEXT NOT NULL,
                        created_at TEXT NOT NULL,
                        UNIQUE(run_id)
                    );
CREATE TABLE system_metrics (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        run_id TEXT NOT NULL,
                        timestamp TEXT NOT NULL,
                        run_name TEXT NOT NULL,
                        metrics TEXT NOT NULL
                    , log_id TEXT, space_id TEXT);
CREATE TABLE traces (
                        id TEXT PRIMARY KEY,
                        run_id TEXT NOT NULL,
                        timestamp TEXT NOT NULL,
                        run_name TEXT NOT NULL,
                        step INTEGER NOT NULL,
                        key TEXT NOT NULL,
                        trace_index INTEGER,
                        messages TEXT NOT NULL,
                        metadata TEXT NOT NULL,
                        search_text TEXT NOT NULL,
                        log_id TEXT,
                        space_id TEXT,
                        spans TEXT NOT NULL DEFAULT '[]'
                    );
CREATE TABLE project_metadata (
                        key TEXT PRIMARY KEY,
                        value TEXT NOT NULL
                    );
CREATE TABLE pending_uploads (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        space_id TEXT NOT NULL,
                        run_id TEXT,
                        run_name TEXT,
                        step INTEGER,
                        file_path TEXT NOT NULL,
                        relative_path TEXT,
                        created_at TEXT NOT NULL
                    , kind TEXT NOT NULL DEFAULT 'media', digest TEXT);
CREATE TABLE alerts (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        run_id TEXT NOT NULL,
                        timestamp TEXT NOT NULL,
                        run_name TEXT NOT NULL,
                        title TEXT NOT NULL,
                        text TEXT,
                        level TEXT NOT NULL DEFAULT 'warn',
                        step INTEGER,
                        alert_id TEXT
                    );
CREATE TABLE artifacts (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        name TEXT NOT NULL UNIQUE,
                        type TEXT NOT NULL,
                        description TEXT,
                        created_at TEXT NOT NULL
                    );
CREATE TABLE artifact_versions (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        artifact_id INTEGER NOT NULL REFERENCES artifacts(id),
                        version INTEGER NOT NULL,
                        manifest_digest TEXT NOT NULL,
                        manifest TEXT NOT NULL,
                        metadata TEXT,
                        size_bytes INTEGER NOT NULL,
                        producer_run_id TEXT,
                        producer_run_name TEXT,
                        created_at TEXT NOT NULL,
                        UNIQUE(artifact_id, version),
                        UNIQUE(artifact_id, manifest_digest)
                    );
CREATE TABLE artifact_aliases (
                        artifact_id INTEGER NOT NULL REFERENCES artifacts(id),
                        alias TEXT NOT NULL,
                        artifact_version_id INTEGER NOT NULL REFERENCES artifact_versions(id),
                        PRIMARY KEY (artifact_id, alias)
                    );
CREATE TABLE run_artifact_links (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        run_id TEXT,
                        run_name TEXT,
                        run_project TEXT,
                        artifact_version_id INTEGER NOT NULL REFERENCES artifact_versions(id),
                        direction TEXT NOT NULL CHECK(direction IN ('input', 'output')),
                        created_at TEXT NOT NULL
                    );
CREATE TABLE external_run_artifact_links (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        run_id TEXT,
                        run_name TEXT,
                        source_project TEXT NOT NULL,
                        source_version_id INTEGER NOT NULL,
                        source_artifact TEXT NOT NULL,
                        source_type TEXT NOT NULL,
                        source_version INTEGER NOT NULL,
                        source_size_bytes INTEGER NOT NULL,
                        direction TEXT NOT NULL CHECK(direction IN ('input', 'output')),
                        created_at TEXT NOT NULL
                    );
CREATE INDEX idx_run_artifact_links_run
                    ON run_artifact_links(run_id, run_name)
                    ;
CREATE INDEX idx_run_artifact_links_name
                    ON run_artifact_links(run_name, run_id)
                    ;
CREATE INDEX idx_run_artifact_links_version
                    ON run_artifact_links(artifact_version_id)
                    ;
CREATE UNIQUE INDEX idx_run_artifact_links_unique
                    ON run_artifact_links(
                        COALESCE(run_project, ''), COALESCE(run_id, ''),
                        COALESCE(run_name, ''), artifact_version_id, direction
                    );
CREATE INDEX idx_run_artifact_links_project_run
                    ON run_artifact_links(run_project, run_id, run_name);
CREATE INDEX idx_external_artifact_links_run
                    ON external_run_artifact_links(run_id, run_name);
CREATE UNIQUE INDEX idx_external_artifact_links_unique
                    ON external_run_artifact_links(
                        COALESCE(run_id, ''), COALESCE(run_name, ''),
                        source_project, source_version_id, direction
                    );
CREATE INDEX idx_pending_uploads_kind
                    ON pending_uploads(kind)
                    ;
CREATE INDEX idx_metrics_run_step
                    ON metrics(run_id, step)
                    ;
CREATE INDEX idx_metrics_run_timestamp
                    ON metrics(run_id, timestamp)
                    ;
CREATE INDEX idx_configs_run_name
                    ON configs(run_name)
                    ;
CREATE INDEX idx_system_metrics_run_timestamp
                    ON system_metrics(run_id, timestamp)
                    ;
CREATE INDEX idx_traces_run_step
                    ON traces(run_id, step)
                    ;
CREATE INDEX idx_traces_run_timestamp
                    ON traces(run_id, timestamp)
                    ;
CREATE INDEX idx_traces_search
                    ON traces(search_text)
                    ;
CREATE INDEX idx_alerts_run
                    ON alerts(run_id)
                    ;
CREATE INDEX idx_alerts_timestamp
                    ON alerts(timestamp)
                    ;
CREATE UNIQUE INDEX idx_alerts_alert_id
                    ON alerts(alert_id) WHERE alert_id IS NOT NULL
                    ;
CREATE UNIQUE INDEX idx_metrics_log_id
                        ON metrics(log_id) WHERE log_id IS NOT NULL;
CREATE INDEX idx_metrics_pending
                        ON metrics(space_id) WHERE space_id IS NOT NULL;
CREATE UNIQUE INDEX idx_system_metrics_log_id
                        ON system_metrics(log_id) WHERE log_id IS NOT NULL;
CREATE INDEX idx_system_metrics_pending
                        ON system_metrics(space_id) WHERE space_id IS NOT NULL;
CREATE INDEX idx_metrics_run_record
                        ON metrics(run_id, run_name, timestamp);
