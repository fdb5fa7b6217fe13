"""`gpen-tune apply-patches` on a checkout: dry-run, apply, idempotence, revert, refusals, all-or-nothing.

Runs on a copy of tests/fixtures/upstream_like (our own stand-in with upstream's names and structure) and, when
GPEN_UPSTREAM_DIR points at a real yangxy/GPEN checkout, on a copy of that too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import libcst as cst
import pytest
import typer
from typer.testing import CliRunner, Result

from gpen_tune.cli import app
from gpen_tune.patcher import FileOps, PatchError, plan_apply, plan_revert, status
from gpen_tune.patcher.engine import MANIFEST, PRISTINE, sha256

FIXTURE = Path(__file__).parents[1] / "fixtures" / "upstream_like"
IGNORE = shutil.ignore_patterns(".git", "*.pth", "*.png", "*.jpg", "*.jpeg", "examples", "figs", "__pycache__")
SIX = ("lazy-detector", "compile", "amp", "checkpoint", "face-crop", "cuda-graph")


def copy_checkout(kind: str, dest: Path) -> Path:
    if kind == "upstream":
        src = os.environ.get("GPEN_UPSTREAM_DIR")
        if not src:
            pytest.skip("GPEN_UPSTREAM_DIR is not set (path of a yangxy/GPEN checkout)")
    else:
        src = FIXTURE
    shutil.copytree(src, dest, ignore=IGNORE)
    return dest


@pytest.fixture(params=["fixture", "upstream"])
def checkout(request, tmp_path) -> Path:
    return copy_checkout(request.param, tmp_path / "GPEN")


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cli(*args: str) -> Result:
    # mounted under a parent so that `apply-patches` stays a sub-command even while it is the app's only command
    parent = typer.Typer()
    parent.add_typer(app, name="gpen-tune")
    return CliRunner().invoke(parent, ["gpen-tune", "apply-patches", *args])


def test_dry_run_prints_a_unified_diff_and_changes_nothing(checkout):
    before = snapshot(checkout)
    result = cli(str(checkout), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "--- a/face_model/face_gan.py\n+++ b/face_model/face_gan.py" in result.output
    added = [line for line in result.output.splitlines() if line.startswith("+")]
    assert any("= gpen_tune_runtime.run_generator(self, img_t)" in line for line in added)
    assert "--- /dev/null\n+++ b/face_model/gpen_tune_runtime.py" in result.output
    assert "nothing changed" in result.output
    assert snapshot(checkout) == before


def test_apply_is_idempotent_and_revert_is_byte_identical(checkout):
    original = snapshot(checkout)
    result = cli(str(checkout))
    assert result.exit_code == 0, result.output
    patched = snapshot(checkout)
    assert patched != original
    manifest = json.loads((checkout / MANIFEST).read_text())
    assert tuple(manifest["patches"]) == SIX and manifest["upstream"].endswith("2c73670")
    for rel, info in manifest["files"].items():
        assert info["pristine_sha256"] == sha256(original[rel])
        assert info["patched_sha256"] == sha256(patched[rel])
        assert (checkout / PRISTINE / rel).read_bytes() == original[rel]
    assert "face_model/gpen_tune_runtime.py" in manifest["added"]

    again = cli(str(checkout))
    assert again.exit_code == 0 and "already applied" in again.output
    assert snapshot(checkout) == patched

    st = cli(str(checkout), "--status")
    assert st.exit_code == 0
    for name in SIX:
        assert f"{name:14s} applied" in st.output

    back = cli(str(checkout), "--revert")
    assert back.exit_code == 0, back.output
    assert snapshot(checkout) == original           # byte-identical, and no .gpen_tune/ left behind
    assert "no gpen-tune patches applied" in cli(str(checkout), "--status").output


def test_only_adds_patches_and_partial_revert_keeps_the_rest(checkout):
    original = snapshot(checkout)
    assert cli(str(checkout), "--only", "face-crop").exit_code == 0
    assert (checkout / "face_model/face_gan.py").read_bytes() == original["face_model/face_gan.py"]
    assert b"face_crop_process" in (checkout / "face_enhancement.py").read_bytes()
    assert status(checkout).installed == ("face-crop",)

    assert cli(str(checkout), "--only", "amp,cuda-graph").exit_code == 0
    assert status(checkout).installed == ("amp", "face-crop", "cuda-graph")
    assert b"run_generator" in (checkout / "face_model/face_gan.py").read_bytes()

    assert cli(str(checkout), "--revert", "--only", "amp,cuda-graph").exit_code == 0
    assert status(checkout).installed == ("face-crop",)
    assert (checkout / "face_model/face_gan.py").read_bytes() == original["face_model/face_gan.py"]
    assert (checkout / "face_model/op/fused_act.py").read_bytes() == original["face_model/op/fused_act.py"]
    assert not (checkout / PRISTINE / "face_model/face_gan.py").exists()

    assert cli(str(checkout), "--revert").exit_code == 0
    assert snapshot(checkout) == original


def test_patched_ops_choose_their_path_without_platform_calls_in_functions(checkout):
    assert cli(str(checkout), "--only", "compile").exit_code == 0
    for rel, fn in (("face_model/op/fused_act.py", "fused_leaky_relu"), ("face_model/op/upfirdn2d.py", "upfirdn2d")):
        module = cst.parse_module((checkout / rel).read_text())
        body = next(s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == fn)
        text = module.code_for_node(body)
        assert "platform.system" not in text and "_GPEN_TUNE_CUDA_OPS and device != 'cpu'" in text


@pytest.mark.parametrize("edit, rel, expected", [
    (lambda t: t.replace("    def process(self, img):", "    def restore(self, img):"),
     "face_model/face_gan.py", "FaceGAN.process"),
    (lambda t: t.replace("import __init_paths\n", "import sys\n"), "demo.py", "__init_paths"),
    (lambda t: t.replace("def fused_leaky_relu(", "def leaky_relu_with_bias("),
     "face_model/op/fused_act.py", "fused_leaky_relu"),
])
def test_refuses_an_unrecognised_file_and_names_it(checkout, edit, rel, expected):
    path = checkout / rel
    changed = edit(path.read_text())
    assert changed != path.read_text()
    path.write_text(changed)
    before = snapshot(checkout)
    result = cli(str(checkout))
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert rel in message and expected in message
    assert snapshot(checkout) == before


def test_refuses_a_missing_file_and_a_non_checkout(checkout, tmp_path):
    (checkout / "face_model/op/upfirdn2d.py").unlink()
    result = cli(str(checkout))
    assert result.exit_code == 1 and "face_model/op/upfirdn2d.py" in " ".join(result.output.split())
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli(str(empty))
    assert result.exit_code == 1 and "not an upstream GPEN checkout" in " ".join(result.output.split())
    assert cli(str(checkout), "--only", "turbo").exit_code == 1


def test_refuses_a_file_modified_after_patching(checkout):
    assert cli(str(checkout)).exit_code == 0
    target = checkout / "face_enhancement.py"
    target.write_text(target.read_text() + "\n# my local tweak\n")
    before = snapshot(checkout)
    for args in ((), ("--revert",), ("--status",)):
        result = cli(str(checkout), *args)
        assert result.exit_code == 1
        message = " ".join(result.output.split())
        assert "face_enhancement.py" in message and "modified after gpen-tune patched it" in message
    assert snapshot(checkout) == before


def test_refuses_a_hand_patched_file_without_manifest(checkout):
    target = checkout / "face_model/face_gan.py"
    target.write_text(target.read_text() + "\nimport gpen_tune_runtime\n")
    result = cli(str(checkout))
    assert result.exit_code == 1 and "face_gan.py" in result.output


class FailAtReplace(FileOps):
    """Fails the i-th file of the checkout put in place or deleted (not the journal's own files), from 0."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.done = fail_at, 0

    def before(self, op, path):
        if op in ("replace", "unlink") and "txn" not in path.parts:
            self.done += 1
            if self.done - 1 == self.fail_at:
                raise OSError(30, "injected failure (read-only file system)", str(path))


@pytest.mark.parametrize("fail_at", [0, 3, 7])
def test_failure_mid_way_changes_nothing(checkout, fail_at):
    original = snapshot(checkout)
    plan = plan_apply(checkout)
    assert len(plan.writes) > fail_at
    with pytest.raises(PatchError, match="nothing was changed"):
        plan.commit(ops=FailAtReplace(fail_at))
    assert snapshot(checkout) == original            # no half-patched file, no temp file, no .gpen_tune/

    plan_apply(checkout, ["face-crop"]).commit()
    partly = snapshot(checkout)
    with pytest.raises(PatchError):
        plan_apply(checkout).commit(ops=FailAtReplace(fail_at))
    assert snapshot(checkout) == partly
    revert = plan_revert(checkout)
    with pytest.raises(PatchError):
        revert.commit(ops=FailAtReplace(min(fail_at, len(revert.writes) - 1)))
    assert snapshot(checkout) == partly


def test_comment_and_whitespace_changes_do_not_break_the_edits(checkout):
    gan = checkout / "face_model/face_gan.py"
    text = gan.read_text()
    call = next(line for line in text.splitlines() if "= self.model(img_t)" in line)
    spaced = call.replace("self.model(img_t)", "self.model( img_t )  # my comment")
    text = text.replace(call, "\n        # a comment the user added\n\n" + spaced)
    gan.write_text(text)
    demo = checkout / "demo.py"
    demo.write_text(demo.read_text().replace("import __init_paths\n", "import __init_paths   # sets sys.path\n\n"))
    original = snapshot(checkout)
    assert cli(str(checkout), "--only", "cuda-graph").exit_code == 0
    assert "gpen_tune_runtime.run_generator(self, img_t)  # my comment" in gan.read_text()
    assert cli(str(checkout), "--revert").exit_code == 0
    assert snapshot(checkout) == original
