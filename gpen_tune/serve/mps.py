"""`gpen-tune serve --mps`: the server's processes as clients of a private NVIDIA MPS daemon.

Why: with request processes (`--request-processes N`) every process holds a CUDA context of its own, and without
MPS the GPU time-slices between contexts: a detector's kernels and the generator's never run at once, and each
host sync waits for the other contexts' turns. Under MPS their kernels share the GPU as streams of one context
do (H100, 64 clients, 4 request processes: 1.18x the faces/s; benchmarks/RESULTS.md, "Service").

How: `nvidia-cuda-mps-control -d` with its pipe and log folders in a fresh temporary folder, named to this
process (and so to every child it spawns) by CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY. The CUDA driver
reads them when it initializes, so the daemon must start before anything in this process touches CUDA. `stop`
sends the daemon `quit` and removes the folder. Where an MPS daemon already serves this process (the variables
are set, or the system's default pipe folder has one), nothing is started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
SYSTEM_PIPE_DIR = Path("/tmp/nvidia-mps")       # the daemon's pipe folder when none is named
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
COMMAND_TIMEOUT_S = 30.0


class MpsError(RuntimeError):
    """The MPS daemon could not be started (one line, naming the fix)."""


def running_daemon() -> Path | None:
    """The pipe folder of an MPS daemon this process would already connect to, if any."""
    named = os.environ.get(PIPE_ENV)
    pipe = Path(named) if named else SYSTEM_PIPE_DIR
    return pipe if (pipe / "control").exists() else None


def control_program() -> str | None:
    """The path of `nvidia-cuda-mps-control`, if on PATH."""
    return shutil.which(CONTROL)


def mps_hint(processes: int) -> str:
    """What a user serving from several processes without MPS is told (empty where MPS is on or unavailable)."""
    if running_daemon() is not None or control_program() is None:
        return ""
    return (f"the {processes} request processes and the generator take turns on the GPU: --mps lets their kernels "
            "run at once")


@dataclass
class PrivateMps:
    """A daemon this process started; `stop` ends it (its clients must have exited)."""

    control: str
    folder: Path

    @property
    def env(self) -> dict[str, str]:
        return {PIPE_ENV: str(self.folder / "pipe"), LOG_ENV: str(self.folder / "log")}

    @classmethod
    def start(cls) -> PrivateMps:
        control = control_program()
        if control is None:
            raise MpsError(f"--mps: {CONTROL} is not on PATH (it ships with the NVIDIA driver; in a container it "
                           "comes with NVIDIA_DRIVER_CAPABILITIES=compute,utility): install it or leave out --mps")
        folder = Path(tempfile.mkdtemp(prefix="gpen-mps-"))       # short: the control socket's path is limited
        daemon = cls(control, folder)
        for path in daemon.env.values():
            Path(path).mkdir()
        try:
            done = subprocess.run([control, "-d"], env={**os.environ, **daemon.env}, capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            shutil.rmtree(folder, ignore_errors=True)
            raise MpsError(f"--mps: {CONTROL} -d did not start ({e}); leave out --mps") from None
        if done.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            said = " ".join((done.stderr or done.stdout).split())[:160]
            raise MpsError(f"--mps: {CONTROL} -d exited with {done.returncode} ({said}); leave out --mps")
        os.environ.update(daemon.env)             # this process and the processes it spawns are its clients
        return daemon

    def stop(self) -> None:
        """Tell the daemon to quit (it stops its server once the clients are gone) and remove its folder."""
        try:
            subprocess.run([self.control], input="quit\n", env={**os.environ, **self.env}, capture_output=True,
                           text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass                                   # a daemon that does not answer keeps its folder: no rmtree
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
        for key, value in self.env.items():
            if os.environ.get(key) == value:
                del os.environ[key]
