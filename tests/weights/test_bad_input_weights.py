"""Hostile weights: checkpoints holding NaN/inf (refused by verify, download, import and at load, never pinned),
a pinned cache file edited in place with its size and mtime put back (refused by name, by path, through a symlink
or a hard link), failed downloads over real HTTP on 127.0.0.1 (nothing written outside the download's own
`.part`, never a `.part` named after a folder), and a damaged pins file. Each: one line naming the file, exit 1."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest_weights import checkpoint_file, closed_port, start_server
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.load import load_model
from gpen_tune.weights.checkpoint import CheckpointError, read_state_dict
from gpen_tune.weights.download import DownloadError, download_into
from gpen_tune.weights.registry import WeightsMismatchError, ensure_weights

NAME = "GPEN-BFR-256"
FAST = {"progress": False, "backoff": 0.01, "retries": 1}


def poisoned(tmp_path, value: float, key: str = "generator.convs.3.conv.weight"):
    sd = torch.load(checkpoint_file(NAME), weights_only=True)
    sd[key] = sd[key].clone()
    sd[key].view(-1)[::97] = value
    path = tmp_path / f"poisoned-{value}.pth"
    torch.save(sd, path)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    fs, httpd = start_server()
    tmp = tmp_path_factory.mktemp("served")
    fs.add("good/GPEN-BFR-256.pth", data=checkpoint_file(NAME).read_bytes())
    fs.add("nan/GPEN-BFR-256.pth", data=poisoned(tmp, float("nan")).read_bytes())
    fs.add("cut/GPEN-BFR-256.pth", data=checkpoint_file(NAME).read_bytes(), truncate_first=99, range_ok=False)
    fs.add("gone/GPEN-BFR-256.pth", status=404)
    fs.add("folder/", data=b"<html>index</html>")
    yield fs
    httpd.shutdown()
    httpd.server_close()



def cli(home, *args: str):
    return CliRunner().invoke(app, list(args), env={"GPEN_TUNE_HOME": str(home)})


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def everything(root) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")} if root.exists() else set()


# --------------------------------------------------------------------------------------------------- non-finite


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_checkpoint_is_refused_by_verify_and_at_load(tmp_path, home, value):
    path = poisoned(tmp_path, value)
    one_line_error(cli(home, "weights", "verify", str(path)), str(path), "non-finite", "convs.3.conv.weight")
    one_line_error(cli(home, "weights", "verify", str(path), "--model", NAME), str(path), "non-finite")
    with pytest.raises(CheckpointError, match="non-finite") as exc:
        load_model(path, NAME)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(CheckpointError, match="non-finite"):
        read_state_dict(path)


def test_non_finite_download_is_refused_and_never_pinned(server, home):
    result = cli(home, "weights", "download", NAME, "--url", server.url("nan/GPEN-BFR-256.pth"), "--no-progress")
    one_line_error(result, "GPEN-BFR-256.pth", "non-finite")
    assert everything(home) == set()                      # no file, no .part, no pin


def test_non_finite_import_is_refused(tmp_path, home):
    path = poisoned(tmp_path, float("nan"))
    one_line_error(cli(home, "weights", "download", NAME, "--file", str(path)), str(path), "non-finite")
    assert not (home / "GPEN-BFR-256.pth").exists() and not (home / "sha256-pins.json").exists()


# ------------------------------------------------------------------------------------------- the pin, every way


def tamper_keeping_size_and_mtime(path) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        block = bytearray(f.read(8))
        block[0] ^= 0x01
        f.seek(st.st_size // 2)
        f.write(bytes(block))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_in_place_edit_keeping_size_and_mtime_is_refused_however_the_file_is_named(tmp_path, server, home):
    cached = ensure_weights(NAME, url=server.url("good/GPEN-BFR-256.pth"), **FAST)
    load_model(NAME, NAME)                                  # hashed and accepted once in this process
    load_model(cached, NAME)
    tamper_keeping_size_and_mtime(cached)
    link = tmp_path / "link.pth"
    link.symlink_to(cached)
    hard = home / "hard.pth"
    os.link(cached, hard)
    for name in (NAME, cached, str(cached), link, hard, home / "." / "GPEN-BFR-256.pth"):
        with pytest.raises(WeightsMismatchError, match="differs from the pinned") as exc:
            load_model(name, NAME)
        assert "\n" not in str(exc.value) and "GPEN-BFR-256.pth" in str(exc.value)
    for path in (cached, link):
        one_line_error(cli(home, "weights", "verify", str(path)), "differs from the pinned")
    one_line_error(cli(home, "weights", "download", NAME, "--no-progress"), str(cached), "differs from the pinned")
    copy = tmp_path / "copy.pth"                           # an ordinary file elsewhere is not the cache file
    copy.write_bytes(cached.read_bytes())
    load_model(copy, NAME)


def test_the_fix_the_message_names_works(server, home):
    cached = ensure_weights(NAME, url=server.url("good/GPEN-BFR-256.pth"), **FAST)
    good = cached.read_bytes()
    tamper_keeping_size_and_mtime(cached)
    line = one_line_error(cli(home, "weights", "verify", str(cached)), "differs from the pinned")
    pinned = json.loads((home / "sha256-pins.json").read_text())["pins"]["GPEN-BFR-256.pth"]["sha256"]
    assert f"--sha256 {pinned}" in line
    result = cli(home, "weights", "download", NAME, "--sha256", pinned, "--url", server.url("good/GPEN-BFR-256.pth"),
                 "--no-progress")
    assert result.exit_code == 0, result.output
    assert cached.read_bytes() == good
    load_model(NAME, NAME)


def test_damaged_pins_file_is_one_line(server, home):
    ensure_weights(NAME, url=server.url("good/GPEN-BFR-256.pth"), **FAST)
    pins = home / "sha256-pins.json"
    doc = json.loads(pins.read_text())
    del doc["pins"]["GPEN-BFR-256.pth"]["sha256"]
    pins.write_text(json.dumps(doc))
    one_line_error(cli(home, "weights", "list"), "sha256-pins.json", "GPEN-BFR-256.pth")
    with pytest.raises(ValueError, match="damaged pin"):
        load_model(NAME, NAME)


# ------------------------------------------------------------------------------------------------ failed downloads


@pytest.mark.parametrize("route, needle", [("gone/GPEN-BFR-256.pth", "404"), ("cut/GPEN-BFR-256.pth", "truncated")])
def test_failed_download_leaves_nothing_outside_its_part(server, home, route, needle):
    result = cli(home, "weights", "download", NAME, "--url", server.url(route), "--no-progress", "--retries", "1")
    one_line_error(result, needle, "GPEN-BFR-256.pth")
    assert everything(home) <= {"GPEN-BFR-256.pth.part"}
    if needle == "404":
        assert everything(home) == set()


def test_offline_download_is_one_line(home):
    url = f"http://127.0.0.1:{closed_port()}/GPEN-BFR-256.pth"
    one_line_error(cli(home, "weights", "download", NAME, "--url", url, "--no-progress", "--retries", "0"), url)
    assert everything(home) == set()


def test_download_into_a_folder_url_writes_nothing(server, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    for url, name in ((server.url("folder/"), None), (server.url("good/GPEN-BFR-256.pth"), "../escape.pth"),
                      (server.url("good/GPEN-BFR-256.pth"), ".."), (server.url("good/GPEN-BFR-256.pth"), "")):
        with pytest.raises(DownloadError) as exc:
            download_into(cache / "detectors", url, name, progress=False, retries=0)
        assert "\n" not in str(exc.value)
    assert everything(tmp_path) == {"cache"}                  # no detectors.part, no escape.pth anywhere


def test_download_into_names_the_file_and_caches_it(server, tmp_path):
    folder = tmp_path / "cache" / "detectors"
    got = download_into(folder, server.url("good/GPEN-BFR-256.pth"), progress=False)
    assert got == folder / "GPEN-BFR-256.pth" and got.read_bytes() == checkpoint_file(NAME).read_bytes()
    hits = len(server.requests("good/GPEN-BFR-256.pth"))
    assert download_into(folder, server.url("good/GPEN-BFR-256.pth"), progress=False) == got
    assert len(server.requests("good/GPEN-BFR-256.pth")) == hits    # cached: no second request


def test_cache_root_that_is_a_file_is_one_line(server, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    one_line_error(cli(blocker / "sub", "weights", "download", NAME, "--url", server.url("good/GPEN-BFR-256.pth"),
                       "--no-progress"), "cache")
    assert blocker.read_text() == "not a folder"
