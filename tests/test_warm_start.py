"""A warm process reuses what an earlier one saved in the cache directory:
the parser tables (never a table of another grammar or a corrupt one), the
parsed modules (never for another text, file, grammar or parser), and the
machine code of the kernels and of Numba's runtime, loaded without
preparing Numba's whole CPU target."""
import os
import subprocess
import sys
from pathlib import Path

import lark
import numba
import pytest

from gradlang.compiler import ast, lark_parser, parser
from gradlang.grammar import grammar_text

ROOT = Path(__file__).resolve().parent.parent
SOURCE = (ROOT / "examples" / "log1pexp.grad").read_text()

# Parses SOURCE and prints the AST; with "--no-build", building parser
# tables (what a cache hit skips) fails the process.
PARSE = """
import sys, lark
if "--no-build" in sys.argv:
    def refuse(self, *args, **kwargs):
        raise SystemExit("built the parser tables")
    lark.Lark._build_parser = refuse
from gradlang.compiler.parser import parse_with_lark
print(repr(parse_with_lark(open(sys.argv[1]).read(), "log1pexp.grad")))
"""


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty GRADC_CACHE_DIR, with this process's parser forgotten, and
    the tables shipped in the package built for another lark or Python,
    so that the parser builds its tables and keeps them in the cache."""
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / "gradc"))
    stale = tmp_path / "shipped.lark-tables"
    stale.write_bytes(b"0" * 24 + b"\n")
    monkeypatch.setattr(lark_parser, "SHIPPED_TABLES", stale)
    lark_parser._parser.cache_clear()
    yield tmp_path / "gradc"
    lark_parser._parser.cache_clear()


def parse_in_process(cache: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRADC_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", PARSE, str(ROOT / "examples" / "log1pexp.grad"),
                           *flags], env=env, capture_output=True, text=True, timeout=120)


def tables(cache: Path) -> list[Path]:
    return sorted((cache / "parser").glob("*.lark"))


def test_a_fresh_process_parses_from_the_shipped_tables_without_building(tmp_path):
    cold = parse_in_process(tmp_path / "gradc", "--no-build")
    assert cold.returncode == 0, cold.stderr
    assert "FuncDef" in cold.stdout and tables(tmp_path / "gradc") == []
    # and the AST is what a parser built from scratch makes
    fresh = lark.Lark(grammar_text(), **lark_parser._OPTIONS)
    module = parser.parse_with_lark(SOURCE, "log1pexp.grad")
    tree = fresh.parse(SOURCE + "\n")
    assert repr(lark_parser._ToAst("log1pexp.grad", SOURCE).transform(tree)) == repr(module)
    assert repr(module) == cold.stdout.strip()


def test_another_lark_or_python_keeps_the_tables_it_builds(fresh_cache, monkeypatch):
    expected = repr(parser.parse_with_lark(SOURCE, "log1pexp.grad"))
    assert len(tables(fresh_cache)) == 1
    monkeypatch.setattr(lark.Lark, "_build_parser", refuse_to_build)
    lark_parser._parser.cache_clear()
    assert repr(parser.parse_with_lark(SOURCE, "log1pexp.grad")) == expected


def refuse_to_build(*args, **kwargs):
    raise AssertionError("built the parser tables")


def test_corrupt_tables_are_rebuilt_and_replaced(fresh_cache, monkeypatch):
    expected = repr(parser.parse_with_lark(SOURCE, "log1pexp.grad"))
    (table,) = tables(fresh_cache)
    good = table.read_bytes()
    build = lark.Lark._build_parser
    for damaged in (b"", good[:len(good) // 2], good[:80] + b"\x00" * (len(good) - 80)):
        table.write_bytes(damaged)
        lark_parser._parser.cache_clear()
        assert repr(parser.parse_with_lark(SOURCE, "log1pexp.grad")) == expected
        # rebuilt, and saved again: the next parser loads without building
        monkeypatch.setattr(lark.Lark, "_build_parser", refuse_to_build)
        lark_parser._parser.cache_clear()
        assert repr(parser.parse_with_lark(SOURCE, "log1pexp.grad")) == expected
        monkeypatch.setattr(lark.Lark, "_build_parser", build)


def test_another_grammar_never_reads_these_tables(fresh_cache, monkeypatch):
    parser.parse_with_lark(SOURCE)
    (first,) = tables(fresh_cache)
    # A grammar whose `return` is spelled `give` must not parse `return`.
    edited = grammar_text().replace("/return(?!", "/give(?!")
    assert edited != grammar_text()
    monkeypatch.setattr(lark_parser, "grammar_text", lambda: edited)
    lark_parser._parser.cache_clear()
    assert len(tables(fresh_cache)) == 1  # nothing written before a parse
    assert "FuncDef" in repr(parser.parse_with_lark(SOURCE.replace("return", "give")))
    assert first in tables(fresh_cache) and len(tables(fresh_cache)) == 2
    # (`return` is a plain name there: the error is at what follows it)
    with pytest.raises(lark_parser.GradError, match="syntax error: unexpected 'log'") as info:
        parser.parse_with_lark(SOURCE)
    assert (info.value.line, info.value.col) == (6, 12), str(info.value)


def test_unwritable_cache_directory_still_parses(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("GRADC_CACHE_DIR", str(blocker))
    lark_parser._parser.cache_clear()
    try:
        assert "FuncDef" in repr(parser.parse_with_lark(SOURCE))
    finally:
        lark_parser._parser.cache_clear()


def test_a_parsed_module_is_stored_and_loaded_without_lark(fresh_cache, monkeypatch):
    parsed = parser.parse(SOURCE, "log1pexp.grad")
    monkeypatch.setattr(parser, "parse_with_lark", refuse_to_build)
    loaded = parser.parse(SOURCE, "log1pexp.grad")
    assert loaded is not parsed and repr(loaded) == repr(parsed)
    assert loaded.source == SOURCE and loaded.funcs[0].span.file == "log1pexp.grad"


def test_stored_modules_are_kept_apart_by_text_file_and_parser(fresh_cache, monkeypatch):
    parser.parse(SOURCE, "log1pexp.grad")
    # another text, another file name (spans name it): parsed afresh
    edited = parser.parse(SOURCE.replace("e = exp(x)", "e = exp(x + 1.0)"), "log1pexp.grad")
    assert "1.0" in repr(edited)
    assert parser.parse(SOURCE, "other.grad").funcs[0].span.file == "other.grad"
    # another grammar or parser (their files' stamp): parsed afresh
    calls = []
    parse_with_lark = parser.parse_with_lark
    monkeypatch.setattr(parser, "parse_with_lark",
                        lambda *a: calls.append(a) or parse_with_lark(*a))
    real_stamp = parser.source_stamp
    monkeypatch.setattr(parser, "source_stamp", lambda package: "edited" + real_stamp(package))
    assert repr(parser.parse(SOURCE, "log1pexp.grad")) == repr(parse_with_lark(SOURCE,
                                                                               "log1pexp.grad"))
    assert len(calls) == 1


@pytest.mark.parametrize("damage", [b"", b"gradc-store-1\n" + b"\x00" * 40, None])
def test_a_damaged_stored_module_is_parsed_again_and_replaced(fresh_cache, monkeypatch,
                                                               damage):
    expected = repr(parser.parse(SOURCE, "log1pexp.grad"))
    (entry,) = (fresh_cache / "ast").glob("*.bin")
    good = entry.read_bytes()
    entry.write_bytes(damage if damage is not None else good[:-10] + b"\xff" * 10)
    assert repr(parser.parse(SOURCE, "log1pexp.grad")) == expected
    assert entry.read_bytes() == good
    monkeypatch.setattr(parser, "parse_with_lark", refuse_to_build)
    assert repr(parser.parse(SOURCE, "log1pexp.grad")) == expected


def test_a_module_nested_deeper_than_pickle_goes_is_stored_flat(fresh_cache, monkeypatch):
    # Pickling the AST of 3,000 chained additions recursed too deep: it was
    # never stored, and each process parsed it again (seconds, with lark).
    source = "def f(x):\n    return " + "x + " * 3000 + "(-x)\n"
    parsed = parser.parse(source)
    assert len(list((fresh_cache / "ast").glob("*.bin"))) == 1
    monkeypatch.setattr(parser, "parse_with_lark", refuse_to_build)
    (ret,) = parser.parse(source).funcs[0].body
    node, additions = ret.items[0].value, 0
    while isinstance(node, ast.BinOp):  # (x + x) + x ...: down the left
        node, additions = node.left, additions + 1
    assert additions == 3000 and node.id == "x"
    assert ast.dump(parser.parse(source)) == ast.dump(parsed)


# Runs log1pexp's value and gradient (its serial kernel, and at 2^16 its
# parallel one) and prints how often Numba refreshed its CPU target before
# a function the cache cannot have is compiled, whether it did for that
# one, and the largest error.
KERNELS = """
import sys, numpy as np
from numba.core import base
refreshes = []
refresh = base.BaseContext.refresh
base.BaseContext.refresh = lambda self: refreshes.append(1) or refresh(self)
import dsl
f = dsl.value_and_grad(dsl.load(sys.argv[1]).log1pexp)
errors = []
for x in (np.linspace(-5.0, 5.0, 1000), np.linspace(-5.0, 5.0, 1 << 16)):
    value, grad = f(x)
    errors += [np.abs(value - np.log1p(np.exp(x))).max(),
               np.abs(grad - 1 / (1 + np.exp(-x))).max()]
before = len(refreshes)
c = float(sys.argv[2])  # a constant of this run: a kernel no cache has
fresh = dsl.grad(dsl.loads(f"def new(x):\\n    return x * x * {c}\\n").new)(np.arange(4.0))
errors.append(np.abs(fresh - 2 * c * np.arange(4.0)).max())
print(before, len(refreshes) > before, max(errors))
"""


def test_cached_kernels_load_without_refreshing_numbas_target(tmp_path):
    # Each run takes the parallel kernel at 2^16 whatever the load: under
    # `auto`, a run on a busy machine (another test's process) took the
    # serial one, and the next run compiled the parallel one it lacked.
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
           "GRADC_PARALLEL": "always"}
    runs = []
    # cold, warm, then warm with the stored code libraries damaged (which
    # must be compiled again: LLVM aborts the process on bad object code)
    for c in ("3.5", "4.5", "5.5"):
        if c == "5.5":  # the runtime's library (no sin: no huge-argument one)
            libraries = sorted((tmp_path / "code-library").glob("*.bin"))
            assert len(libraries) == 1
            damaged_bytes = {}
            for library in libraries:
                data = bytearray(library.read_bytes())
                for k in range(100, len(data), 3):
                    data[k] ^= 0x5A
                library.write_bytes(bytes(data))
                damaged_bytes[library] = bytes(data)
        run = subprocess.run([sys.executable, "-c", KERNELS,
                              str(ROOT / "examples" / "log1pexp.grad"), c],
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        before, refreshed_for_new, error = run.stdout.split()
        assert float(error) < 1e-12 and refreshed_for_new == "True"
        runs.append(int(before))
    cold, warm, damaged = runs
    assert cold > 0 and warm == 0 and damaged == 0
    assert all(path.read_bytes() != data for path, data in damaged_bytes.items())


# sin and cos of arguments beyond 2^20 pi/2 call libm through a library of
# cpu_math's, which a process builds (or loads from the store) only for
# kernels that call sin, cos or tan: compiled, or loaded from the cache.
SIN = """
import sys, numpy as np
from numba.core import event
compiles = []
class Count(event.Listener):
    def on_start(self, e): pass
    def on_end(self, e): compiles.append(e)
import dsl
from gradlang.runtime import cpu_math
with event.install_listener("numba:compile", Count()):
    m = dsl.loads("def f(x):\\n    return sin(x) * cos(x)\\n")
    x = np.array([0.5, 1e22, -3e300, np.inf])
    error = np.nanmax(np.abs(m.f(x) - np.sin(x) * np.cos(x)))
    assert np.isnan(m.f(x)[3])
    built = cpu_math._huge_lane_library.cache_info().currsize
    dsl.value_and_grad(dsl.load(sys.argv[1]).log1pexp)(np.ones(3))
print(len(compiles), built, error)
"""


def test_the_huge_argument_library_is_linked_for_sin_kernels_only(tmp_path):
    # (that processes with log1pexp's kernels alone store the runtime's
    # library only is test_cached_kernels_load_without_refreshing_numbas_target's)
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    log1pexp = str(ROOT / "examples" / "log1pexp.grad")
    runs = []
    for _ in range(2):  # compiled, then loaded from the cache
        run = subprocess.run([sys.executable, "-c", SIN, log1pexp], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        compiles, built, error = run.stdout.split()
        assert int(built) == 1 and float(error) < 1e-15
        runs.append(int(compiles))
    assert runs[0] > 0 and runs[1] == 0
    assert len(list((tmp_path / "code-library").glob("*.bin"))) == 2  # the runtime's, sin's
    libm = {**env, "GRADC_CACHE_DIR": str(tmp_path / "libm"), "GRADC_LIBM": "1"}
    for _ in range(2):  # libm's sin: no library, compiled or loaded from the cache
        run = subprocess.run([sys.executable, "-c", SIN, log1pexp], env=libm,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        compiles, built, error = run.stdout.split()
        assert int(built) == 0 and float(error) < 1e-15


def test_a_cache_of_another_target_loads_through_numbas_own_path(tmp_path, monkeypatch):
    # CUDA's cache sets its own target up in Numba's load_overload (which
    # starts by refreshing the target); only the CPU's takes the light load.
    from gradlang.runtime import loader
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path))
    path = tmp_path / "gradk_other_target.py"
    path.write_text("import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    module = loader._import_file("gradk_other_target", path)
    refreshed = []

    class OtherTarget:
        def refresh(self):
            refreshed.append(True)
            raise LookupError("not a CPU target")

    with pytest.warns(RuntimeWarning, match="not a CPU target"):
        assert module.f._cache.load_overload((numba.float64,), OtherTarget()) is None
    assert refreshed == [True]
    assert module.f(1.0) == 2.0  # and the CPU's compiles and runs
    del sys.modules["gradk_other_target"]


def test_import_dsl_imports_no_numba():
    # Numba's import is 0.3-0.5 s; dsl imports it on first use (a check of
    # GNU OpenMP at `import dsl` that asked Numba made the import 0.45 s).
    probe = "import sys, dsl; print('numba' in sys.modules, 'lark' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False", "False"]
