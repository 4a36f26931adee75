"""One import root: what a wheel holds, and that every way of running imports the same files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("schemas", "eventlog", "producers", "projector", "snapshotter")
pytestmark = pytest.mark.slow


def _python(code: str, cwd: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout (the working tree is left untouched)."""
    src = tmp_path_factory.mktemp("src") / "runstate"
    shutil.copytree(
        ROOT,
        src,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".runstate", ".hypothesis", ".pytest_cache"
        ),
    )
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    [whl] = out.glob("runstate-*.whl")
    return whl


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"runstate"}
    for layer in (*LAYERS, "testing", "compose"):
        assert f"runstate/{layer}/__init__.py" in names
    assert "runstate/schemas/avro/patch.v1.avsc" in names and "runstate/compose/docker-compose.yml" in names
    # PEP 561: a user's type checker reads runstate's hints (without it mypy stops at the import)
    assert "runstate/py.typed" in names
    # The audit pages are served from the wheel itself (no CDN, no build step).
    assert {
        "runstate/service/static/index.html",
        "runstate/service/static/app.js",
        "runstate/service/static/app.css",
    } <= set(names)


def _packages_of_the_checkout() -> list[str]:
    """Every folder of the import root holding an ``__init__.py`` (the layers through their
    links), as the wheel's paths: ``runstate/agent/__init__.py``, ..."""
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT / "runstate", followlinks=True):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        if "__init__.py" in filenames:
            out.append(str(Path(dirpath, "__init__.py").relative_to(ROOT)))
    return sorted(out)


def test_the_wheel_holds_every_package_of_the_checkout(wheel: Path) -> None:
    """A package added to the checkout is in the wheel too (setuptools is given the list)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = _packages_of_the_checkout()
    assert "runstate/agent/__init__.py" in packages and "runstate/projector/store/__init__.py" in packages
    assert [p for p in packages if p not in names] == []


def test_an_installed_wheel_imports_only_runstate_from_anywhere(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = _python(
        "import importlib.util, runstate, runstate.schemas\n"
        "from runstate import RunProducer, Projection, open_log, Author, RunstateError\n"
        "print(runstate.__file__); print(runstate.schemas.__file__)\n"
        f"print([m for m in {LAYERS!r} if importlib.util.find_spec(m) is not None])\n",
        elsewhere,
        PYTHONPATH=str(target),
    )
    pkg, schemas, leaked = out.splitlines()
    assert pkg == str(target / "runstate" / "__init__.py")
    assert schemas == str(target / "runstate" / "schemas" / "__init__.py")
    assert leaked == "[]"  # `import schemas` fails: nothing but runstate is installed


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_the_checkout_imports_its_own_folders_from_its_root_and_from_elsewhere(where: str, tmp_path: Path) -> None:
    cwd = ROOT if where == "root" else tmp_path
    out = _python(
        "import runstate.schemas, runstate.projector.store.partition as s, runstate.compose\n"
        "print(runstate.schemas.__file__); print(s.__file__); print(runstate.compose.__file__)",
        cwd,
    )
    # runstate/<layer> links to the layer's folder: the same files, by either path
    assert [str(Path(f).resolve()) for f in out.splitlines()] == [
        str(ROOT / "schemas" / "__init__.py"),
        str(ROOT / "projector" / "store" / "partition.py"),
        str(ROOT / "compose" / "__init__.py"),
    ]


def test_the_checkout_imports_without_being_installed(tmp_path: Path) -> None:
    """A plain checkout on PYTHONPATH, no install: runstate/<layer> are links to the folders."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-S", "-c", "import runstate.projector.store.partition as s; print(s.__file__)"],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # -S: without site-packages the third-party imports fail after the layers resolved
    assert "No module named 'runstate.projector'" not in out.stderr, out.stderr
    assert "No module named 'runstate" not in out.stderr, out.stderr
