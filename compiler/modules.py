"""Resolving `import` and `from ... import` between `.grad` files.

Contract: `namespace_for(module)` returns the checked `Namespace` of a
parsed module, loading what it imports: `NAME.grad` beside the importing
file, then in each directory of `$GRAD_PATH` (os.pathsep-separated), then
in the standard library (`compiler/stdlib/`).  Each file is parsed and checked
once per call; an import cycle, a missing module or a missing name is a
`GradError` at the import statement.  Imported modules' `param`s join the
importer's (a name declared twice is an error).  Each namespace records
the namespace each of its imports resolved to (`Namespace.imported`), so
that `import_graph(ns)` gives a module and all it reaches as plain values
(files, sources, links), and `namespace_for(module, in_graph(graph))`
checks them again from those values, reading no file (an unpickled
module, in a process where the files may be absent).
"""
from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import Callable, Hashable, Optional

from gradlang.compiler import ast
from gradlang.compiler.builtins import BUILTINS
from gradlang.compiler.checker import check, no_such_function
from gradlang.compiler.library import STDLIB
from gradlang.compiler.namespace import Namespace
from gradlang.compiler.parser import parse
from gradlang.compiler.source import too_deep, universal_newlines
from gradlang.runtime.errors import GradError, Span



def search_path(importer: str) -> list[Path]:
    dirs = []
    here = Path(importer)
    if here.suffix == ".grad" and here.parent.exists():
        dirs.append(here.parent)
    else:
        dirs.append(Path.cwd())
    dirs += [Path(p) for p in os.environ.get("GRAD_PATH", "").split(os.pathsep) if p]
    dirs.append(STDLIB)
    return dirs


def find_module(name: str, importer: str) -> Optional[Path]:
    for directory in search_path(importer):
        candidate = directory / f"{name}.grad"
        try:
            if candidate.is_file():
                return candidate
        except OSError:  # a name the file system cannot hold
            continue
    return None


def read_source(path: Path, span: Span) -> str:
    """The text of the `.grad` file at `path` as the parser reads it: UTF-8,
    without the byte-order mark an editor may put first, its lines ending
    in '\\n' (`universal_newlines`).  Unreadable is a `GradError` at `span`
    (where the file was named); bytes that are not UTF-8 one at those bytes."""
    data = _regular_file_bytes(path, span).removeprefix(codecs.BOM_UTF8)
    try:
        return universal_newlines(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        before = universal_newlines(data[:err.start].decode("utf-8"))
        where = Span(str(path), before.count("\n") + 1, len(before) - before.rfind("\n"))
        raise GradError(f"the file is not UTF-8 text: byte 0x{data[err.start]:02x} cannot "
                        "start a character here", where,
                        universal_newlines(data.decode("utf-8", "replace"))) from None


def _regular_file_bytes(path: Path, span: Span) -> bytes:
    """The bytes of the regular file at `path`, else a `GradError` at
    `span`.  A pipe is opened without waiting for a writer and refused, as
    a device is: `dsl.load` of a FIFO waited for ever, and of /dev/zero
    read until memory ran out (the command line refused them, but not
    `dsl.load`, the import hook, or a file that became one since)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise GradError(f"no such file: {path}", span) from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise GradError(f"cannot read {path}: {err}", span) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise GradError(f"cannot read {path}: it is a directory", span)
        if not stat.S_ISREG(mode):
            raise GradError(f"cannot read {path}: it is not a regular file (a pipe or a "
                            "device); write the source to a file", span)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as err:
        raise GradError(f"cannot read {path}: {err}", span) from None
    finally:
        os.close(fd)


def _no_param_named_like_a_function(module: ast.Module, ns: Namespace) -> None:
    """A param and a function of one name would make the name a value in
    one place and a function in another; the error is at the later of
    the two where the module declares both, else at the module's own
    declaration of either, else at the import."""
    for name in sorted(ns.params.keys() & ns.functions.keys()):
        fdef, home = ns.functions[name]
        if ns.params[name] in module.params and home is ns:
            # (it said "as an imported function" of a def in this module)
            param = ns.params[name]
            if param.span.line < fdef.span.line:
                span, what = fdef.span, f"a param at line {param.span.line}"
            else:
                span, what = param.span, f"a function at line {fdef.span.line}"
        elif ns.params[name] in module.params:
            span, what = ns.params[name].span, "an imported function"
        elif home is ns:
            span, what = fdef.span, "a param of an imported module"
        else:
            span = next(i.span for i in module.imports if name in (i.names or ()))
            what = "a param of another imported module"
        raise GradError(f"{name!r} is already defined, as {what}", span)


def _no_param_named_like_a_module(module: ast.Module, ns: Namespace) -> None:
    """A param named as a module this one imports (`import std` and `param
    std: f64`) would make `std` the param and `std.relu` the module's
    function: a function reading only `std.relu(x)` was said to read the
    param, and refused until it was set.  The error is at the module's own
    declaration, else at the import."""
    for name in sorted(ns.params.keys() & ns.modules.keys()):
        if ns.params[name] in module.params:
            span, what = ns.params[name].span, "an imported module"
        else:
            span = next(i.span for i in module.imports if i.module == name and i.names is None)
            what = "a param of an imported module"
        raise GradError(f"{name!r} is already defined, as {what}", span)


# A module and every module its imports reach: (file, source, ((import
# name, index of the module it resolved to), ...)) each, the module first.
ImportGraph = tuple[tuple[str, str, tuple[tuple[str, int], ...]], ...]
# (the key that makes a module load once, its file name, a reader of its source)
Located = tuple[Hashable, str, Callable[[], str]]
# (an import statement, the module it is in, that module's key: None for the first)
Finder = Callable[[ast.Import, ast.Module, Optional[Hashable]], Located]


# Python's array libraries, imported as a NumPy, JAX or torch program would:
# their functions are the language's builtins, called by name.
_BUILTINS_HINT = ("; imports are of .grad files: NumPy's functions are builtins here, "
                  "called by their name alone (exp(x), sum(x, axis=1))")
PYTHON_LIBRARIES = {name: _BUILTINS_HINT for name in ("numpy", "jax", "torch", "math", "scipy")}


def on_disk(imp: ast.Import, importer: ast.Module, importer_key: Optional[Hashable]) -> Located:
    """The `.grad` file an import names, found on `search_path`."""
    path = find_module(imp.module, importer.file)
    if path is None:
        where = ", ".join(str(d) for d in search_path(importer.file))
        hint = PYTHON_LIBRARIES.get(imp.module.split(".")[0], "")
        raise GradError(f"cannot find module {imp.module!r} ({imp.module}.grad in "
                        f"{where}){hint}", imp.span)
    return str(path.resolve()), str(path), lambda: read_source(path, imp.span)


def in_graph(graph: ImportGraph) -> Finder:
    """Imports resolved as `graph` (`import_graph`) records them."""
    def find(imp: ast.Import, importer: ast.Module, importer_key: Optional[Hashable]) -> Located:
        index = dict(graph[0 if importer_key is None else importer_key][2])[imp.module]
        file, source, _ = graph[index]
        return index, file, lambda: source
    return find


def import_graph(namespace: Namespace) -> ImportGraph:
    """`namespace`'s module and every module its imports reach, as plain
    values, in the order first reached (the module first)."""
    order: dict[int, int] = {}
    reached: list[Namespace] = []
    todo = [namespace]
    while todo:
        ns = todo.pop(0)
        if id(ns) not in order:
            order[id(ns)] = len(reached)
            reached.append(ns)
            todo += ns.imported.values()
    return tuple((ns.module.file, ns.module.source,
                  tuple((name, order[id(sub)]) for name, sub in ns.imported.items()))
                 for ns in reached)


def namespace_for(module: ast.Module, find: Finder = on_disk, _key: Optional[Hashable] = None,
                  _loading: Optional[dict] = None) -> Namespace:
    loading: dict[Hashable, Optional[Namespace]] = {} if _loading is None else _loading
    ns = Namespace(module)
    for imp in module.imports:
        key, file, read = find(imp, module, _key)
        if key in loading and loading[key] is None:
            raise GradError(f"import cycle through {imp.module!r}", imp.span)
        if key not in loading:
            loading[key] = None
            loading[key] = namespace_for(parse(read(), file), find, key, loading)
        sub = loading[key]
        ns.imported[imp.module] = sub
        if imp.names is None:
            ns.modules[imp.module] = sub
        else:
            for name in imp.names:
                if name in BUILTINS and name not in sub.functions:
                    continue  # a builtin (`from std import sigmoid`): already everywhere
                if name not in sub.functions:
                    raise GradError(no_such_function(imp.module, name, sub, importing=True),
                                    imp.span)
                earlier = ns.functions.get(name)
                if earlier is not None and earlier[0] is not sub.functions[name][0]:
                    # (as a def after the import is: the later one once won silently)
                    raise GradError(f"function {name!r} is already imported, from "
                                    f"{earlier[1].module.file}", imp.span)
                ns.functions[name] = sub.functions[name]
        for pname, decl in sub.params.items():
            if pname in ns.params and ns.params[pname] is not decl:
                raise GradError(f"param {pname!r} is declared by two imported modules",
                                imp.span)
            ns.params[pname] = decl
    for f in module.funcs:
        if f.name in ns.functions:
            raise GradError(f"function {f.name!r} is already imported", f.span)
    for f in module.funcs:
        ns.functions[f.name] = (f, ns)
    for p in module.params:
        if p.name in ns.params:
            own = ns.params[p.name] in module.params
            raise GradError(f"param {p.name!r} is already declared"
                            + ("" if own else " by an import"), p.span)
        ns.params[p.name] = p
    _no_param_named_like_a_function(module, ns)
    _no_param_named_like_a_module(module, ns)
    try:
        check(module, ns)
    except GradError as err:
        raise err.with_source(module.source)
    except RecursionError:
        raise too_deep(module.source, module.file) from None
    return ns
