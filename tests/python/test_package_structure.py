"""The Python package's imports run one way (issue 15 item 7): every module imports only
modules of a lower layer, so no two modules import each other and leaf modules own their
state. Read from the installed package's sources with ast (imports inside functions count)."""

import ast
from pathlib import Path

import torch_arena

PACKAGE = Path(torch_arena.__file__).parent

# Layer of each module: a module may import only modules of a strictly lower layer.
LAYERS = {
    "_native": 0,
    "_paths": 0,
    "_sizes": 0,
    "_frames": 0,
    "referrers": 0,
    "stats": 1,
    "_cpu_tensors": 1,
    "_capture": 1,
    "_render": 1,
    "_ranks": 1,
    "_explain": 2,
    "_verdict": 2,
    "snapshots": 2,
    "testing": 2,
    "leaks": 3,
    "_oom": 3,
    "_exit": 4,
    "_torch": 5,
    "_autostart": 6,
    "pytest_plugin": 6,
    "__init__": 7,
}


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports (relative imports, ``torch_arena.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(a.name for a in node.names)
            elif node.module and node.module.split(".")[0] == "torch_arena":
                parts = node.module.split(".")
                found.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "torch_arena":
                    found.add(parts[1] if len(parts) > 1 else "__init__")
    return found


def test_every_module_has_a_layer():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == set(LAYERS), modules ^ set(LAYERS)


def test_imports_run_one_way():
    upward = []
    for name, layer in LAYERS.items():
        for imported in _imports(PACKAGE / f"{name}.py"):
            if imported in LAYERS and LAYERS[imported] >= layer and imported != name:
                upward.append(f"{name} (layer {layer}) imports {imported} ({LAYERS[imported]})")
    assert not upward, upward


def test_production_code_does_not_import_the_test_helpers():
    for name in LAYERS:
        if name not in ("testing", "__init__"):
            assert "testing" not in _imports(PACKAGE / f"{name}.py"), name


def test_no_module_writes_another_modules_globals():
    # `other._state = ...` from outside: state is changed through its owner's functions.
    offenders = []
    for name in LAYERS:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id in LAYERS
                    and t.value.id != name
                ):
                    offenders.append(f"{name}: {t.value.id}.{t.attr} = ...")
    assert not offenders, offenders
