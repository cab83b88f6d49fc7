"""The built wheel installs one import name, ``failslow``, holding every package of the tree; a
fresh environment with it cannot ``import agents``; the README's imports resolve."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("cli", "service", "agents", "relay", "detectors", "harness", "migrations", "wire")
TOP_LEVEL = ("cli", "service", "agents", "detectors", "harness", "migrations", "wire")


# what a build writes into its source tree, and what is no source
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "var"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the tree: setuptools writes ``build/`` and ``*.egg-info`` into the
    tree it builds, and xdist may run this fixture in two workers at once (one per test of the
    module), whose builds in one tree collided (CI, a222de1)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, out = tmp / "src", tmp / "out"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    (found,) = out.glob("failslow-*.whl")
    return found


def test_the_wheel_has_one_top_level_name_and_every_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        declared = z.read(top_level).decode().split()
    assert declared == ["failslow"]
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"failslow"}
    for folder in FOLDERS:  # every source module is in the wheel, under its namespace path
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            assert f"failslow/{rel}" in names, rel
    assert "failslow/service/ui/index.html" in names
    assert "failslow/migrations/script.py.mako" in names


def test_the_package_list_matches_the_tree() -> None:
    """pyproject.toml lists every package (setuptools does not find mapped ones by itself)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {
        "failslow." + d.relative_to(ROOT).as_posix().replace("/", ".")
        for folder in FOLDERS
        for d in [ROOT / folder, *(ROOT / folder).rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }
    assert listed == on_disk


def test_a_fresh_environment_has_only_failslow(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    for name in TOP_LEVEL:  # the generic names a training repository may have are not taken
        r = subprocess.run(
            [python, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True
        )
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, name
    r = subprocess.run(  # stdlib-only modules import without the dependencies
        [python, "-c", "import failslow.detectors.vocab as v; print(v.IncidentKind.SLOW_GPU)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == "slow_gpu", r.stderr
    assert (venv / "bin" / "failslow").exists()


def test_the_readme_imports_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    imports = [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip().startswith(("from failslow", "import failslow"))
    ]
    assert any("failslow.agents.torch" in i for i in imports) and imports
    for line in imports:
        module, _, names = line.removeprefix("from ").partition(" import ")
        if module.startswith("failslow.agents.torch") and importlib.util.find_spec("torch") is None:
            continue  # the torch extra is optional
        mod = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(mod, name.strip()), line
