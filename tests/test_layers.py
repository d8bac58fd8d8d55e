"""The layers: runtime <- compiler <- dsl, with no import cycles.

Every import statement of every module is read from source (function-local
imports too, which a run-time check would miss), so a lower layer that
imports a higher one fails here even on a path no other test runs.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> the package name it installs as
PACKAGES = {"runtime": "gradlang.runtime", "grammar": "gradlang.grammar",
            "compiler": "gradlang.compiler", "dsl": "dsl"}
# what each layer may import, besides itself
ALLOWED = {
    "gradlang.runtime": set(),
    "gradlang.grammar": set(),
    "gradlang.compiler": {"gradlang.runtime", "gradlang.grammar"},
    "dsl": {"gradlang.runtime", "gradlang.grammar", "gradlang.compiler"},
}
OURS = tuple(PACKAGES.values()) + ("compiler", "runtime", "grammar", "gradlang")


def _modules():
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            yield package, name, path


def _imports(path: Path, module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level?) for each import of ours,
    leaving out those under `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node, top: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = module.rsplit(".", child.level)[0]
                    base = f"{parent}.{base}" if base else parent
                found.append((base, child.lineno, top))
                found.extend((f"{base}.{a.name}", child.lineno, top) for a in child.names)
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, top and not nested)

    visit(tree, True)
    return [(m, line, top) for m, line, top in found if m.split(".")[0] in
            {o.split(".")[0] for o in OURS}]


def _layer(module: str) -> str:
    return next((p for p in PACKAGES.values() if module == p or module.startswith(p + ".")),
                module)


@pytest.mark.parametrize("package,module,path", list(_modules()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_no_layer_imports_a_higher_one(package, module, path):
    for imported, line, _ in _imports(path, module):
        layer = _layer(imported)
        assert layer in PACKAGES.values(), \
            f"{path.relative_to(ROOT)}:{line} imports {imported!r}, not a layer's name"
        assert layer == package or layer in ALLOWED[package], \
            f"{path.relative_to(ROOT)}:{line}: {package} imports {imported} ({layer})"


def test_no_import_cycle():
    """Not even through a function-local import: a cycle hidden that way
    still means two modules that cannot be understood apart."""
    names = {name for _, name, _ in _modules()}
    graph = {}
    for _, name, path in _modules():
        graph[name] = {m for m, _, _ in _imports(path, name) if m in names and m != name}
    state: dict[str, int] = {}

    def walk(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])


def printed_by(code: str) -> str:
    """What `code` prints in a fresh interpreter (which has imported nothing)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd="/").stdout.strip()


def test_a_compiled_module_needs_only_the_runtime():
    """What `gradc compile` output imports must not pull in the compiler
    or the parser (it runs where neither is installed)."""
    code = ("import sys, gradlang.runtime.aot, gradlang.runtime.cpu\n"
            "bad = [m for m in sys.modules if m.startswith(('gradlang.compiler', 'dsl', "
            "'lark'))]\nprint(bad)\n")
    assert printed_by(code) == "[]"


def test_nothing_generic_is_installed_at_top_level():
    text = (ROOT / "pyproject.toml").read_text()
    packages_line = next(line for line in text.splitlines() if line.startswith("packages"))
    listed = ast.literal_eval(packages_line.split("=", 1)[1].strip())
    assert all(p == "dsl" or p.startswith("gradlang.") for p in listed)


def test_dsl_never_imports_the_libraries_it_bridges_to():
    """torch, jax and dask are optional extras, seconds to import: loading
    and running a module, and importing the bridges, import none of them
    (only calling `dsl.to_torch`/`to_jax` or passing Dask arrays does)."""
    code = ("import sys, numpy as np, dsl, dsl.torch_bridge, dsl.jax_bridge, dsl.dask_bridge\n"
            "m = dsl.loads('def f(x):\\n    return x * x\\n')\n"
            "assert dsl.grad(m.f)(np.ones(2)).tolist() == [2.0, 2.0]\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'dask')])\n")
    assert printed_by(code) == "[]"


def test_a_bridge_without_its_library_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import dsl\nm = dsl.loads('def f(x):\\n    return x\\n')\n"
            "try:\n    dsl.to_torch(m.f)\nexcept ImportError as err:\n    print(err)\n")
    assert printed_by(code) == ("this needs torch, which is not installed: "
                                  "pip install 'gradlang[torch]'")
