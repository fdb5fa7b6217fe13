"""`doctor`: the documented JSON keys, the cache listing with pins, the no-GPU warning, and robustness when an
optional part is missing or broken."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from gpen_tune import doctor
from gpen_tune.cli import app
from gpen_tune.weights import pins


def test_report_has_the_documented_keys(home):
    r = doctor.diagnose()
    assert set(doctor.KEYS) == set(r)
    json.dumps(r)  # JSON-ready
    assert r["torch"]["version"] == torch.__version__
    assert r["cuda"]["available"] == torch.cuda.is_available()
    assert {"inductor", "cxx", "triton", "cpu", "cuda", "note"} <= set(r["compile"])
    assert set(doctor.OPTIONAL) == set(r["optional"])
    for part in r["optional"].values():
        assert {"installed", "version", "importable", "error", "purpose"} <= set(part)
    assert r["optional"]["cv2"]["importable"] is True  # light parts are really imported
    assert "basicsr" in r["not_used"] and "deliberately not used" in r["not_used"]["basicsr"]["reason"]
    assert r["cache"]["dir"] == str(home) and r["cache"]["env"] == str(home) and r["cache"]["exists"] is False
    shm = r["shared_memory"]                             # what serve's request processes pass faces through
    assert shm["dir"] == "/dev/shm" and shm["serve_needs_bytes"] == 2 * 256 * 512 * 512 * 3
    assert shm["free_bytes"] > 0 and shm["enough_for_serve"] == (shm["free_bytes"] >= shm["serve_needs_bytes"])
    assert set(r["cuda_mps"]) == {"control", "daemon"}      # what `serve --mps` needs, and a daemon already there
    if not torch.cuda.is_available():
        assert r["gpus"] == [] and r["warnings"][0] == doctor.NO_GPU_WARNING
        assert "seconds per face" in r["warnings"][0]
    else:
        assert all(g["total_bytes"] > 0 for g in r["gpus"])


def test_cache_listing_shows_files_pins_and_partial_downloads(home):
    home.mkdir()
    (home / "GPEN-BFR-256.pth").write_bytes(b"x" * 1000)
    (home / "GPEN-BFR-512.pth.part").write_bytes(b"y" * 10)
    pins.set_pin("GPEN-BFR-256.pth", "ab" * 32, 1000, source="test")
    cache = doctor.diagnose()["cache"]
    assert cache["exists"] is True
    assert cache["files"] == [{"name": "GPEN-BFR-256.pth", "bytes": 1000, "pinned_sha256": "ab" * 32}]
    assert cache["partial"] == [{"name": "GPEN-BFR-512.pth.part", "bytes": 10}]
    assert cache["pins"] == {"GPEN-BFR-256.pth": "ab" * 32}


def test_missing_and_broken_optional_parts_do_not_fail(home, tmp_path, monkeypatch):
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "gpen_tune_broken_part.py").write_text("raise ImportError('needs libfoo.so')\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setitem(doctor.OPTIONAL, "gpen_tune_absent_part", ("gpen-tune-absent-part", "test", False))
    monkeypatch.setitem(doctor.OPTIONAL, "gpen_tune_broken_part", ("gpen-tune-broken-part", "test", False))
    r = doctor.diagnose()
    assert r["optional"]["gpen_tune_absent_part"] == {"installed": False, "version": None, "importable": False,
                                                     "error": None, "purpose": "test"}
    broken = r["optional"]["gpen_tune_broken_part"]
    assert broken["installed"] is True and broken["importable"] is False and "libfoo" in broken["error"]


def test_cli_json_and_table(home):
    r = CliRunner().invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    assert set(doctor.KEYS) == set(json.loads(r.stdout))

    r = CliRunner().invoke(app, ["doctor"])
    assert r.exit_code == 0, r.output
    assert torch.__version__ in r.stdout and "cache dir" in r.stdout and "basicsr" in r.stdout
    if not torch.cuda.is_available():
        assert "WARNING" in r.stderr and "seconds per face" in r.stderr
