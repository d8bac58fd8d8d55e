"""Loading generated code.

Contract: `load_kernels(source)` writes a kernel module to the cache
directory under a name derived from its content hash (atomically, so
concurrent processes never see a torn file) and imports it once per
process; Numba's `cache=True` then keeps the machine code beside it, so a
second process with the same kernels compiles nothing.  Modules defining
one kernel (a loop's compiled form holds copies of its body's) share its
dispatcher, which compiles once per process (`_share_kernels`); machine
code calling another module's kernel loads that module from the cache
directory first.
`load_kernel_modules(sources)` loads several such modules (a program's
kernels, one module each, named by `kernel_module_name`, so that programs
share them) as one namespace; `load_kernel_files(paths)` does the same
for kernel modules written beside a compiled module (`gradc compile`),
each named, and its machine code stamped, by its bytes, so that the
directory keeps its machine code when moved, copied or installed.
`make_driver` turns a driver (its source or code) into a callable bound to
kernels.  `store(kind, key, data)` and `stored(kind, key)` keep bytes under
a key across processes (`compiler.pipeline` keeps built programs there):
behind a checksum, so that `stored` returns what was stored under that
key or None, never torn or corrupt bytes; and `source_stamp(package)`
names the version of a package's source files, for such keys.

The cache directory is `$GRADC_CACHE_DIR`, else `$XDG_CACHE_HOME/gradc`,
else `~/.cache/gradc`.  The runtime's own Numba helpers keep their
machine code there too (`cache_in_kernel_cache`), not beside the package:
in the directory named when the CPU target is first imported (a
process's first `dsl.load`), where kernels go where it names at the time.

Loading cached machine code is light: Numba prepares its whole CPU target
(every typing and lowering registry, importing SciPy where it is
installed: 0.2-0.4 s) before it reads a cached function, which needs only
Numba's runtime (NRT) to link against; a dispatcher whose cache this
module manages (`manage_dispatcher`: every kernel's, and the CPU helpers')
loads without that, and a miss compiles against a lean target
(`numba_target`), which skips the SciPy import.  The runtime's own
machine code, which Numba compiles in every process (20-60 ms), is stored
too (`store`), keyed by the versions of Numba and llvmlite and the CPU it
was compiled for.

A cache directory that Numba cannot write (a read-only one, shipped in a
container image or shared on a cluster) is read: Numba saves machine code
only where it can write (its own ~/.cache/numba then), and each kernel's
and helper's code is read first from its place in the cache directory
when that holds it.

The cache can never make a program fail or run stale code: a kernel file
whose bytes differ from the source is rewritten; a Numba index or data
file that cannot be read is purged and the kernel compiled again; and when
the cache directory cannot be written, kernels are written to a scratch
directory of this process instead (with one warning), so they run, just
without reuse across processes.
"""
from __future__ import annotations

import atexit
import copy
import functools
import hashlib
import importlib.util
import inspect
import os
import pickle
import re
import secrets
import shutil
import stat
import tempfile
import sys
import warnings
from pathlib import Path
from types import CodeType, ModuleType, SimpleNamespace
from typing import Callable, Iterable, Optional, Sequence

import llvmlite
import numba
import numpy as np
from numba.core.caching import (Cache, CompileResultCacheImpl, FunctionCache,
                                IndexDataCacheFile, UserProvidedCacheLocator)
from numba.core.compiler_lock import global_compiler_lock
from numba.core.errors import NumbaNotImplementedError, TypingError
from numba.core.cpu import CPUContext
from numba.core.registry import CPUDispatcher, cpu_target
from numba.core.runtime import nrtdynmod, rtsys
from numba.core.types import Array
from numba.np import numpy_support

from gradlang.runtime.collection import collection_paused
from gradlang.runtime.errors import GradError
from gradlang.runtime.forking import ChildSafeLock
from gradlang.runtime.interrupts import interrupts_deferred
from gradlang.runtime.numba_target import lean_target

_lock = ChildSafeLock()
_modules: dict[str, ModuleType] = {}
_scratch: Optional[Path] = None


def cache_dir() -> Path:
    root = os.environ.get("GRADC_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradc"


def write_atomic(path: Path, text: "str | bytes") -> None:
    """Write `text` to `path` through a temporary file and a rename, so a
    reader sees the old file or the new one.  The file gets the mode a
    plain open() would give (0666 less the umask), not mkstemp's 0600:
    compiled modules and shared caches must be readable by others."""
    data = text.encode() if isinstance(text, str) else text
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.read_bytes() == data:
        return
    tmp = path.parent / f".tmp-{os.getpid()}-{secrets.token_hex(8)}.py"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def kernel_module_name(source: str) -> str:
    """The name of the kernel module `source`: a hash of its text, so that
    equal kernels are one module, compiled once."""
    return "gradk_" + hashlib.sha256(source.encode()).hexdigest()[:24]


def load_kernels(source: str) -> ModuleType:
    name = kernel_module_name(source)
    with _lock:
        module = _modules.get(name)
        if module is None:
            module = _modules[name] = _import_source(name, source)
            _share_kernels(module)
        return module


# A generated kernel's name is a hash of its text (compiler/codegen.py):
# kernel modules defining one name and reading the same objects under the
# names it reads (its header's: `math` is libm's under GRADC_LIBM) define
# one kernel (a program's own module of it and the compiled loop that
# calls it, which holds its text to stand alone).  A full sum's `_all`
# variants read its `_chunk` (cpu.render_reducing_loop), a name of the
# module's own until shared.
_KERNEL_NAME = re.compile(r"k_[0-9a-f]{16}(_chunk|(_all)?(_serial)?)")
_kernels: dict[tuple, CPUDispatcher] = {}


def _share_kernels(module: ModuleType) -> None:
    """Point `module`'s kernels at the dispatchers of the first module of
    the cache that defined them, so that each compiles once per process
    (a loop body's kernels were compiled for the driver's first trips, then
    again inside the loop's compiled form).  The kernels that others read
    (`_chunk`s) first: a kernel's key holds what its names are bound to
    once shared."""
    names = sorted(vars(module), key=lambda name: not name.endswith("_chunk"))
    for name in names:
        value = vars(module)[name]
        if isinstance(value, CPUDispatcher) and _KERNEL_NAME.fullmatch(name):
            reads = value.py_func.__code__.co_names
            key = (name, tuple(id(vars(module).get(n)) for n in reads))
            shared = _kernels.setdefault(key, value)
            if shared is not value:
                setattr(module, name, shared)


def _import_source(name: str, source: str, home: Optional[Path] = None) -> ModuleType:
    """Import `source` as module `name` from the cache directory or, when
    that cannot be written or Numba cannot cache there, from the scratch
    directory; its machine code read first from `home` (by default its
    place in the cache directory) when that is where Numba cannot write."""
    path = cache_dir() / "kernels" / f"{name}.py"
    home = home or path.parent / "__pycache__"
    try:
        write_atomic(path, source)
        return _import_file(name, path, home)
    except (OSError, _NoCacheLocation) as err:
        path = _scratch_dir(err) / f"{name}.py"
        write_atomic(path, source)
        return _import_file(name, path, home)


class _NoCacheLocation(Exception):
    """Numba found no writable place for a kernel's cache files."""


def _scratch_dir(reason: Exception) -> Path:
    """This process's private kernel directory (removed at exit); the first
    call warns that the cache is not used."""
    global _scratch
    if _scratch is None:
        warnings.warn(f"gradc: cannot use the kernel cache {cache_dir()} ({reason}); "
                      "compiling without it (set GRADC_CACHE_DIR to a writable directory)",
                      RuntimeWarning, stacklevel=4)
        _scratch = Path(tempfile.mkdtemp(prefix="gradc-kernels-"))
        atexit.register(shutil.rmtree, _scratch, ignore_errors=True)
    return _scratch


def load_kernel_modules(sources: Sequence[str]) -> SimpleNamespace:
    """The names the kernel modules `sources` define, as one namespace."""
    return _namespace(load_kernels(source) for source in sources)


def load_kernel_files(paths: Sequence[str]) -> SimpleNamespace:
    """The names the kernel modules at `paths` define, as one namespace."""
    return _namespace(load_kernel_file(path) for path in paths)


def _namespace(modules: Iterable[ModuleType]) -> SimpleNamespace:
    """The names the modules define (their imports included, which agree)."""
    names: dict[str, object] = {}
    for module in modules:
        names.update((k, v) for k, v in vars(module).items() if not k.startswith("__"))
    return SimpleNamespace(**names)


def load_kernel_file(path: str) -> ModuleType:
    """Import a kernel module that lives at `path` (a compiled module's
    sibling), once per process."""
    key = os.path.abspath(path)
    with _lock:
        module = _modules.get(key)
        if module is None:
            digest = _kernel_file_digest(key)
            # Named, and its machine code stamped, by its bytes, not its place
            # or mtime (Numba's stamp): a compiled module's directory moved,
            # copied or installed elsewhere keeps the machine code cached in it
            # (unpickling that code imports the module by name).
            name = "gradk_aot_" + digest[:32]
            home = Path(key).parent / "__pycache__"
            try:
                module = _import_file(name, key, home)
            except _NoCacheLocation:
                with open(key, encoding="utf-8") as handle:
                    module = _import_source(name, handle.read(), home)
            for value in vars(module).values():
                cache_file = getattr(getattr(value, "_cache", None), "_cache_file", None)
                if isinstance(cache_file, _CheckedCacheFile):
                    cache_file._source_stamp = ("sha256", digest)
            _modules[key] = module
        return module


_KERNEL_FILE = re.compile(r"_gradk_([0-9a-f]{24})\.py")


def _kernel_file_digest(path: str) -> str:
    """The SHA-256 of kernel file `path`'s bytes; a `GradError` (not
    Python's error from deep in an import) where the file is gone or
    unreadable, or is not what gradc wrote: its name is a hash of its text
    (`kernel_module_name`), so a truncated, emptied or edited file shows."""
    redo = "; compile the module again with gradc compile"
    data = read_regular_file(Path(path))
    if data is None:
        raise GradError(f"kernel file {path} of a gradc-compiled module is missing or "
                        f"cannot be read as a file{redo}")
    digest = hashlib.sha256(data).hexdigest()
    named = _KERNEL_FILE.fullmatch(os.path.basename(path))
    # (line ends a checkout converted, git's autocrlf, are the same text)
    if named and not (digest.startswith(named.group(1)) or hashlib.sha256(
            data.replace(b"\r\n", b"\n")).hexdigest().startswith(named.group(1))):
        raise GradError(f"kernel file {path} of a gradc-compiled module is damaged (its "
                        f"bytes are not those gradc wrote){redo}")
    return digest


# A kernel module's name -> the directory where its machine code is kept
# (beside it in the kernel cache, or beside a compiled module) when Numba
# can write there; read first when Numba keeps it elsewhere (`_prefilled`).
_homes: dict[str, Path] = {}


def _import_file(name: str, path, home: Optional[Path] = None) -> ModuleType:
    _homes[name] = home or Path(path).parent / "__pycache__"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except RuntimeError as err:
        del sys.modules[name]
        if "no locator available" in str(err):  # Numba's words; nothing else says it
            raise _NoCacheLocation(str(err)) from None
        raise
    except BaseException:
        del sys.modules[name]
        raise
    for value in vars(module).values():
        manage_dispatcher(value)
    return module


def manage_dispatcher(dispatcher: object) -> None:
    """Give a Numba dispatcher (or cfunc) of generated code or of the
    runtime this module's policy (anything else is left as it is): a CPU dispatcher
    compiles against the lean target (`numba_target`); and one with a disk
    cache (`cache=True`) gets a light load of cached CPU machine code, an
    unreadable index or data file (torn, truncated, from another machine)
    taken as a miss and purged, so that the dispatcher compiles again and
    saves good ones, and a cache that cannot be saved a warning (once per
    process and cache directory), since the compiled code is good."""
    if isinstance(dispatcher, CPUDispatcher) and "compile" not in vars(dispatcher):
        _compile_lean(dispatcher)
        _type_plain_arrays(dispatcher)
    cache = getattr(dispatcher, "_cache", None)
    if not isinstance(cache, Cache) or isinstance(cache._cache_file, _CheckedCacheFile):
        return
    cache._cache_file.__class__ = _CheckedCacheFile
    # Numba ignores an index of another version: so indexes (and data
    # files) written before data carried checksums are quietly replaced.
    cache._cache_file._version += _CheckedCacheFile.VERSION_TAG
    load, save = cache.load_overload, cache.save_overload
    function = getattr(dispatcher, "py_func", None) or dispatcher.__wrapped__  # (a cfunc's)
    _read_prefilled(cache, function)

    def load_overload(sig, target_context):
        try:
            if not isinstance(target_context, CPUContext):
                return load(sig, target_context)  # CUDA's: its own target set up
            # What Numba's own load_overload does, less refreshing the
            # target: cached code needs only what it calls (NRT, and the
            # libraries it links against by name).
            _initialize_runtime(target_context)
            linked = _linked_python_functions(function)
            for needs, prepare in _LINKED_BY_NAME:
                if any(needs(f) for f in linked):
                    prepare()
            return _load_naming_modules(cache, sig, target_context)
        except Exception as err:  # any failure to read the cache is a miss
            warnings.warn(f"gradc: discarding the unreadable Numba cache of {cache._name} "
                          f"in {cache.cache_path} ({type(err).__name__}: {err}); recompiling",
                          RuntimeWarning, stacklevel=2)
            _purge(cache)
            return None

    def save_overload(sig, data):
        try:
            save(sig, data)
        except Exception as err:  # the code runs; only reuse is lost
            _unsaved(cache.cache_path, err)

    cache.load_overload, cache.save_overload = load_overload, save_overload


def _load_naming_modules(cache: Cache, sig, target_context):
    """`cache._load_overload(sig, target_context)`, the kernel modules its
    machine code names loaded first from the kernel cache where this
    process has not: unpickling it imports, by name, the module of each
    kernel it calls, which may be another module's than its own (a
    compiled loop calls the kernels `_share_kernels` gave its module: an
    earlier process's first module of each, another program's loop's)."""
    loaded: set[str] = set()
    while True:
        try:
            return cache._load_overload(sig, target_context)
        except ModuleNotFoundError as err:
            if err.name in loaded or not _load_cached_module(err.name):
                raise
            loaded.add(err.name)


def _load_cached_module(name: Optional[str]) -> bool:
    """Load the kernel module `name` from the kernel cache, where an
    earlier process wrote it (`load_kernels`); False where it is no kernel
    module's name or the cache holds no module of that name."""
    if name is None or not _MODULE_NAME.fullmatch(name):
        return False
    try:
        source = (cache_dir() / "kernels" / f"{name}.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if kernel_module_name(source) != name:
        return False
    load_kernels(source)
    return True


_MODULE_NAME = re.compile(r"gradk_[0-9a-f]{24}")


def _read_prefilled(cache: Cache, function: Callable) -> None:
    """Have `cache` read machine code first from the directory where this
    module keeps it, when Numba keeps it elsewhere because it cannot write
    there (Numba caches only where it can write: a read-only cache, shipped
    in a container image or shared on a cluster, was never read, and every
    kernel compiled once per user, into ~/.cache/numba) and that directory
    holds this function's index."""
    if isinstance(cache, _KernelCache):
        home = Path(_KernelCacheLocator(function, inspect.getfile(function)).get_cache_path())
    else:
        home = _homes.get(getattr(function, "__module__", None))
    if home is None or os.path.normpath(home) == os.path.normpath(cache.cache_path):
        return  # (both as Numba's locators write them: no file system calls)
    try:
        prefilled = (home / cache._cache_file._index_name).is_file()
    except OSError:  # (a name too long for the file system: is_file raises that one)
        return
    if prefilled:
        cache._cache_file._prefilled = str(home)


_said_unsaved: set[str] = set()


def _unsaved(where: str, err: Exception) -> None:
    """Warn that machine code cannot be saved: once per process and cache
    directory (a full disk fails every kernel's save; a message per kernel,
    each naming its function, would pass Python's once-per-message filter)."""
    root = str(cache_dir())
    if root in _said_unsaved:
        return
    _said_unsaved.add(root)
    warnings.warn(f"gradc: cannot save machine code in {where} ({type(err).__name__}: {err}); "
                  "kernels run, but later processes compile them again (said once)",
                  RuntimeWarning, stacklevel=3)


_LINKED_BY_NAME: list[tuple[Callable[[Callable], bool], Callable[[], object]]] = []


def _linked_python_functions(function: Callable) -> list[Callable]:
    """`function` and the Python functions of the Numba dispatchers it
    calls, theirs in turn: cached machine code holds its callees' (an XLA
    handler's holds its kernels', so a kernel's sin is named in no code
    of the handler's own)."""
    found, pending = {}, [function]
    while pending:
        fn = pending.pop()
        if id(fn) in found or not hasattr(fn, "__code__"):
            continue
        found[id(fn)] = fn
        for name in fn.__code__.co_names:
            callee = getattr(fn.__globals__.get(name), "py_func", None)
            if callee is not None:
                pending.append(callee)
    return list(found.values())


def before_cached_loads(needs: Callable[[Callable], bool], prepare: Callable[[], object]
                        ) -> None:
    """Run `prepare` (which must be cheap once done) before loading the
    cached CPU machine code of a Python function for which, or for one of
    whose callees, `needs` holds (a cheap test of its code): it makes a
    library that such code calls by symbol name known to the JIT linker,
    which would otherwise abort the process on the unresolved name."""
    _LINKED_BY_NAME.append((needs, prepare))


def _compile_lean(dispatcher: CPUDispatcher) -> None:
    """Compiles of `dispatcher` (a miss when called, or its typing from
    another function) run inside `numba_target.lean_target`, with Numba's
    runtime from the store, the garbage collector paused (`collection`)
    and Ctrl-C held back until they end (`interrupts`); a generated
    kernel's inputs are typed read-only (`_inputs_read_only`)."""
    compile_whole = dispatcher.compile
    inputs = _input_positions(dispatcher)

    def compile(sig):
        with interrupts_deferred(), lean_target(), collection_paused():
            _initialize_runtime(cpu_target.target_context)
            shared = _inputs_read_only(sig, inputs)
            if shared is None:
                return compile_whole(sig)
            try:
                entry = compile_whole(shared)
            except TypingError:  # it writes an input after all: as asked
                return compile_whole(sig)
            # calls with `sig`'s types run it from now on, without a compile
            dispatcher._insert([t._code for t in sig], entry, False)
            return entry
    dispatcher.compile = compile


def _type_plain_arrays(dispatcher: CPUDispatcher) -> None:
    """A NumPy array argument of type ndarray itself is typed as Numba's
    `typeof` types it (numba/core/typing/typeof.py `_typeof_ndarray`), less
    its test for a masked array, which imports numpy.ma (6-10 ms, in a
    process's first call of a kernel, compiled or cached): no ndarray is
    one.  Any other value (a subclass, a dtype Numba has no type for) is
    Numba's to type."""
    typeof_whole = dispatcher.typeof_pyval

    def typeof_pyval(value):
        if type(value) is not np.ndarray:
            return typeof_whole(value)
        try:
            dtype = numpy_support.from_dtype(value.dtype)
        except NumbaNotImplementedError:
            return typeof_whole(value)
        array = Array(dtype, value.ndim, numpy_support.map_layout(value),
                      readonly=not value.flags.writeable)
        dispatcher._types_active_call.add(array)  # as Numba's keeps the call's types alive
        return array
    dispatcher.typeof_pyval = typeof_pyval


# A generated kernel's input arrays are its parameters in0, in1, ...
# (compiler/codegen.py), which it only reads.
_INPUT_NAME = re.compile(r"in[0-9]+")


def _input_positions(dispatcher: CPUDispatcher) -> tuple[int, ...]:
    """The positions of a generated kernel's input arrays (none for the
    runtime's helpers, whose modules are not kernel modules)."""
    if not dispatcher.py_func.__module__.startswith("gradk_"):
        return ()
    code = dispatcher.py_func.__code__
    return tuple(i for i, name in enumerate(code.co_varnames[:code.co_argcount])
                 if _INPUT_NAME.fullmatch(name))


def _inputs_read_only(sig, inputs: tuple[int, ...]):
    """`sig` (argument types) with the arrays at `inputs` read-only, or None
    when that changes nothing.  NumPy's arrays type as writeable and JAX's
    (and any with `writeable` off) as read-only: Numba compiled a kernel
    once for each, to the same machine code (only the symbol names differ),
    so a test or a program handing it both paid its compile twice (in the
    suite, 77 of 1,800 kernel compiles, 9.5 s of CPU).  Typed read-only,
    one compile serves both: a writeable array converts to a read-only one
    (Numba's safe conversion), and the cache holds one entry."""
    if not inputs or not isinstance(sig, (tuple, list)):
        return None
    types = list(sig)
    changed = False
    for i in inputs:
        if i < len(types) and isinstance(types[i], Array) and types[i].mutable:
            types[i] = types[i].copy(readonly=True)
            changed = True
    return tuple(types) if changed else None


def _initialize_runtime(target_context) -> None:
    """Numba's `rtsys.initialize`, with the runtime library's machine code
    from the store: `rtsys.initialize` compiles it with
    `nrtdynmod.compile_nrt_functions`, which stands in for it meanwhile
    (under the compiler lock, which every caller of it holds)."""
    if rtsys._init:
        return
    with global_compiler_lock:
        compile_nrt = nrtdynmod.compile_nrt_functions
        nrtdynmod.compile_nrt_functions = _stored_nrt_functions
        try:
            rtsys.initialize(target_context)
        finally:
            nrtdynmod.compile_nrt_functions = compile_nrt


def _stored_nrt_functions(target_context):
    """What `nrtdynmod.compile_nrt_functions` returns (the runtime's library),
    from the store when an earlier process kept it."""
    def build():
        module, library = nrtdynmod.create_nrt_module(target_context)
        library.add_ir_module(module)
        return library
    return stored_library(target_context.codegen(), "numba runtime", "", build)


def stored_library(codegen, name: str, key: str, build: Callable[[], object]):
    """A finalized code library: from the store when an earlier process
    kept one under `name` and `key` (with Numba's and llvmlite's versions
    and the CPU), else `build()` (a library with its IR added), finalized
    and kept, as Numba keeps a cached function's library: as object code,
    with the bitcode that later compiles link in."""
    full_key = repr((name, key, numba.__version__, llvmlite.__version__,
                     codegen.magic_tuple()))
    data = stored("code-library", full_key)
    if data is not None:
        try:
            return codegen.unserialize_library(pickle.loads(data))
        except Exception:  # noqa: BLE001 (any failure: compile it instead)
            pass
    library = build()
    library.enable_object_caching()
    library.finalize()
    store("code-library", full_key, pickle.dumps(library.serialize_using_object_code()))
    return library


class _CorruptCacheFile(Exception):
    """A Numba data file whose bytes do not match their checksum."""


class _CheckedCacheFile(IndexDataCacheFile):
    """Numba's index and data files, the data (machine code) behind a
    SHA-256 of itself: LLVM aborts the process on corrupt object code, so
    it must never see any.  (A corrupt index only fails to unpickle.)"""

    VERSION_TAG = "+gradc-checked-1"
    _MAGIC = b"gradc-nbc-1\n"
    _prefilled: Optional[str] = None  # a directory read first (`_read_prefilled`)

    def load(self, key):
        if self._prefilled is not None:
            read_only = copy.copy(self)
            read_only._cache_path, read_only._prefilled = self._prefilled, None
            read_only._index_path = os.path.join(self._prefilled, self._index_name)
            data = read_only.load(key)
            if data is not None:
                return data
        return super().load(key)

    def _save_data(self, name: str, data) -> None:
        payload = self._dump(data)
        with self._open_for_write(self._data_path(name)) as handle:
            handle.write(self._MAGIC + hashlib.sha256(payload).digest() + payload)

    def _load_index(self):
        # (a FIFO in its place, which Numba's open() would wait on for ever,
        # is a corrupt file: a miss, purged)
        try:
            regular = stat.S_ISREG(os.stat(self._index_path).st_mode)
        except OSError:
            regular = True  # (not there: Numba's own miss)
        if not regular:
            raise _CorruptCacheFile(f"{self._index_path} is not a file")
        return super()._load_index()

    def _load_data(self, name: str):
        path = self._data_path(name)
        raw = read_regular_file(Path(path))
        if raw is None:
            raise _CorruptCacheFile(f"{path} cannot be read as a file")
        start = len(self._MAGIC) + 32
        digest, payload = raw[len(self._MAGIC):start], raw[start:]
        if not raw.startswith(self._MAGIC) or hashlib.sha256(payload).digest() != digest:
            raise _CorruptCacheFile(f"{path} does not match its checksum")
        return pickle.loads(payload)


class _KernelCacheLocator(UserProvidedCacheLocator):
    """Numba's files for a runtime helper, in the kernel cache
    (`cache_dir()/numba/...`, by the helper's source path) rather than
    beside the installed package: so a fresh `GRADC_CACHE_DIR` is cold for
    the helpers too, and processes of separate cache directories (test
    workers, users) never update one index at once."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        self._cache_path = str(cache_dir() / "numba" / self.get_suitable_cache_subpath(py_file))

    @classmethod
    def from_function(cls, py_func, py_file):
        # Numba's user-provided locator answers only under NUMBA_CACHE_DIR;
        # its source-file mixin checks that the directory can be made
        return super(UserProvidedCacheLocator, cls).from_function(py_func, py_file)


class _KernelCacheImpl(CompileResultCacheImpl):
    # the kernel cache first, else where Numba would put the files
    _locator_classes = [_KernelCacheLocator, *CompileResultCacheImpl._locator_classes]


class _KernelCache(FunctionCache):
    _impl_class = _KernelCacheImpl


def cache_in_kernel_cache(dispatcher: CPUDispatcher) -> None:
    """Give `dispatcher` (a runtime helper's, made with `cache=False`) a
    disk cache in the kernel cache, which `manage_dispatcher` then checks
    as any kernel's.  (Under NUMBA_DISABLE_JIT, `njit` gave back the plain
    function, which runs as Python and caches nothing.)"""
    if isinstance(dispatcher, CPUDispatcher):
        dispatcher._cache = _KernelCache(dispatcher.py_func)


def jit_in_kernel_cache(**options) -> Callable[[Callable], CPUDispatcher]:
    """numba.njit (nogil, no C wrapper) with a disk cache in the kernel
    cache, under this module's policy for dispatchers (lean compiles,
    checked cache files): for the runtime's helpers, and others' that
    generated code calls."""
    def wrap(fn: Callable) -> CPUDispatcher:
        dispatcher = numba.njit(nogil=True, no_cfunc_wrapper=True, **options)(fn)
        cache_in_kernel_cache(dispatcher)
        manage_dispatcher(dispatcher)
        return dispatcher
    return wrap


def _purge(cache: Cache) -> None:
    index = Path(cache._cache_file._index_path)
    stem = index.name[:-len(".nbi")]
    for path in [index, *index.parent.glob(f"{stem}.*.nbc")]:
        try:
            path.unlink()
        except OSError:
            pass  # gone already, or read-only: the save will warn


def compile_driver(driver_source: str) -> CodeType:
    return compile(driver_source, "<gradc driver>", "exec")


def make_driver(driver: "str | CodeType", kernels: "ModuleType | SimpleNamespace",
                helpers: ModuleType, trips: Optional[dict] = None) -> Callable:
    """The driver's `run`, given its source or `compile_driver`'s code.
    `trips`: how many trips each of the program's loops has run through
    its drivers (`cpu.loop_is_hot`), one count for all of them (a fresh one
    where not given)."""
    namespace = {"np": np, "K": kernels, "R": helpers, "inf": np.inf, "nan": np.nan,
                 "H": {} if trips is None else trips}
    exec(compile_driver(driver) if isinstance(driver, str) else driver, namespace)
    return namespace["run"]


# ------------------------------------------------------------ stored bytes

_STORE_MAGIC = b"gradc-store-1\n"


def _stored_path(kind: str, key: str) -> Path:
    return cache_dir() / kind / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".bin")


def store(kind: str, key: str, data: bytes) -> None:
    """Keep `data` under `key` (a text naming everything it depends on)
    for later processes; a cache directory that cannot be written keeps
    nothing (the kernel loader says so once)."""
    blob = _STORE_MAGIC + hashlib.sha256(key.encode() + data).digest() + data
    try:
        write_atomic(_stored_path(kind, key), blob)
    except OSError:
        pass


def stored(kind: str, key: str) -> Optional[bytes]:
    """What `store` kept under `key`, or None: never stored, unreadable,
    or not matching its checksum (which covers the key, so that bytes are
    only ever returned for the key they were stored under)."""
    blob = read_regular_file(_stored_path(kind, key))
    if blob is None:
        return None
    start = len(_STORE_MAGIC) + 32
    digest, data = blob[len(_STORE_MAGIC):start], blob[start:]
    if not blob.startswith(_STORE_MAGIC) or hashlib.sha256(key.encode() + data).digest() != digest:
        return None
    return data


def read_regular_file(path: Path, size: int = -1) -> Optional[bytes]:
    """The bytes of `path` (its first `size`, where given), or None where
    it cannot be read or is no regular file: a FIFO among a cache's files,
    which a plain open() waits on for ever, is opened without waiting and
    refused."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            return handle.read(size) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        except OSError:
            return None


@functools.lru_cache(maxsize=None)
def source_stamp(package: ModuleType) -> str:
    """A hash of the source files (.py, .lark, .grad) of a package and its
    subfolders: it changes whenever the package's code does."""
    root = Path(package.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".lark", ".grad") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]
