"""The house's shape: imports point one way only, and tests share helpers instead of importing
each other.

Layers, lowest first: kernels, the batch type, the key tree (config) and the lazy package exports
(lazy) <- parallel <- models <- data <- algos / optim / rollout / reward <- agent <- assets <- the
resolver (runspec) <- trainer <- what the entry points share (plots, the compilation cache, the
TPU planner) <- entry points (the ``python -m`` commands); inside the trainer, update <- io /
roles <- loop <- ppo / sft. A module may import its own package and the layers below it, never a
sibling of its layer or anything above.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    ("jrl_kernels", "jrl.batch", "jrl.config", "jrl.lazy"),
    ("jrl.parallel",),
    ("jrl.models",),
    ("jrl.data",),
    ("jrl.algos", "jrl.optim", "jrl.rollout", "jrl.reward"),
    ("jrl.agent",),
    ("jrl.assets",),
    ("jrl.runspec",),
    ("jrl.trainer",),
    ("jrl.plot", "jrl.compile_cache", "jrl.plan"),
    (
        "jrl.train",
        "jrl.sft",
        "jrl.generate",
        "jrl.evaluate",
        "jrl.merge",
        "jrl.notebook",
        "jrl.compile",
    ),
)
TRAINER_LAYERS = (
    ("jrl.trainer.update",),
    ("jrl.trainer.io", "jrl.trainer.roles"),
    ("jrl.trainer.loop",),
    ("jrl.trainer.overlap",),
    ("jrl.trainer.ppo", "jrl.trainer.sft"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every jrl module `path` imports (``from a import b`` counts as ``a.b`` when that is a
    module), at any depth of the file (imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                is_module = any(
                    (ROOT / Path(*child.split("."))).with_suffix(suffix).exists()
                    for suffix in (".py", "")
                )
                found.add(child if is_module else node.module)
    return {name for name in found if name.split(".")[0] in ("jrl", "jrl_kernels")}


def owner(module: str, layers: tuple[tuple[str, ...], ...]) -> tuple[int, str] | None:
    """(layer index, package) of the package in `layers` that holds `module`."""
    for index, packages in enumerate(layers):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return index, package
    return None


def upward_imports(layers: tuple[tuple[str, ...], ...], files: list[Path]) -> list[str]:
    """``importer -> imported`` for every import that does not point to a lower layer or to the
    importer's own package."""
    bad = []
    for path in files:
        here = owner(module_name(path), layers)
        for target in sorted(imported_modules(path)):
            there = owner(target, layers)
            if here is None or there is None or here[1] == there[1]:
                continue
            if there[0] >= here[0]:
                bad.append(f"{module_name(path)} -> {target}")
    return bad


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_every_module_has_a_layer():
    files = python_files("jrl", "jrl_kernels")
    unplaced = [module_name(p) for p in files if owner(module_name(p), LAYERS) is None]
    assert unplaced in ([], ["jrl"]), unplaced


def test_imports_point_down_the_layers():
    assert upward_imports(LAYERS, python_files("jrl", "jrl_kernels")) == []


def test_trainer_subpackages_point_down():
    assert upward_imports(TRAINER_LAYERS, python_files("jrl/trainer")) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from jrl.trainer.loop.fit import fit\n", ["jrl.models.x -> jrl.trainer.loop.fit"]),
        ("from jrl.reward import math\n", ["jrl.models.x -> jrl.reward.math"]),
        ("from jrl.parallel import make_mesh\n", []),
    ],
)
def test_the_check_sees_an_upward_import(tmp_path, monkeypatch, source, expected):
    """The rule itself: a models module importing the trainer or the rewards is caught."""
    fake_root = tmp_path
    (fake_root / "jrl" / "models").mkdir(parents=True)
    for package in ("trainer/loop", "reward", "parallel"):
        (fake_root / "jrl" / package).mkdir(parents=True, exist_ok=True)
    (fake_root / "jrl" / "trainer" / "loop" / "fit.py").write_text("")
    (fake_root / "jrl" / "reward" / "math.py").write_text("")
    module = fake_root / "jrl" / "models" / "x.py"
    module.write_text(source)
    monkeypatch.setitem(globals(), "ROOT", fake_root)
    assert upward_imports(LAYERS, [module]) == expected


def test_no_test_imports_another_test_module():
    offenders = []
    for path in python_files("tests"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.split(".")[-1].startswith("test_"):
                    offenders.append(f"{path.name} imports {name}")
    assert offenders == []


def test_the_key_tree_imports_no_jax_and_no_other_jrl_package():
    """`import jrl.config` is the light door: keys, cards and overrides, nothing that computes."""
    probe = (
        "import sys, time; t = time.perf_counter(); import jrl.config; "
        "t = time.perf_counter() - t; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax', "
        "'numpy', 'jrl_kernels') or (m.startswith('jrl.') and not m.startswith('jrl.config'))); "
        "print(heavy, t)"
    )
    runs = [
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        for _ in range(3)  # the fastest of three cold imports: a loaded machine stalls some
    ]
    heavy = {run.stdout.rsplit(" ", 1)[0] for run in runs}
    assert heavy == {"[]"}, heavy
    seconds = min(float(run.stdout.rsplit(" ", 1)[1]) for run in runs)
    assert seconds < 0.3, f"import jrl.config took {seconds:.2f} s"


@pytest.mark.parametrize(
    "module",
    [
        "jrl.optim.settings",
        "jrl.algos",
        "jrl.algos.estimator",
        "jrl.rollout.engines",
        "jrl.rollout.spec",
        "jrl.rollout",
        "jrl.models",
        "jrl.parallel",
    ],
)
def test_settings_registries_and_package_doors_import_no_jax(module):
    """A mechanism's settings (the optimizers' names, defaults and settings; the rollout's) and
    its registry (which engines exist) read without JAX, and importing a package for one name
    builds nothing."""
    probe = (
        f"import sys; import {module}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def hidden_imports(files: list[Path]) -> list[str]:
    """``module:line -> imported`` for each import of another jrl package made inside a function:
    every dependency of a module stands at its top, where the layer check sees it."""
    found = set()
    for path in files:
        here = module_name(path)
        package = ".".join(here.split(".")[:2])
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    if name.split(".")[0] in ("jrl", "jrl_kernels") and not (
                        name == package or name.startswith(package + ".")
                    ):
                        found.add(f"{here}:{node.lineno} -> {name}")
    return sorted(found)


def test_no_package_imports_another_inside_a_function():
    assert hidden_imports(python_files("jrl", "jrl_kernels")) == []


def test_the_check_sees_a_hidden_import(tmp_path, monkeypatch):
    (tmp_path / "jrl" / "models").mkdir(parents=True)
    module = tmp_path / "jrl" / "models" / "x.py"
    module.write_text(
        "from jrl.models import y\n\ndef f():\n    from jrl.models import z\n"
        "    from jrl.parallel import mesh\n    return mesh\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert hidden_imports([module]) == ["jrl.models.x:5 -> jrl.parallel"]
