"""The downloader against a real HTTP server on 127.0.0.1: progress, 404/403, 5xx retry, truncation, Range resume,
clean restart, sha256 refusal, atomic replace."""

from __future__ import annotations

import hashlib
import io
import os

import pytest
from conftest_weights import closed_port, start_server
from rich.console import Console

from gpen_tune.weights.download import ChecksumError, DownloadError, download, download_file

PAYLOAD = os.urandom(3 * (1 << 20) + 12345)  # several 1 MiB chunks plus a ragged tail
SHA = hashlib.sha256(PAYLOAD).hexdigest()
FAST = {"backoff": 0.01, "progress": False, "timeout": 10.0}


@pytest.fixture(scope="module")
def server():
    fs, httpd = start_server()
    yield fs
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def fresh(server):
    """The server with an empty request log and routes."""
    server.routes.clear()
    server.log.clear()
    return server


def test_success_with_progress_bar(fresh, tmp_path):
    url = fresh.add("weights/file.bin", data=PAYLOAD)
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=120)
    dest = tmp_path / "sub" / "file.bin"
    got = download_file(url, dest, sha256=SHA.upper(), progress=True, console=console)
    assert got.path == dest and got.sha256 == SHA and got.size == len(PAYLOAD)
    assert dest.read_bytes() == PAYLOAD
    assert not dest.with_name("file.bin.part").exists()
    shown = sink.getvalue()
    assert "file.bin" in shown
    assert f"{len(PAYLOAD) / 1e6:.1f}" in shown  # DownloadColumn shows the byte total (decimal MB)
    assert fresh.requests("weights/file.bin") == [None]


def test_public_download_returns_dest(fresh, tmp_path):
    url = fresh.add("a.bin", data=b"hello world")
    dest = tmp_path / "a.bin"
    assert download(url, dest, **FAST) == dest
    assert dest.read_bytes() == b"hello world"


@pytest.mark.parametrize("status", [404, 403])
def test_client_errors_fail_at_once_without_retry(fresh, tmp_path, status):
    url = fresh.add("gone.bin", status=status)
    dest = tmp_path / "gone.bin"
    with pytest.raises(DownloadError) as e:
        download(url, dest, retries=3, **FAST)
    msg = str(e.value)
    assert f"HTTP {status}" in msg and url in msg and str(dest) in msg and "\n" not in msg
    assert len(fresh.requests("gone.bin")) == 1  # no retry
    assert not dest.exists() and not dest.with_name("gone.bin.part").exists()


def test_server_errors_are_retried_then_succeed(fresh, tmp_path):
    url = fresh.add("flaky.bin", data=PAYLOAD, fail_first=2)
    dest = tmp_path / "flaky.bin"
    download(url, dest, sha256=SHA, retries=3, **FAST)
    assert dest.read_bytes() == PAYLOAD
    assert len(fresh.requests("flaky.bin")) == 3


def test_server_errors_give_up_after_retries(fresh, tmp_path):
    url = fresh.add("down.bin", data=PAYLOAD, fail_first=100)
    dest = tmp_path / "down.bin"
    with pytest.raises(DownloadError, match="after 3 attempts.*HTTP 500"):
        download(url, dest, retries=2, **FAST)
    assert len(fresh.requests("down.bin")) == 3
    assert not dest.exists()


def test_truncated_transfer_resumes_with_range(fresh, tmp_path):
    url = fresh.add("trunc.bin", data=PAYLOAD, truncate_first=1)
    dest = tmp_path / "trunc.bin"
    got = download_file(url, dest, sha256=SHA, retries=2, **FAST)
    assert dest.read_bytes() == PAYLOAD and got.sha256 == SHA
    ranges = fresh.requests("trunc.bin")
    assert ranges == [None, f"bytes={len(PAYLOAD) // 2}-"]  # the second request asked only for the rest


def test_truncated_transfer_restarts_cleanly_without_range_support(fresh, tmp_path):
    url = fresh.add("norange.bin", data=PAYLOAD, truncate_first=1, range_ok=False)
    dest = tmp_path / "norange.bin"
    download(url, dest, sha256=SHA, retries=2, **FAST)
    assert dest.read_bytes() == PAYLOAD  # the server ignored Range and sent 200: we started over, no duplication
    assert len(fresh.requests("norange.bin")) == 2


def test_persistent_truncation_is_a_clean_error_and_a_later_run_resumes(fresh, tmp_path):
    url = fresh.add("cut.bin", data=PAYLOAD, truncate_first=100, range_ok=False)
    dest = tmp_path / "cut.bin"
    part = tmp_path / "cut.bin.part"
    with pytest.raises(DownloadError, match="truncated transfer") as e:
        download(url, dest, retries=1, **FAST)
    assert "to resume" in str(e.value)
    assert not dest.exists()  # never a partial file at dest
    assert part.stat().st_size == len(PAYLOAD) // 2

    good = fresh.add("cut.bin", data=PAYLOAD)  # the server recovers and honours Range
    download(good, dest, sha256=SHA, **FAST)
    assert dest.read_bytes() == PAYLOAD and not part.exists()
    assert fresh.requests("cut.bin")[-1] == f"bytes={len(PAYLOAD) // 2}-"


def test_oversized_partial_file_gets_416_and_restarts(fresh, tmp_path):
    url = fresh.add("small.bin", data=b"0123456789")
    dest = tmp_path / "small.bin"
    (tmp_path / "small.bin.part").write_bytes(b"x" * 50)  # stale leftover longer than the file
    download(url, dest, retries=0, **FAST)  # the restart does not use up a retry
    assert dest.read_bytes() == b"0123456789"
    assert fresh.requests("small.bin") == ["bytes=50-", None]


def test_hash_mismatch_is_refused_and_keeps_the_old_file(fresh, tmp_path):
    url = fresh.add("evil.bin", data=PAYLOAD)
    dest = tmp_path / "evil.bin"
    dest.write_bytes(b"previous good file")
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as e:
        download(url, dest, sha256=wrong, **FAST)
    assert e.value.expected == wrong and e.value.got == SHA
    assert wrong in str(e.value) and SHA in str(e.value) and url in str(e.value)
    assert dest.read_bytes() == b"previous good file"  # untouched: nothing replaced it
    assert not (tmp_path / "evil.bin.part").exists()

    dest.unlink()
    with pytest.raises(ChecksumError):
        download(url, dest, sha256=wrong, **FAST)
    assert not dest.exists()


def test_validate_hook_rejects_before_the_file_lands(fresh, tmp_path):
    url = fresh.add("bad.bin", data=b"not a checkpoint")

    def reject(p):
        assert p.name.endswith(".part") and p.read_bytes() == b"not a checkpoint"
        raise ValueError("wrong keys")

    dest = tmp_path / "bad.bin"
    with pytest.raises(DownloadError, match="rejected \\(wrong keys\\)"):
        download(url, dest, validate=reject, **FAST)
    assert not dest.exists() and not (tmp_path / "bad.bin.part").exists()


def test_timeout_is_reported(fresh, tmp_path):
    url = fresh.add("slow.bin", data=b"late", delay=1.5)
    with pytest.raises(DownloadError, match="timed out"):
        download(url, tmp_path / "slow.bin", retries=0, backoff=0.01, progress=False, timeout=0.3)


def test_connection_refused_is_retried_then_reported(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/x.bin"
    with pytest.raises(DownloadError, match="after 2 attempts.*connection failed") as e:
        download(url, tmp_path / "x.bin", retries=1, **FAST)
    assert url in str(e.value)


def test_downloads_into_one_folder_are_serialised_across_processes(fresh, tmp_path):
    import fcntl
    import threading

    url = fresh.add("locked.bin", data=PAYLOAD)
    dest = tmp_path / "locked.bin"
    fd = os.open(tmp_path, os.O_RDONLY)  # what another gpen-tune process holds while it downloads here
    fcntl.flock(fd, fcntl.LOCK_EX)
    worker = threading.Thread(target=download, args=(url, dest), kwargs={"sha256": SHA, **FAST})
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and fresh.requests("locked.bin") == []  # waiting, not writing
    os.close(fd)
    worker.join(10)
    assert not worker.is_alive() and dest.read_bytes() == PAYLOAD


def test_a_file_already_in_place_with_the_right_hash_is_not_fetched_again(fresh, tmp_path):
    url = fresh.add("here.bin", data=PAYLOAD)
    dest = tmp_path / "here.bin"
    dest.write_bytes(PAYLOAD)
    assert download_file(url, dest, sha256=SHA, **FAST).size == len(PAYLOAD)
    assert fresh.requests("here.bin") == []
