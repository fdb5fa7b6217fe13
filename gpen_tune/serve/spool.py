"""`JobSpool`: the jobs' folder. One sub-folder per job holds its upload, its `job.json` (written atomically) and
its result; the spool has a size quota and finished jobs expire. A restarted server finds its spool and queues
again every job that was queued or running when it stopped (`recover`), saying so in the job's note: none is
lost silently.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FINISHED = ("done", "failed", "cancelled")


@dataclass
class JobRecord:
    id: str
    state: str                          # queued | running | done | failed | cancelled
    input_name: str
    input_ext: str
    options: dict[str, Any]
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    progress: float = 0.0               # 0..1
    faces: int | None = None
    result: str | None = None           # file name inside the job's folder
    error: str | None = None
    note: str | None = None
    kind: str = "image"                 # image | video

    def public(self) -> dict[str, Any]:
        """What `GET /v1/jobs/{id}` shows."""
        data = asdict(self)
        data.pop("input_ext")
        data["result_ready"] = self.state == "done"
        return data


class SpoolFull(RuntimeError):
    """A new job would take the spool over its quota."""


class JobSpool:
    def __init__(self, root: Path, quota_bytes: int, expiry_s: float):
        self.root = Path(root)
        self.quota_bytes = quota_bytes
        self.expiry_s = expiry_s
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)

    def folder(self, job_id: str) -> Path:
        if not job_id.isalnum():                 # ids are uuid4 hex: nothing else names a folder
            raise KeyError(job_id)
        return self.root / job_id

    def input_path(self, record: JobRecord) -> Path:
        return self.folder(record.id) / f"input.{record.input_ext}"

    def create(self, data: bytes, name: str, ext: str, options: dict[str, Any], kind: str = "image") -> JobRecord:
        """A queued job with its upload on disk; SpoolFull when the quota would be passed."""
        self.expire()
        with self._lock:
            if self.used_bytes() + len(data) > self.quota_bytes:
                raise SpoolFull(f"the job spool is full (its quota is {self.quota_bytes:,} bytes): retry when jobs "
                                "have expired, or delete finished ones")
            record = JobRecord(uuid.uuid4().hex, "queued", name, ext, options, kind=kind)
            folder = self.folder(record.id)
            folder.mkdir()
            _atomic_write(self.input_path(record), data)
            self.save(record)
        return record

    def save(self, record: JobRecord) -> None:
        record.updated = time.time()
        _atomic_write(self.folder(record.id) / "job.json", json.dumps(asdict(record)).encode())

    def get(self, job_id: str) -> JobRecord | None:
        try:
            path = self.folder(job_id) / "job.json"
            return JobRecord(**json.loads(path.read_text()))
        except (KeyError, OSError, ValueError, TypeError):
            return None

    def delete(self, job_id: str) -> None:
        shutil.rmtree(self.folder(job_id), ignore_errors=True)

    def records(self) -> list[JobRecord]:
        found = [self.get(p.name) for p in self.root.iterdir() if p.is_dir()] if self.root.is_dir() else []
        return sorted((r for r in found if r is not None), key=lambda r: r.created)

    def recover(self) -> list[JobRecord]:
        """Jobs left queued or running by an earlier server, queued again (oldest first)."""
        again = []
        for record in self.records():
            if record.state in ("queued", "running"):
                was = record.state
                record.state, record.progress = "queued", 0.0
                record.note = f"queued again after a server restart (it was {was})"
                self.save(record)
                again.append(record)
        return again

    def expire(self) -> int:
        """Remove finished jobs older than the expiry; how many went."""
        cutoff = time.time() - self.expiry_s
        gone = 0
        for record in self.records():
            if record.state in FINISHED and record.updated < cutoff:
                self.delete(record.id)
                gone += 1
        return gone

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
