"""The weights cache: first verified download pins its sha256, later mismatches are refused, --sha256 overrides,
offline and ModelScope errors say where to put the file, and load_model resolves registry names through it.
Real HTTP on 127.0.0.1, real checkpoints in the official layout."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from conftest_weights import checkpoint_file, closed_port, jpeg_file, start_server

from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.weights import pins
from gpen_tune.weights.checkpoint import CheckpointError
from gpen_tune.weights.registry import (
    WeightsDownloadError,
    WeightsMismatchError,
    WeightsNotFoundError,
    ensure_weights,
    import_weights,
    list_weights,
    verify_file,
)

NAME = "GPEN-BFR-256"
FAST = {"progress": False, "backoff": 0.01, "retries": 1}


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def server():
    fs, httpd = start_server()
    fs.add("v1/GPEN-BFR-256.pth", data=checkpoint_file(NAME, seed=0).read_bytes())
    fs.add("v2/GPEN-BFR-256.pth", data=checkpoint_file(NAME, seed=1).read_bytes())
    fs.add("wrong/GPEN-BFR-256.pth", data=checkpoint_file(GPENConfig(32, narrow=0.25)).read_bytes())
    yield fs
    httpd.shutdown()
    httpd.server_close()



def test_first_download_is_verified_and_pinned_then_served_from_cache(server, home):
    url = server.url("v1/GPEN-BFR-256.pth")
    path = ensure_weights(NAME, url=url, **FAST)
    assert path == home / "GPEN-BFR-256.pth"
    assert path.read_bytes() == checkpoint_file(NAME, seed=0).read_bytes()
    doc = json.loads((home / "sha256-pins.json").read_text())
    assert doc["pins"]["GPEN-BFR-256.pth"]["sha256"] == sha(path)
    assert doc["pins"]["GPEN-BFR-256.pth"]["source"] == url
    assert [p.name for p in home.iterdir() if p.name.startswith(".") or p.suffix == ".part"] == []

    row = next(r for r in list_weights() if r.name == NAME)
    assert row.cached and row.size == path.stat().st_size and row.pinned_sha256 == sha(path)
    assert row.url.endswith("GPEN-BFR-256.pth") and "non-commercial" in row.licence

    server.log.clear()
    assert ensure_weights(NAME, download=False) == path
    net = load_model(NAME, model=NAME)
    assert net.weights_source == str(path)
    assert server.log == []  # no network once cached


def test_a_different_file_later_is_refused(server, home):
    ensure_weights(NAME, url=server.url("v1/GPEN-BFR-256.pth"), **FAST)
    first = sha(home / "GPEN-BFR-256.pth")
    second = sha(checkpoint_file(NAME, seed=1))

    (home / "GPEN-BFR-256.pth").unlink()
    with pytest.raises(WeightsMismatchError) as e:
        ensure_weights(NAME, url=server.url("v2/GPEN-BFR-256.pth"), **FAST)
    msg = str(e.value)
    assert first in msg and second in msg and "GPEN-BFR-256.pth" in msg
    assert f"--sha256 {second}" in msg  # how to fix
    assert not (home / "GPEN-BFR-256.pth").exists() and not (home / "GPEN-BFR-256.pth.part").exists()

    # the same file swapped in by hand: refused by ensure_weights and load_model alike
    shutil.copyfile(checkpoint_file(NAME, seed=1), home / "GPEN-BFR-256.pth")
    with pytest.raises(WeightsMismatchError, match="differs from the pinned"):
        ensure_weights(NAME, download=False)
    with pytest.raises(WeightsMismatchError):
        load_model(NAME, model=NAME)
    with pytest.raises(WeightsMismatchError):  # verify of the cached file itself
        verify_file(home / "GPEN-BFR-256.pth")
    assert verify_file(checkpoint_file(NAME, seed=1)).pin == "differs"  # a file elsewhere: reported only

    # the user accepts it explicitly: the pin moves
    assert ensure_weights(NAME, sha256=second, download=False) == home / "GPEN-BFR-256.pth"
    assert pins.get_pin("GPEN-BFR-256.pth").sha256 == second
    assert ensure_weights(NAME, download=False) == home / "GPEN-BFR-256.pth"


def test_sha256_override_fetches_the_requested_file(server, home):
    ensure_weights(NAME, url=server.url("v1/GPEN-BFR-256.pth"), **FAST)
    second = sha(checkpoint_file(NAME, seed=1))
    with pytest.raises(WeightsMismatchError, match="requested"):
        ensure_weights(NAME, sha256="ab" * 32, url=server.url("v2/GPEN-BFR-256.pth"), **FAST)
    assert sha(home / "GPEN-BFR-256.pth") != second  # the old file is untouched
    path = ensure_weights(NAME, sha256=second.upper(), url=server.url("v2/GPEN-BFR-256.pth"), **FAST)
    assert sha(path) == second and pins.get_pin("GPEN-BFR-256.pth").sha256 == second
    with pytest.raises(ValueError, match="64 hex digits"):
        ensure_weights(NAME, sha256="xyz")


def test_a_file_for_another_model_is_rejected_before_it_lands(server, home):
    with pytest.raises(WeightsDownloadError) as e:
        ensure_weights(NAME, url=server.url("wrong/GPEN-BFR-256.pth"), **FAST)
    assert "does not match GPEN size 256" in str(e.value)
    assert not (home / "GPEN-BFR-256.pth").exists()
    assert pins.get_pin("GPEN-BFR-256.pth") is None


def test_not_cached_names_the_url_and_the_exact_path(home):
    for call in (lambda: ensure_weights("GPEN-BFR-512", download=False), lambda: load_model("GPEN-BFR-512")):
        with pytest.raises(WeightsNotFoundError) as e:
            call()
        msg = str(e.value)
        assert "GPEN-BFR-512.pth" in msg and str(home / "GPEN-BFR-512.pth") in msg
        assert "https://public-vigen-video.oss-cn-shanghai.aliyuncs.com/robin/models/GPEN-BFR-512.pth" in msg


def test_offline_names_the_file_the_url_and_the_path(home):
    url = f"http://127.0.0.1:{closed_port()}/GPEN-BFR-256.pth"
    with pytest.raises(WeightsDownloadError) as e:
        ensure_weights(NAME, url=url, progress=False, retries=0)
    msg = str(e.value)
    assert "GPEN-BFR-256.pth" in msg and url in msg and f"put it at {home / 'GPEN-BFR-256.pth'}" in msg
    assert "\n" not in msg
    assert not any(home.glob("GPEN-BFR-256.pth*"))


def test_modelscope_models_say_where_and_accept_a_local_file(home):
    with pytest.raises(WeightsNotFoundError) as e:
        ensure_weights("GPEN-BFR-2048", download=False)
    msg = str(e.value)
    assert "ModelScope" in msg and "damo/cv_gpen_image-portrait-enhancement-hires" in msg
    assert "pytorch_model-2048.pt" in msg and str(home / "GPEN-BFR-2048.pth") in msg

    with pytest.raises(CheckpointError, match="does not match GPEN size 1024"):
        import_weights("GPEN-BFR-1024", checkpoint_file("GPEN-BFR-512"))
    assert not (home / "GPEN-BFR-1024.pth").exists()

    src = checkpoint_file("GPEN-BFR-1024")
    path = import_weights("GPEN-BFR-1024", src)
    assert path == home / "GPEN-BFR-1024.pth" and sha(path) == sha(src)
    assert pins.get_pin("GPEN-BFR-1024.pth").source == str(src)
    assert load_model("GPEN-BFR-1024", model="GPEN-BFR-1024").weights_source == str(path)


def test_a_hand_placed_file_is_checked_before_it_is_pinned(home):
    home.mkdir(parents=True)
    shutil.copyfile(jpeg_file(), home / "GPEN-BFR-512.pth")
    with pytest.raises(CheckpointError, match="JPEG"):
        ensure_weights("GPEN-BFR-512", download=False)
    assert pins.get_pin("GPEN-BFR-512.pth") is None

    shutil.copyfile(checkpoint_file(NAME), home / "GPEN-BFR-256.pth")
    assert ensure_weights(NAME, download=False) == home / "GPEN-BFR-256.pth"
    assert pins.get_pin("GPEN-BFR-256.pth").sha256 == sha(checkpoint_file(NAME))


def test_unreadable_pins_file_is_a_clear_error(home):
    home.mkdir(parents=True)
    (home / "sha256-pins.json").write_text("{not json")
    with pytest.raises(ValueError, match="sha256-pins.json: unreadable pins file"):
        ensure_weights(NAME, download=False)
