"""Reading back what the hosted trackers wrote under a run folder, through each package's own formats: mlflow's
client, wandb's and swanlab's offline run files (one folder per process, each holding ``run-<run id>.<format>``)."""

import json
import pathlib
import struct


def offline_trackers(monkeypatch):
    """Keep every tracker on this machine: offline wandb and swanlab, mlflow's local store, no telemetry."""
    for name in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "SWANLAB_API_KEY", "SWANLAB_LOG_DIR", "TENSORBOARD_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "SWANLAB_MODE": "offline",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
    }.items():
        monkeypatch.setenv(name, value)


def mlflow_runs(run_dir, project):
    """{run id: {metric: [(step, value), ...]}} of the project's runs in ``<run_dir>/mlflow.db``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{pathlib.Path(run_dir).resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(project)
    runs = {}
    for run in client.search_runs([experiment.experiment_id]):
        history = {key: client.get_metric_history(run.info.run_id, key) for key in run.data.metrics}
        runs[run.info.run_id] = {key: [(m.step, m.value) for m in values] for key, values in history.items()}
    return runs


def mlflow_table(run_dir, project, run_id, artifact_file):
    import mlflow

    # load_table finds the runs through the global tracking URI, whatever the client's.
    mlflow.set_tracking_uri(f"sqlite:///{pathlib.Path(run_dir).resolve() / 'mlflow.db'}")
    experiment = mlflow.get_experiment_by_name(project)
    return mlflow.MlflowClient().load_table(experiment.experiment_id, artifact_file, run_ids=[run_id])


def _offline_runs(run_dir, pattern, message):
    """(folder, run id, [parsed ``message`` records]) per run file under ``run_dir`` matching ``pattern``, oldest
    first."""
    for path in sorted(pathlib.Path(run_dir).glob(pattern), key=_folder_name):
        records = []
        for data in _leveldb_records(path):
            record = message()
            record.ParseFromString(data)
            records.append(record)
        yield path.parent, path.stem.removeprefix("run-"), records


def _leveldb_records(path):
    """The records of a LevelDB-log file (wandb's ``.wandb``, swanlab's ``.swanlab``): 32 KiB blocks of
    (crc32, length, type) headers, records split FIRST/MIDDLE/LAST across blocks."""
    data, block, header = pathlib.Path(path).read_bytes(), 32768, 7
    position, pending = header, b""  # after the file's own 7-byte header
    while position + header <= len(data):
        if block - position % block < header:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + header])
        if position + header + length > len(data):  # torn by a kill
            return
        pending += data[position + header : position + header + length]
        position += header + length
        if kind in (1, 4):  # FULL or LAST
            yield pending
            pending = b""


def _folder_name(path):
    return path.parent.name  # <date>_<time>-<run id>[-<n>]: in the order the processes started


def wandb_offline_runs(run_dir):
    """[(run id, [history row, ...]), ...] per offline run folder of ``<run_dir>/wandb``, oldest first; a row maps
    each logged key (and ``_step``) to its value, a table to its file's contents."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()  # `finish` returns before wandb's service process has written the run's last records
    runs = []
    for folder, run_id, records in _offline_runs(run_dir, "wandb/offline-run-*/run-*.wandb", wandb_internal_pb2.Record):
        rows = []
        for record in records:
            if record.WhichOneof("record_type") == "history":
                row = {}
                for item in record.history.item:  # a dict value comes as one item per key, under nested_key
                    *parents, key = item.nested_key or [item.key]
                    inner = row
                    for parent in parents:
                        inner = inner.setdefault(parent, {})
                    inner[key] = json.loads(item.value_json)
                for key, value in row.items():
                    if isinstance(value, dict) and value.get("_type") == "table-file":
                        row[key] = json.loads((folder / "files" / value["path"]).read_text())
                rows.append(row)
        runs.append((run_id, rows))
    return runs


def swanlab_offline_runs(run_dir):
    """[(run id, [(key, step, value), ...]), ...] per offline run folder of ``<run_dir>/swanlog``, oldest first;
    a scalar's value is its number, an echarts table's is its JSON file."""
    from swanlab.proto.swanlab.record.v1 import record_pb2

    runs = []
    for folder, run_id, records in _offline_runs(run_dir, "swanlog/run-*/run-*.swanlab", record_pb2.Record):
        logged = []
        for record in records:
            kind = record.WhichOneof("record_type")
            if kind == "scalar":
                logged.append((record.scalar.key, record.scalar.step, record.scalar.value.number))
            elif kind == "media":
                (item,) = record.media.value.items
                table = json.loads((folder / "media" / "echarts" / item.filename).read_text())
                logged.append((record.media.key, record.media.step, table))
        runs.append((run_id, logged))
    return runs
