"""Hostile checkouts for `gpen-tune apply-patches`: manifests naming files outside the checkout, symlinked state and
source folders, symlinked or non-UTF-8 files, a folder where a file goes, a failure at every N-th filesystem change
(once, or from then on as if the folder turned read-only, or as a crash), and two applies racing as real processes.

Each case asserts: exit code 1 with one `error:` line naming the file (no traceback), the checkout exactly as
before (or exactly patched), nothing written outside it, and that a later apply or --revert recovers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_patch_engine import cli, copy_checkout, snapshot

from gpen_tune.patcher import FileOps, PatchError, locked_checkout, plan_apply, plan_revert, status
from gpen_tune.patcher.engine import MANIFEST, PRISTINE
from gpen_tune.patcher.lock import checkout_lock

REPO = Path(__file__).resolve().parents[2]
FACE_CROP_ONLY = ("face-crop",)


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under root, links not followed: files with bytes and mode, folders, links with their target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", p.read_bytes(), p.stat().st_mode & 0o777)
    return out


def sources(entries: dict[str, tuple]) -> dict[str, tuple]:
    return {k: v for k, v in entries.items() if not k.startswith(".gpen_tune")}


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def world(tmp_path) -> tuple[Path, Path]:
    """(checkout, outside): a fixture checkout and a sibling folder with a file that must survive everything."""
    checkout = copy_checkout("fixture", tmp_path / "GPEN")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    return checkout, outside


# ------------------------------------------------------------------------------------------------ manifest paths


@pytest.mark.parametrize("section", ["files", "added"])
@pytest.mark.parametrize("entry", ["../outside/victim.txt", "ABSOLUTE", "face_model/../../outside/victim.txt",
                                   "face_model//face_gan.py", "./demo.py", "README.md"])
def test_manifest_entries_outside_the_patch_set_are_refused(world, section, entry):
    import json

    checkout, outside = world
    assert cli(str(checkout), "--only", "face-crop").exit_code == 0
    entry = str(outside / "victim.txt") if entry == "ABSOLUTE" else entry
    doc = json.loads((checkout / MANIFEST).read_text())
    doc[section][entry] = {"pristine_sha256": "0" * 64, "patched_sha256": "0" * 64}
    (checkout / MANIFEST).write_text(json.dumps(doc))
    before, around = tree(checkout), tree(outside)
    for args in (("--revert",), ("--status",), ()):
        line = one_line_error(cli(str(checkout), *args), "manifest.json")
        assert repr(entry) in line
    assert tree(checkout) == before and tree(outside) == around


@pytest.mark.parametrize("damage", [
    lambda doc: doc["files"].update({"face_enhancement.py": {}}),               # an entry without its hashes
    lambda doc: doc["files"].update({"face_enhancement.py": {"pristine_sha256": 5, "patched_sha256": "x"}}),
    lambda doc: doc.update({"files": ["face_enhancement.py"]}),
    lambda doc: doc.update({"patches": ["face-crop", "rm -rf"]}),
    lambda doc: doc.pop("added"),
])
def test_damaged_manifest_is_one_line(world, damage):
    import json

    checkout, _ = world
    assert cli(str(checkout), "--only", "face-crop").exit_code == 0
    doc = json.loads((checkout / MANIFEST).read_text())
    damage(doc)
    (checkout / MANIFEST).write_text(json.dumps(doc))
    before = tree(checkout)
    one_line_error(cli(str(checkout), "--revert"), "manifest.json")
    assert tree(checkout) == before


def test_manifest_that_is_not_utf8_or_a_folder(world):
    checkout, _ = world
    (checkout / ".gpen_tune").mkdir()
    (checkout / MANIFEST).write_bytes(b"\xff\xfe{")
    one_line_error(cli(str(checkout), "--revert"), "manifest.json", "unreadable manifest")
    (checkout / MANIFEST).unlink()
    (checkout / MANIFEST).mkdir()
    one_line_error(cli(str(checkout)), "manifest.json", "directory")


# ------------------------------------------------------------------------------------------------------ symlinks


def test_symlinked_state_folder_pointing_outside_is_refused(world):
    checkout, outside = world
    (checkout / ".gpen_tune").symlink_to(outside, target_is_directory=True)
    before, around = tree(checkout), tree(outside)
    for args in ((), ("--revert",), ("--status",), ("--dry-run",)):
        one_line_error(cli(str(checkout), *args), ".gpen_tune", "symlink")
    assert tree(checkout) == before and tree(outside) == around


def test_symlinked_state_folder_after_apply_is_refused(world):
    checkout, outside = world
    assert cli(str(checkout), "--only", "face-crop").exit_code == 0
    os.rename(checkout / ".gpen_tune", outside / "state")
    (checkout / ".gpen_tune").symlink_to(outside / "state", target_is_directory=True)
    before, around = tree(checkout), tree(outside)
    one_line_error(cli(str(checkout), "--revert"), ".gpen_tune", "symlink")
    assert tree(checkout) == before and tree(outside) == around


def test_symlinked_source_folder_pointing_outside_is_refused(world):
    checkout, outside = world
    os.rename(checkout / "face_model", outside / "face_model")
    (checkout / "face_model").symlink_to(outside / "face_model", target_is_directory=True)
    before, around = tree(checkout), tree(outside)
    one_line_error(cli(str(checkout)), "face_model", "symlink")
    assert tree(checkout) == before and tree(outside) == around


@pytest.mark.parametrize("rel", ["face_model/face_gan.py", "face_enhancement.py", "face_parse/face_parsing.py"])
def test_symlinked_source_file_is_refused_up_front(world, rel):
    checkout, outside = world
    (outside / "real.py").write_bytes((checkout / rel).read_bytes())
    (checkout / rel).unlink()
    (checkout / rel).symlink_to(outside / "real.py")
    before, around = tree(checkout), tree(outside)
    one_line_error(cli(str(checkout)), rel, "symlink")
    assert tree(checkout) == before and tree(outside) == around   # the link is still a link, its target untouched


def test_symlinked_pristine_copy_is_refused_by_revert(world):
    checkout, outside = world
    assert cli(str(checkout), "--only", "face-crop").exit_code == 0
    copy = checkout / PRISTINE / "face_enhancement.py"
    (outside / "victim.py").write_bytes(copy.read_bytes())
    copy.unlink()
    copy.symlink_to(outside / "victim.py")
    before, around = tree(checkout), tree(outside)
    for args in (("--revert",), ()):
        one_line_error(cli(str(checkout), *args), "pristine/face_enhancement.py", "symlink")
    assert tree(checkout) == before and tree(outside) == around


def test_symlinked_added_file_is_refused(world):
    checkout, outside = world
    (checkout / "face_model/gpen_tune_runtime.py").symlink_to(outside / "victim.txt")
    around = tree(outside)
    one_line_error(cli(str(checkout)), "gpen_tune_runtime.py", "symlink")
    assert tree(outside) == around


# ---------------------------------------------------------------------------------------------- wrong file types


def test_folder_where_the_runtime_file_goes(world):
    checkout, _ = world
    (checkout / "face_model/gpen_tune_runtime.py").mkdir()
    before = tree(checkout)
    for args in ((), ("--dry-run",)):
        one_line_error(cli(str(checkout), *args), "face_model/gpen_tune_runtime.py", "directory")
    assert tree(checkout) == before


def test_folder_where_an_upstream_file_is(world):
    checkout, _ = world
    (checkout / "face_model/face_gan.py").unlink()
    (checkout / "face_model/face_gan.py").mkdir()
    before = tree(checkout)
    one_line_error(cli(str(checkout)), "face_model/face_gan.py", "directory")
    assert tree(checkout) == before


def test_fifo_where_an_upstream_file_is(world):
    checkout, _ = world
    (checkout / "align_faces.py").unlink()
    os.mkfifo(checkout / "align_faces.py")
    one_line_error(cli(str(checkout)), "align_faces.py", "not a regular file")


@pytest.mark.parametrize("rel, commands", [("face_model/face_gan.py", ((), ("--dry-run",), ("--status",))),
                                           ("demo.py", ((), ("--dry-run",)))])   # status does not parse demo.py
def test_non_utf8_source_is_one_line(world, rel, commands):
    checkout, _ = world
    path = checkout / rel
    path.write_bytes(path.read_bytes() + b"\n# caf\xe9 \xff\n")
    before = tree(checkout)
    for args in commands:
        one_line_error(cli(str(checkout), *args), rel, "UTF-8")
    assert tree(checkout) == before


def test_unknown_coding_declaration_is_one_line(world):
    checkout, _ = world
    path = checkout / "face_enhancement.py"
    path.write_bytes(b"# -*- coding: klingon -*-\n" + path.read_bytes())
    one_line_error(cli(str(checkout)), "face_enhancement.py", "klingon")


def test_latin1_declared_source_round_trips(world):
    checkout, _ = world
    path = checkout / "face_enhancement.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + path.read_bytes())
    original = tree(checkout)
    assert cli(str(checkout), "--dry-run").exit_code == 0
    assert cli(str(checkout)).exit_code == 0
    assert cli(str(checkout), "--revert").exit_code == 0
    assert tree(checkout) == original


# ------------------------------------------------------------------------------------ failures at every N-th step


class Counting(FileOps):
    def __init__(self) -> None:
        self.steps: list[tuple[str, Path]] = []

    def before(self, op, path):
        self.steps.append((op, path))


class FailOnce(FileOps):
    """The n-th change (from 0) raises OSError; every other one works."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, -1

    def before(self, op, path):
        self.i += 1
        if self.i == self.n:
            raise OSError(5, "injected I/O error", str(path))


class ReadOnlyFrom(FileOps):
    """From the n-th change on, every change fails as if the whole checkout had turned read-only."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, -1

    def before(self, op, path):
        self.i += 1
        if self.i >= self.n:
            raise OSError(30, "Read-only file system", str(path))


class CrashAt(FileOps):
    """The n-th change never happens: the process 'dies' there (nothing in the transaction catches this)."""

    class Crash(BaseException):
        pass

    def __init__(self, n: int) -> None:
        self.n, self.i = n, -1

    def before(self, op, path):
        self.i += 1
        if self.i == self.n:
            raise self.Crash()


def steps_of(plan) -> tuple[int, int]:
    """(number of filesystem changes, index of the commit point: the journal's deletion) of committing `plan`."""
    counter = Counting()
    plan.commit(ops=counter)
    commit_point = counter.steps.index(next(s for s in counter.steps if s[0] == "unlink"
                                            and s[1].name == "journal.json"))
    return len(counter.steps), commit_point


SIX = ("lazy-detector", "compile", "amp", "checkpoint", "face-crop", "cuda-graph")


def scenarios(checkout: Path):
    """(name, set-up, plan maker, undo maker): fresh apply, apply on top of face-crop, partial and full revert."""
    def nothing():
        pass

    def face_crop():
        plan_apply(checkout, FACE_CROP_ONLY).commit()

    def everything():
        plan_apply(checkout).commit()

    return [("apply", nothing, lambda: plan_apply(checkout), lambda: plan_revert(checkout)),
            ("apply-on-top", face_crop, lambda: plan_apply(checkout),
             lambda: plan_revert(checkout, tuple(n for n in SIX if n != "face-crop"))),
            ("partial-revert", everything, lambda: plan_revert(checkout, ("amp", "cuda-graph")),
             lambda: plan_apply(checkout, ("amp", "cuda-graph"))),
            ("full-revert", everything, lambda: plan_revert(checkout), lambda: plan_apply(checkout))]


def reset(checkout: Path, original: dict) -> None:
    if status(checkout).installed:
        plan_revert(checkout).commit()
    with locked_checkout(checkout, write=True):   # drops a lock file left by the CLI
        pass
    assert tree(checkout) == original


@pytest.mark.slow
def test_a_failure_at_every_step_changes_nothing(world):
    """Up to the commit point a failed step rolls everything back; after it (cleanup) a step is retried."""
    checkout, outside = world
    original, around = tree(checkout), tree(outside)
    for name, set_up, make_plan, make_undo in scenarios(checkout):
        set_up()
        before = tree(checkout)
        plan = make_plan()                          # still valid after each rollback: the bytes are the same
        total, commit_point = steps_of(plan)
        done = tree(checkout)
        assert done != before and 0 < commit_point < total
        undo = make_undo()
        undo.commit()
        assert tree(checkout) == before, name
        for n in range(total + 1):
            if n <= commit_point:
                with pytest.raises(PatchError, match="nothing was changed") as info:
                    plan.commit(ops=FailOnce(n))
                assert "\n" not in str(info.value)
                assert tree(checkout) == before, f"{name}: step {n} of {total}"
            else:
                plan.commit(ops=FailOnce(n))
                assert tree(checkout) == done, f"{name}: step {n} of {total}"
                undo.commit()
                assert tree(checkout) == before, name
        reset(checkout, original)
    assert tree(outside) == around


def state(checkout: Path) -> dict[str, tuple]:
    """`tree` without the lock file (kept while patches are installed), and without a state folder it leaves empty."""
    entries = tree(checkout)
    entries.pop(".gpen_tune/lock", None)
    if entries.get(".gpen_tune") == ("dir",) and not any(k.startswith(".gpen_tune/") for k in entries):
        del entries[".gpen_tune"]
    return entries


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["read-only", "crash"])
def test_after_a_folder_turns_read_only_or_a_crash_the_next_run_recovers(world, kind):
    """From the n-th change on nothing can be written (or the process dies there), for every n: the sources are
    exactly as before or exactly patched, or the journal says so; the next writing run recovers exactly, and the
    CLI's apply and --revert both do, once per scenario, from a kept journal."""
    checkout, outside = world
    original, around = state(checkout), tree(outside)
    for name, set_up, make_plan, make_undo in scenarios(checkout):
        set_up()
        before = state(checkout)
        plan = make_plan()
        total, _ = steps_of(plan)
        done = state(checkout)
        undo = make_undo()
        undo.commit()
        kept_at = None
        for n in range(total):
            try:
                plan.commit(ops=ReadOnlyFrom(n) if kind == "read-only" else CrashAt(n))
            except (PatchError, CrashAt.Crash) as exc:
                assert "\n" not in str(exc)
            if (checkout / ".gpen_tune/txn/journal.json").exists():   # the rollback could not finish
                kept_at = n if kept_at is None else kept_at
                with pytest.raises(PatchError, match="interrupted"):
                    status(checkout)
            else:
                assert sources(state(checkout)) in (sources(before), sources(done)), f"{name}: step {n} of {total}"
            with locked_checkout(checkout, write=True):
                pass
            assert state(checkout) in (before, done), f"{name}: step {n} of {total}"
            if state(checkout) == done:
                undo.commit()
        assert kept_at is not None, name
        for command in (("--revert",), ()):
            with pytest.raises((PatchError, CrashAt.Crash)):
                plan.commit(ops=ReadOnlyFrom(kept_at) if kind == "read-only" else CrashAt(kept_at))
            assert (checkout / ".gpen_tune/txn/journal.json").exists()
            line = one_line_error(cli(str(checkout), "--status"), "interrupted")
            assert "--revert" in line
            result = cli(str(checkout), *command)
            assert result.exit_code == 0 and "rolled back" in result.output, result.output
            if command:
                assert state(checkout) == original, name
            else:
                assert status(checkout).installed == SIX
                reset(checkout, original)
            set_up()
        reset(checkout, original)
    assert tree(outside) == around
    assert tree(checkout) == original


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_a_really_read_only_folder(world):
    checkout, _ = world
    original = tree(checkout)
    (checkout / "face_model").chmod(0o555)
    try:
        one_line_error(cli(str(checkout)), "face_model")
        assert tree(checkout) == original
    finally:
        (checkout / "face_model").chmod(0o755)
    assert cli(str(checkout)).exit_code == 0
    assert cli(str(checkout), "--revert").exit_code == 0
    assert tree(checkout) == original


def test_a_stale_plan_is_refused(world):
    checkout, _ = world
    plan = plan_apply(checkout)
    gan = checkout / "face_model/face_gan.py"
    gan.write_bytes(gan.read_bytes() + b"\n# edited meanwhile\n")
    before = tree(checkout)
    with pytest.raises(PatchError, match="changed while apply-patches was planning"):
        plan.commit()
    assert tree(checkout) == before


class CrashAtFirstFile(CrashAt):
    """Dies as the first file of the checkout is put in place (the journal is complete by then)."""

    def __init__(self) -> None:
        super().__init__(-1)

    def before(self, op, path):
        if op == "replace" and "txn" not in path.parts:
            raise self.Crash()


def test_a_damaged_journal_is_one_line(world):
    checkout, outside = world
    with pytest.raises(CrashAt.Crash):
        plan_apply(checkout).commit(ops=CrashAtFirstFile())
    journal = checkout / ".gpen_tune/txn/journal.json"
    text = journal.read_text()
    journal.write_text(text.replace('"path": "demo.py"', f'"path": "{outside / "victim.txt"}"'))
    around = tree(outside)
    one_line_error(cli(str(checkout)), "journal.json", "victim.txt")
    assert tree(outside) == around


# --------------------------------------------------------------------------------------------------- concurrency


TOOL = ("import sys, typer\nfrom gpen_tune.cli import app\nparent = typer.Typer()\n"
        "parent.add_typer(app, name='gpen-tune')\n"
        "parent(['gpen-tune', 'apply-patches'] + sys.argv[1:], prog_name='gpen-tune')\n")


def run_tool(*args: str, unbuffered: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **({"PYTHONUNBUFFERED": "1"} if unbuffered else {})}
    return subprocess.Popen([sys.executable, "-c", TOOL, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_concurrent_applies_with_different_only_never_corrupt_the_tree(world):
    checkout, _ = world
    original = tree(checkout)
    reference = copy_checkout("fixture", checkout.parent / "reference")
    assert cli(str(reference), "--only", "face-crop").exit_code == 0
    assert cli(str(reference), "--only", "amp,cuda-graph").exit_code == 0
    expected = snapshot(reference)
    for _ in range(3):
        a = run_tool(str(checkout), "--only", "face-crop")
        b = run_tool(str(checkout), "--only", "amp,cuda-graph")
        outs = [p.communicate(timeout=300)[0] for p in (a, b)]
        assert [a.returncode, b.returncode] == [0, 0], outs
        assert "Traceback" not in "".join(outs)
        assert snapshot(checkout) == expected
        assert status(checkout).installed == ("amp", "face-crop", "cuda-graph")
        assert cli(str(checkout), "--revert").exit_code == 0
        assert tree(checkout) == original


def test_a_second_apply_waits_for_the_lock_and_says_so(world):
    checkout, _ = world
    assert cli(str(checkout), "--only", "face-crop").exit_code == 0
    held, release = threading.Event(), threading.Event()

    def hold():
        with checkout_lock(checkout.resolve(), exclusive=True):
            held.set()
            release.wait(120)  # held until the second apply says it waits, however slow its start-up

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    proc = run_tool(str(checkout), "--only", "amp", unbuffered=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "waiting for another gpen-tune apply-patches" in line:
            release.set()
    proc.wait(timeout=300)
    release.set()
    holder.join()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert "waiting for another gpen-tune apply-patches" in out
    assert status(checkout).installed == ("amp", "face-crop")


def test_a_lock_file_that_is_a_symlink_is_refused(world):
    checkout, outside = world
    assert cli(str(checkout), "--only", "face-crop").exit_code == 0
    (checkout / ".gpen_tune/lock").unlink(missing_ok=True)
    (checkout / ".gpen_tune/lock").symlink_to(outside / "victim.txt")
    around = tree(outside)
    one_line_error(cli(str(checkout), "--revert"), ".gpen_tune/lock")
    assert tree(outside) == around
