"""`gpen-tune serve --mps`: the private MPS daemon's start, its environment for the server's processes, its stop,
and the one-line refusals. The real daemon needs an NVIDIA driver, which this machine has not: a small program of
the same name on PATH stands in, doing what the daemon's command line does (`-d` makes the pipe folder's control
socket; `quit` on standard input ends it)."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from test_serve_cli import invoke

from gpen_tune.serve import mps
from gpen_tune.serve.mps import CONTROL, LOG_ENV, PIPE_ENV, MpsError, PrivateMps, mps_hint, running_daemon

STAND_IN = """#!{python}
import os, pathlib, sys
calls = pathlib.Path({calls!r})
pipe = pathlib.Path(os.environ["{pipe_env}"])
if sys.argv[1:] == ["-d"]:
    if {fail}:
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    (pipe / "control").write_text("")
    with calls.open("a") as f:
        f.write(f"start {{pipe}}\\n")
else:
    said = sys.stdin.read().strip()
    (pipe / "control").unlink()
    with calls.open("a") as f:
        f.write(said + "\\n")
"""


def _stand_in(folder: Path, monkeypatch, fail: bool = False) -> Path:
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    calls = folder / "calls.txt"
    program = bin_dir / CONTROL
    program.write_text(STAND_IN.format(python=sys.executable, calls=str(calls), pipe_env=PIPE_ENV, fail=fail))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(PIPE_ENV, raising=False)
    monkeypatch.delenv(LOG_ENV, raising=False)
    monkeypatch.setattr(mps, "SYSTEM_PIPE_DIR", folder / "no-system-daemon")
    return calls


def test_start_names_the_daemon_to_this_process_and_stop_ends_it(tmp_path, monkeypatch):
    calls = _stand_in(tmp_path, monkeypatch)
    assert mps_hint(4).startswith("the 4 request processes") and "--mps" in mps_hint(4)
    daemon = PrivateMps.start()
    pipe = Path(os.environ[PIPE_ENV])
    assert pipe == daemon.folder / "pipe" and Path(os.environ[LOG_ENV]).is_dir()
    assert calls.read_text() == f"start {pipe}\n"
    assert running_daemon() == pipe and mps_hint(4) == ""        # now served: nothing to suggest
    daemon.stop()
    assert calls.read_text() == f"start {pipe}\nquit\n"
    assert not daemon.folder.exists() and PIPE_ENV not in os.environ and LOG_ENV not in os.environ


def test_a_daemon_that_will_not_start_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    _stand_in(tmp_path, monkeypatch, fail=True)
    before = set(Path(tempfile.gettempdir()).glob("gpen-mps-*"))
    with pytest.raises(MpsError, match="already running.*leave out --mps"):
        PrivateMps.start()
    assert set(Path(tempfile.gettempdir()).glob("gpen-mps-*")) == before
    assert PIPE_ENV not in os.environ


def test_without_the_control_program_the_error_says_where_it_comes_from(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MpsError, match=f"{CONTROL} is not on PATH.*NVIDIA driver"):
        PrivateMps.start()
    assert mps_hint(4) == ""                                      # nothing to suggest either


def test_serve_mps_on_the_cpu_is_one_line_naming_the_flag():
    res = invoke(["--weights", "synthetic", "--device", "cpu", "--mps"])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "--mps" in errors[0] and "cpu" in errors[0], res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU (the server must refuse)")
def test_a_server_that_cannot_start_stops_the_daemon_it_started(tmp_path, monkeypatch):
    calls = _stand_in(tmp_path, monkeypatch)
    res = invoke(["--weights", "synthetic", "--device", "auto", "--mps"])      # this machine has no CUDA GPU
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "--mps needs a CUDA GPU" in errors[0], res.output
    started, said = calls.read_text().splitlines()
    assert started.startswith("start ") and said == "quit" and not Path(started[6:]).parent.exists()
    assert PIPE_ENV not in os.environ
