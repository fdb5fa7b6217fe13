"""Progress per test file when the suite runs in worker processes (pytest-xdist): one line as each file finishes,
with its counts, its seconds and how far the run is, instead of xdist's bare dots (a serial run already prints a
line per file). Failures still print in full at the end. conftest.py registers it in the controlling process."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


RANK = {"passed": 0, "skipped": 1, "failed": 2}


class FileProgress:
    """A pytest plugin: counts each test's outcome (its worst phase), prints a file's line when its last test is
    reported, and keeps the per-test letters off the console."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.expected: Counter[str] = Counter()
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.seconds: dict[str, float] = defaultdict(float)
        self.worst: dict[str, str] = {}
        self.files_done = 0
        self.started = time.monotonic()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        if not self.expected:                      # every worker collects the same tests (xdist checks that)
            self.expected.update(_file_of(n) for n in ids)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport):
        """No letter per test: its file's line counts it (failures print in full at the end)."""
        if hasattr(report, "wasxfail"):
            return None
        if report.failed:
            return ("failed", "", "FAILED") if report.when == "call" else ("error", "", "ERROR")
        if report.when == "call" or report.skipped:
            return report.outcome, "", report.outcome.upper()
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        before = self.worst.get(report.nodeid, "passed")
        self.worst[report.nodeid] = max(before, report.outcome, key=RANK.__getitem__)
        path = _file_of(report.nodeid)
        self.seconds[path] += report.duration
        if report.when != "teardown":
            return
        self.outcomes[path][self.worst.pop(report.nodeid)] += 1
        if sum(self.outcomes[path].values()) == self.expected.get(path, -1):
            self.files_done += 1
            counts = ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes[path].items()))
            elapsed = time.monotonic() - self.started
            line = (f"{path:<58} {counts:<28} {self.seconds[path]:6.1f} s   "
                    f"[{self.files_done}/{len(self.expected)} files, {elapsed / 60:4.1f} min]")
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                terminal.write_line(line)


def in_workers(config: pytest.Config) -> bool:
    """This is the controlling process of a run spread over worker processes."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
