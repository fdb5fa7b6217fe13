"""`gpen-tune weights list | download | verify | path` through Typer's CliRunner, with GPEN_TUNE_HOME in tmp_path
and downloads from a real HTTP server on 127.0.0.1 (`--url`)."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest_weights import checkpoint_file, jpeg_file, start_server
from typer.testing import CliRunner

from gpen_tune.cli import app

NAME = "GPEN-BFR-256"


@pytest.fixture(scope="module")
def server():
    fs, httpd = start_server()
    fs.add("m/GPEN-BFR-256.pth", data=checkpoint_file(NAME).read_bytes())
    yield fs
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def run(tmp_path):
    home = tmp_path / "home"

    def invoke(*args: str):
        return CliRunner().invoke(app, list(args), env={"GPEN_TUNE_HOME": str(home)})

    invoke.home = home
    return invoke


def one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_list_table_and_json(run):
    r = run("weights", "list")
    assert r.exit_code == 0, r.output
    for name in ("GPEN-BFR-256", "GPEN-BFR-512", "GPEN-BFR-1024", "GPEN-BFR-2048"):
        assert name in r.stdout
    assert "ModelScope" in r.stdout and "non-commercial" in r.stdout

    r = run("weights", "list", "--json")
    doc = json.loads(r.stdout)
    assert doc["cache_dir"] == str(run.home)
    rows = {m["name"]: m for m in doc["models"]}
    assert set(rows) == {"GPEN-BFR-256", "GPEN-BFR-512", "GPEN-BFR-1024", "GPEN-BFR-2048"}
    assert rows[NAME]["cached"] is False and rows[NAME]["pinned_sha256"] is None
    assert rows["GPEN-BFR-2048"]["config"] == "size 2048, channel_multiplier 2, narrow 1"
    assert {"file", "size", "task", "url", "source_note", "licence", "official_sha256"} <= set(rows[NAME])


def test_download_then_list_path_and_cached_redownload(run, server):
    url = server.url("m/GPEN-BFR-256.pth")
    r = run("weights", "download", NAME, "--url", url, "--no-progress")
    assert r.exit_code == 0, r.output
    dest = run.home / "GPEN-BFR-256.pth"
    assert r.stdout.strip() == str(dest) and dest.is_file()
    digest = hashlib.sha256(dest.read_bytes()).hexdigest()
    assert digest in r.stderr  # the pinned hash is shown

    row = next(m for m in json.loads(run("weights", "list", "--json").stdout)["models"] if m["name"] == NAME)
    assert row["cached"] is True and row["pinned_sha256"] == digest and row["size"] == dest.stat().st_size

    assert run("weights", "path").stdout.strip() == str(run.home)
    assert run("weights", "path", NAME).stdout.strip() == str(dest)

    server.log.clear()
    r = run("weights", "download", NAME)  # cached and pinned: no network at all
    assert r.exit_code == 0 and r.stdout.strip() == str(dest) and server.log == []

    r = run("weights", "download", NAME, "--sha256", "0" * 64, "--url", url, "--no-progress")
    msg = one_line_error(r)
    assert "0" * 64 in msg and digest in msg


def test_download_errors_are_one_line(run, server):
    msg = one_line_error(run("weights", "download", NAME, "--url", server.url("nothing-here.pth"), "--no-progress"))
    assert "HTTP 404" in msg and str(run.home / "GPEN-BFR-256.pth") in msg
    assert not (run.home / "GPEN-BFR-256.pth").exists()

    assert "known models" in one_line_error(run("weights", "download", "GPEN-BFR-999"))
    assert "64 hex digits" in one_line_error(run("weights", "download", NAME, "--sha256", "abc"))
    assert "exclude each other" in one_line_error(run("weights", "download", NAME, "--file", "x", "--url", "y"))


def test_download_from_a_local_file_for_modelscope_models(run):
    src = checkpoint_file("GPEN-BFR-1024")
    r = run("weights", "download", "GPEN-BFR-1024", "--file", str(src))
    assert r.exit_code == 0, r.output
    assert (run.home / "GPEN-BFR-1024.pth").read_bytes()[:64] == src.read_bytes()[:64]


def test_verify_infers_the_model(run):
    path = checkpoint_file(NAME)
    r = run("weights", "verify", str(path))
    assert r.exit_code == 0, r.output
    assert "GPEN-BFR-256" in r.stdout and "18,879,010" in r.stdout and "144" in r.stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() in r.stdout

    doc = json.loads(run("weights", "verify", str(path), "--json").stdout)
    assert doc["model"] == NAME and doc["params"] == 18_879_010 and doc["config"]["size"] == 256


def test_verify_errors_are_one_line(run, tmp_path):
    msg = one_line_error(run("weights", "verify", str(checkpoint_file(NAME)), "--model", "GPEN-BFR-512"))
    assert "19 missing keys" in msg and "ecd7.*" in msg
    assert "JPEG" in one_line_error(run("weights", "verify", str(jpeg_file())))
    assert "no such file" in one_line_error(run("weights", "verify", str(tmp_path / "absent.pth")))
    truncated = tmp_path / "half.pth"
    truncated.write_bytes(checkpoint_file(NAME).read_bytes()[:100_000])
    assert "truncated" in one_line_error(run("weights", "verify", str(truncated)))
