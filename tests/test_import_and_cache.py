"""The import hook, the kernel cache, and a warm second process."""
import concurrent.futures
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lark

import dsl
from gradlang.grammar import grammar_text
from helpers import within_seconds
from gradlang.runtime.loader import (_stored_path, jit_in_kernel_cache, kernel_module_name,
                                     load_kernel_files, store, stored)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def importable(monkeypatch, folder, *names) -> None:
    """`folder` on sys.path, `names` not yet imported, the hook installed
    (each undone after the test)."""
    monkeypatch.syspath_prepend(str(folder))
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    dsl.install_import_hook()


def test_import_hook_finds_grad_files(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    finder = dsl.install_import_hook()
    assert dsl.install_import_hook() is finder
    assert sum(f is finder for f in sys.meta_path) == 1
    for name in ("log1pexp", "bar"):
        sys.modules.pop(name, None)
    import log1pexp
    from bar import bar
    assert dsl.grad(log1pexp.log1pexp)(np.array([100.0]))[0] == 1.0
    assert bar(2.0, 3.0) == 6.0


def test_import_hook_reports_errors_as_grad_errors(tmp_path, monkeypatch):
    (tmp_path / "broken_mod.grad").write_text("def f(x):\n    return y\n")
    importable(monkeypatch, tmp_path)
    with pytest.raises(dsl.GradError, match="broken_mod.grad:2:12: error: name 'y'"):
        import broken_mod  # noqa: F401


def test_import_hook_keeps_the_modules_own_names_from_its_functions(tmp_path, monkeypatch):
    # a function named like the module's own names (params, a dunder the
    # import system reads) once replaced them: `m.params` was the function,
    # `m.__spec__` too (so importlib.reload failed), and a `__getattr__`
    # became the module's attribute hook
    source = ("param w: f64\ndef params(x):\n    return x * w\n"
              "def __spec__(x):\n    return x\ndef __getattr__(x):\n    return x\n"
              "def gone(x):\n    return x\n")
    (tmp_path / "clashing_mod.grad").write_text(source)
    importable(monkeypatch, tmp_path, "clashing_mod")
    import clashing_mod
    clashing_mod.params["w"] = 3.0
    assert sorted(clashing_mod.functions) == ["__getattr__", "__spec__", "gone", "params"]
    np.testing.assert_array_equal(clashing_mod.functions["params"](np.array([1.0, 2.0])),
                                  [3.0, 6.0])
    assert clashing_mod.__spec__.name == "clashing_mod"
    with pytest.raises(AttributeError):
        clashing_mod.anything  # noqa: B018
    (tmp_path / "clashing_mod.grad").write_text("def f(x):\n    return x\n")
    importlib.reload(clashing_mod)  # replaces the earlier load's functions
    assert not hasattr(clashing_mod, "gone") and sorted(clashing_mod.functions) == ["f"]


def test_import_hook_modules_params_are_set_not_rebound(tmp_path, monkeypatch):
    # `m.params = {...}` and `m.w = ...` were accepted and ignored: the
    # functions kept reading the module's params, so calls ran on old values
    (tmp_path / "rebound_mod.grad").write_text("param w: f64[2]\ndef f(x):\n"
                                               "    return sum(x * w)\n")
    importable(monkeypatch, tmp_path, "rebound_mod")
    import rebound_mod
    rebound_mod.params["w"] = [1.0, 2.0]
    with pytest.raises(AttributeError, match=r"cannot be replaced.*\.params\.update"):
        rebound_mod.params = {"w": np.zeros(2)}
    with pytest.raises(AttributeError, match=r"set it with \.params\['w'\] = value"):
        rebound_mod.w = np.zeros(2)
    rebound_mod.note = "mine"  # other names are the user's
    assert rebound_mod.f(np.ones(2)) == 3.0 and rebound_mod.note == "mine"


def test_import_hook_skips_sys_path_entries_that_name_no_path(tmp_path, monkeypatch):
    # a bytes entry was a TypeError from every import no other finder
    # resolved, a library's probe for an optional module included
    (tmp_path / "bytes_entry_mod.grad").write_text("def f(x):\n    return x\n")
    monkeypatch.setattr(sys, "path", [3, os.fsencode(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, "bytes_entry_mod", raising=False)
    dsl.install_import_hook()
    with pytest.raises(ModuleNotFoundError):
        import no_such_module_anywhere  # noqa: F401
    import bytes_entry_mod
    assert sorted(bytes_entry_mod.functions) == ["f"]


def test_import_hook_finds_a_grad_file_beside_a_directory_of_its_name(tmp_path, monkeypatch):
    # Python's path finder answered `import dir_beside_mod` with an empty
    # namespace package for the directory (a model's checkpoints beside
    # model.grad), hiding the file, where a dir_beside_mod.py would win; a
    # Python module of the name still wins over a .grad file
    (tmp_path / "dir_beside_mod").mkdir()
    (tmp_path / "dir_beside_mod.grad").write_text("def f(x):\n    return x * x\n")
    (tmp_path / "py_beside_mod.grad").write_text("def f(x):\n    return x\n")
    (tmp_path / "py_beside_mod.py").write_text("F = 1\n")
    importable(monkeypatch, tmp_path, "dir_beside_mod", "py_beside_mod")
    import dir_beside_mod
    import py_beside_mod
    assert dsl.grad(dir_beside_mod.f)(np.array([3.0])) == 6.0
    assert py_beside_mod.F == 1


def test_import_hook_finds_a_packages_grad_files_by_relative_import(tmp_path, monkeypatch):
    # only a top-level import looked for a .grad file: `import pkg.model`
    # and the package's `from .model import f` were ModuleNotFoundError
    package = tmp_path / "grad_pkg_mod"
    package.mkdir()
    (package / "__init__.py").write_text("from .model import f\n")
    (package / "model.grad").write_text("def f(x):\n    return x * x * x\n")
    importable(monkeypatch, tmp_path, "grad_pkg_mod", "grad_pkg_mod.model")
    import grad_pkg_mod
    import grad_pkg_mod.model
    assert grad_pkg_mod.f is grad_pkg_mod.model.f
    assert dsl.grad(grad_pkg_mod.f)(np.array([2.0])) == 12.0


def test_import_hook_takes_no_path_for_a_module_name(tmp_path, monkeypatch):
    # importlib.import_module("sub/model") loaded sub/model.grad, and an
    # absolute path any .grad file on disk, where Python's finder finds no
    # module; a name that is no identifier but a file's stem still imports
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "path_mod.grad").write_text("def f(x):\n    return x * 3.0\n")
    (tmp_path / "dashed-mod.grad").write_text("def f(x):\n    return x * 2.0\n")
    importable(monkeypatch, tmp_path / "sub", "path_mod")
    importable(monkeypatch, tmp_path, "sub/path_mod", str(tmp_path / "sub" / "path_mod"),
               "dashed-mod")
    for name in ("sub/path_mod", str(tmp_path / "sub" / "path_mod")):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)
    assert importlib.import_module("path_mod").f(np.array([1.0])) == 3.0
    assert importlib.import_module("dashed-mod").f(np.array([1.0])) == 2.0


def test_a_cache_directory_name_too_long_for_the_file_system_is_no_internal_error(
        tmp_path, monkeypatch):
    # Path.is_file raises ENAMETOOLONG (it swallows only "not there"): a
    # GRADC_CACHE_DIR of a 300-character name was an OSError from the
    # runtime's first import, where an unusable cache is a warning
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / ("a" * 300)))

    def triple(x):
        return 3.0 * x
    dispatcher = jit_in_kernel_cache()(triple)
    assert dispatcher(2.0) == 6.0  # compiled; its machine code kept nowhere


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_among_the_cache_files_is_a_miss_not_a_hang(tmp_path, monkeypatch):
    # open() of a FIFO waits for a writer for ever: a FIFO where the cache
    # keeps a stored program, or in place of a compiled module's kernel
    # file, hung the process
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / "cache"))
    store("programs", "key", b"bytes")
    assert stored("programs", "key") == b"bytes"
    path = _stored_path("programs", "key")
    path.unlink()
    os.mkfifo(path)
    kernel = tmp_path / f"_{kernel_module_name('K = 1')}.py"
    os.mkfifo(kernel)
    assert within_seconds(5, stored, "programs", "key") is None
    with pytest.raises(dsl.GradError, match="cannot be read as a file"):
        within_seconds(5, load_kernel_files, [str(kernel)])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_loading_a_fifo_or_a_device_is_an_error_not_a_hang(tmp_path):
    # `gradc` refused them, but dsl.load of a FIFO waited for a writer for
    # ever, and of /dev/zero read until memory ran out
    pipe = tmp_path / "p.grad"
    os.mkfifo(pipe)
    devices = [Path("/dev/zero")] if Path("/dev/zero").exists() else []
    for path in [pipe] + devices:
        with pytest.raises(dsl.GradError) as info:
            within_seconds(5, dsl.load, path)
        assert str(info.value) == (f"{path}:1:1: error: cannot read {path}: it is not a regular "
                                   "file (a pipe or a device); write the source to a file")


def test_loads_takes_a_path_for_the_file_name(tmp_path):
    # a Path (as dsl.load takes) failed when called, sorted among the str
    # names of the modules it imports; None and other non-names failed
    # there too, with an internal TypeError
    (tmp_path / "lib.grad").write_text("def g(x):\n    return x * 2.0\n")
    m = dsl.loads("from lib import g\ndef f(x):\n    return g(x) + 1.0\n", tmp_path / "m.grad")
    np.testing.assert_array_equal(m.f(np.array([1.0, 2.5])), [3.0, 6.0])
    assert m.__file__ == str(tmp_path / "m.grad")
    with pytest.raises(TypeError, match=r"loads\(\) takes a file name \(a str or a path\), "
                                        "got None"):
        dsl.loads("def f(x):\n    return x\n", None)


SCRIPT = """
import sys, time
from numba.core import event
compiles = []
class Listener(event.Listener):
    def on_start(self, ev): compiles.append(ev)
    def on_end(self, ev): pass
event.register("numba:compile", Listener())
import numpy as np, dsl
m = dsl.load(sys.argv[1])
g = dsl.grad(m.loss, wrt=(0, 1, 2))(np.ones((3, 4)), np.ones((4, 2)), np.ones(2), np.zeros((3, 2)))
print(len(compiles), float(g[1].sum()), "lark" in sys.modules, "numpy.ma" in sys.modules)
"""


def test_second_process_compiles_nothing_and_concurrent_processes_agree(tmp_path):
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path / "cache")}
    dense = str(EXAMPLES / "dense.grad")
    # two cold processes at once: both succeed, no torn cache files
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, dense], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    cold = [r[0].split() for r in results]
    assert cold[0][1] == cold[1][1]
    warm = subprocess.run([sys.executable, "-c", SCRIPT, dense], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    n_compiles, value, lark_imported, masked_imported = warm.stdout.split()
    assert n_compiles == "0" and value == cold[0][1]
    # a warm process imports neither lark (its modules are stored parsed)
    # nor numpy.ma (no argument can be a masked array before it is imported)
    assert lark_imported == "False" and masked_imported == "False"
    assert cold[0][3] == "False"
    assert not list((tmp_path / "cache" / "kernels").glob(".tmp-*"))


def test_the_shipped_parser_tables_are_the_grammars_and_are_used():
    """The tables in the package were built from this grammar (a grammar
    edit without rebuilding them would cost every cold start ~0.1 s), and
    the parser is the one they hold."""
    from gradlang.compiler import lark_parser

    shipped = lark_parser.SHIPPED_TABLES.read_bytes()
    key = shipped.partition(b"\n")[0].decode()
    assert key == lark_parser._tables_key(), (
        "grammar/grad.lark-tables is stale: write gradlang.compiler.parser.shipped_tables() "
        "over it")
    source = (EXAMPLES / "dense.grad").read_text()
    fresh = lark.Lark(grammar_text(), **lark_parser._OPTIONS)
    assert lark_parser._parser().parse(source) == fresh.parse(source)


def test_threads_parse_at_once():
    # the one parser's indenter kept the parse under way: threads loading
    # modules at once got syntax errors and AssertionErrors at random
    from gradlang.compiler.parser import parse_with_lark

    source = "".join(f"def f{i}(x, y):\n    if x > 0.0:\n        r = (x + y) * 2.0\n"
                     f"    else:\n        r = x\n    return r\n\n" for i in range(20))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch often: the race every time)
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            modules = list(pool.map(lambda _: parse_with_lark(source, "p.grad"), range(12)))
    finally:
        sys.setswitchinterval(interval)
    # each thread's tree is the one a parse alone makes (a race could also
    # leave 20 functions with a statement lost or moved between them)
    alone = parse_with_lark(source, "p.grad")
    assert len(alone.funcs) == 20 and all(m == alone for m in modules)


def _double_into(x, out):
    for i in range(x.shape[0]):
        out[i] = 2 * x[i]


def test_runtime_helpers_keep_their_machine_code_in_the_kernel_cache(tmp_path, monkeypatch):
    # Numba put the CPU helpers' files beside the installed package, which
    # every cache directory shared: a fresh GRADC_CACHE_DIR was not cold
    # for them, and two processes could update one index at once.
    import numba

    from gradlang.runtime import cpu, loader
    assert Path(cpu._sum_rows._cache.cache_path).is_relative_to(loader.cache_dir())
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path))
    helper = numba.njit(_double_into)
    loader.cache_in_kernel_cache(helper)
    loader.manage_dispatcher(helper)
    out = np.zeros(3)
    helper(np.arange(3.0), out)
    np.testing.assert_array_equal(out, [0.0, 2.0, 4.0])
    saved = list((tmp_path / "numba").rglob("*_double_into-*.nbc"))
    assert len(saved) == 1 and saved[0].read_bytes().startswith(b"gradc-nbc-1\n")
    # a cache directory that cannot be made leaves Numba's own places
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
    loader.cache_in_kernel_cache(helper)
    assert not Path(helper._cache.cache_path).is_relative_to(tmp_path)
