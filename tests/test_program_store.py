"""The program store (`pipeline.build_stored`): a later process with the
same function, transforms and argument types loads the generated code
without running the compiler's stages; anything that changes what they
would make (the source, an imported module, the transform, dtypes, ranks,
the pattern of sizes, a const value, GRADC_LIBM, the compiler's code,
Numba's version) builds again; a damaged entry is built again and
replaced.  "A later process" is a fresh `dsl.loads` (new callables, which
hold no programs) with the kernels forgotten."""
import sys

import numba
import numpy as np
import pytest

import dsl
from gradlang.compiler import pipeline
from gradlang.runtime import loader

SOURCE = "def f(x, y):\n    return x * y + 2.0 * x\n"
X = np.array([0.5, -2.0, 3.0])
Y = np.array([1.5, 4.0, -1.0])


@pytest.fixture(scope="module")
def shared_kernels(tmp_path_factory):
    """One kernel directory for the module: its kernels compile once."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture
def runs(tmp_path, monkeypatch, shared_kernels) -> list:
    """An empty program store (kernels shared), the stages not verified
    (which would bypass the store), and the names of the functions the
    IR passes ran on, in order."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kernels").symlink_to(shared_kernels)
    monkeypatch.setenv("GRADC_CACHE_DIR", str(cache))
    monkeypatch.delenv("GRADC_VERIFY", raising=False)
    monkeypatch.delenv("GRADC_LIBM", raising=False)
    names: list = []
    optimize = pipeline.optimize
    monkeypatch.setattr(pipeline, "optimize",
                        lambda fn, *a, **k: names.append(fn.name) or optimize(fn, *a, **k))
    return names


def new_process(monkeypatch) -> None:
    """Forget the loaded kernels, as a new process would not have them."""
    monkeypatch.setattr(loader, "_modules", {})
    monkeypatch.setattr(loader, "_kernels", {})
    for name in [n for n in sys.modules if n.startswith("gradk_")]:
        monkeypatch.delitem(sys.modules, name)


def grad_f(source=SOURCE, x=X, y=Y, **kwargs):
    return dsl.grad(dsl.loads(source).f, **kwargs)(x, y)


def test_a_later_process_runs_no_stage_and_gets_the_same_program(runs, monkeypatch):
    np.testing.assert_allclose(grad_f(), Y + 2.0)
    assert len(runs) == 1
    built = dsl.grad(dsl.loads(SOURCE).f)
    built(X, Y)
    new_process(monkeypatch)
    loaded = dsl.grad(dsl.loads(SOURCE).f)
    np.testing.assert_allclose(loaded(X, Y), Y + 2.0)
    assert len(runs) == 1
    # out= takes its result types from the stored program (no stage runs)
    buffer = np.empty(3)
    assert loaded(2.0 * X, Y, out=buffer) is buffer
    np.testing.assert_allclose(buffer, Y + 2.0)
    assert len(runs) == 1
    # the IR it shows is what the stages make
    assert pipeline.print_function(loaded.ir(X, Y)) == pipeline.print_function(built.ir(X, Y))


X32, Y32 = X.astype(np.float32), Y.astype(np.float32)


@pytest.mark.parametrize("change,expected", [
    (dict(source=SOURCE.replace("2.0", "3.0")), Y + 3.0),       # the source
    (dict(wrt=1), X),                                          # the transform
    (dict(x=X32, y=Y32), Y32 + np.float32(2.0)),                           # dtypes
    (dict(x=X[:, None], y=Y), np.full((3, 1), Y.sum() + 6.0)),  # ranks
    (dict(x=X, y=Y[:1]), np.full(3, Y[0] + 2.0)),              # the pattern of sizes
])
def test_a_change_of_what_lowering_reads_builds_again(runs, monkeypatch, change, expected):
    grad_f()
    new_process(monkeypatch)
    got = grad_f(**change)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert len(runs) == 2


def test_a_const_value_builds_again(runs, monkeypatch):
    source = "def f(x, k: const i32):\n    return x * k\n"
    g = dsl.grad(dsl.loads(source).f)
    np.testing.assert_allclose(g(X, 2), [2.0] * 3)
    new_process(monkeypatch)
    np.testing.assert_allclose(dsl.grad(dsl.loads(source).f)(X, 5), [5.0] * 3)
    assert len(runs) == 2


def test_a_change_in_an_imported_module_builds_again(runs, monkeypatch, tmp_path):
    (tmp_path / "helper.grad").write_text("def h(x):\n    return 2.0 * x\n")
    main = tmp_path / "main.grad"
    main.write_text("from helper import h\n\ndef f(x, y):\n    return x * y + h(x)\n")
    np.testing.assert_allclose(dsl.grad(dsl.load(str(main)).f)(X, Y), Y + 2.0)
    (tmp_path / "helper.grad").write_text("def h(x):\n    return 4.0 * x\n")
    new_process(monkeypatch)
    np.testing.assert_allclose(dsl.grad(dsl.load(str(main)).f)(X, Y), Y + 4.0)
    assert len(runs) == 2


def test_gradc_libm_builds_again_with_libm_kernels(runs, monkeypatch):
    grad_f()
    new_process(monkeypatch)
    monkeypatch.setenv("GRADC_LIBM", "1")
    g = dsl.grad(dsl.loads(SOURCE).f)
    np.testing.assert_allclose(g(X, Y), Y + 2.0)
    assert len(runs) == 2
    # what runs is the libm kernels, not the stored cpu_math ones
    (program,) = g._programs.values()
    assert "import math  # libm" in program.generated.kernel_header


@pytest.mark.parametrize("change", ["numba", "compiler"])
def test_another_numba_or_compiler_builds_again(runs, monkeypatch, change):
    grad_f()
    new_process(monkeypatch)
    if change == "numba":
        monkeypatch.setattr(numba, "__version__", numba.__version__ + ".post1")
    else:
        stamp = pipeline._stamp()
        monkeypatch.setattr(pipeline, "_stamp", lambda: ("edited",) + stamp)
    np.testing.assert_allclose(grad_f(), Y + 2.0)
    assert len(runs) == 2


def entries(cache_root) -> list:
    return sorted((cache_root / "programs").glob("*.bin"))


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "garbage"])
def test_a_damaged_entry_is_built_again_and_replaced(runs, monkeypatch, tmp_path, damage):
    grad_f()
    (entry,) = entries(tmp_path / "cache")
    data = bytearray(entry.read_bytes())
    if damage == "empty":
        data = bytearray()
    elif damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "flipped":
        for k in range(60, len(data), 7):
            data[k] ^= 0x24
    else:
        data = bytearray(b"\x80\x04garbage" * 40)
    entry.write_bytes(bytes(data))
    new_process(monkeypatch)
    np.testing.assert_allclose(grad_f(), Y + 2.0)
    assert len(runs) == 2
    new_process(monkeypatch)  # replaced: the next process loads it
    np.testing.assert_allclose(grad_f(), Y + 2.0)
    assert len(runs) == 2


def test_an_entry_is_never_read_under_another_key(runs, monkeypatch, tmp_path):
    grad_f(wrt=0)
    (first,) = entries(tmp_path / "cache")
    grad_f(wrt=1)
    (second,) = [e for e in entries(tmp_path / "cache") if e != first]
    second.write_bytes(first.read_bytes())  # d/dx's program where d/dy's belongs
    new_process(monkeypatch)
    np.testing.assert_allclose(grad_f(wrt=1), X)
    assert len(runs) == 3


def test_an_unwritable_store_still_runs(runs, monkeypatch, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("GRADC_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(loader, "_scratch", None)
    new_process(monkeypatch)
    with pytest.warns(RuntimeWarning, match="cannot use the kernel cache"):
        np.testing.assert_allclose(grad_f(), Y + 2.0)
    new_process(monkeypatch)
    np.testing.assert_allclose(grad_f(), Y + 2.0)
    assert len(runs) == 2
