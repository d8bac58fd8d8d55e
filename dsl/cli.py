"""`gradc`: the command line.

Contract: `main(argv)` returns the exit status: 0 on success, 1 for an
error in the user's program or data (printed once as
`FILE:LINE:COL: error: MESSAGE` with the source line and a caret), 2 for a
usage error, 130 when interrupted (Ctrl-C).  No Python traceback reaches
the user.

    gradc run FILE.grad FN ARG... [--wrt K ...] [--param NAME=VALUE ...]
        ARG, VALUE: a number (nan and inf too), a list like [1, 2, 3], or a
        .npy file.
        Prints the value and the gradient of the sum of the outputs.
    gradc show FILE.grad [--fn NAME] --emit STAGE [--target T] [--sig ...]
        STAGE: one of `compiler.pipeline.EMITS`; prints the program there.
    gradc check PATH [--fn NAME] [--order N] [--seed S]
    gradc compile FILE.grad [-o DIR] [--sig SIG ...] [--target T] [--force]
    gradc --version

Usage errors: a missing input file, an unreadable argument, a function
name the file does not define, a bad `--sig`, an unknown, unset or
ill-shaped `--param`, a `--target` that cannot do what is asked here, an
output file gradc did not write.
"""
from __future__ import annotations

import argparse
import ast as pyast
import keyword
import os
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

import dsl
from dsl.aot import OutputError, SignatureError, SizesNeeded
from dsl.check import MAX_ORDER, check_function
from gradlang.compiler import ast, pipeline
from gradlang.compiler.modules import read_source
from gradlang.compiler.values import ReturnsSequence
from gradlang.runtime import target as targets
from gradlang.runtime.args import numeric_array
from gradlang.runtime.errors import UNKNOWN_SPAN, ArgumentError, GradError, one_line, shown
from gradlang.runtime.params import ParamError
from gradlang.runtime.target import TargetError


class UsageError(Exception):
    pass


NPY_MAGIC = b"\x93NUMPY"  # how every .npy file starts


def _parse_arg(text: str, what: str = "argument", may_be_none: bool = True):
    """The value `text` gives (`what` it is, in errors): a Python number or
    list, or a .npy file's array; an argument (`may_be_none`: not a
    --param's value) may be None too (for a `const` parameter of no dtype:
    binding refuses it for any other)."""
    if text.endswith(".npy"):
        path = Path(text)
        if not path.exists():
            raise UsageError(f"no such .npy file: {text}")
        try:
            with open(path, "rb") as file:
                if file.read(len(NPY_MAGIC)) != NPY_MAGIC:  # (NumPy says "pickled data")
                    raise UsageError(f"cannot read {text}: it is not a .npy file")
            return np.load(path, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise UsageError(f"cannot read {text}: {err}") from None
    try:
        value = pyast.literal_eval(_NamedFloats().visit(pyast.parse(text, mode="eval")))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise UsageError(f"cannot read {what} {_quoted(text)}: expected a number, a list "
                         "like [1, 2, 3], or a .npy file") from None
    if value is None and may_be_none:
        return None
    if not isinstance(value, (int, float, complex, list, tuple)):
        raise UsageError(f"cannot read {what} {_quoted(text)}: expected a number or a list")
    try:  # as the function will take it (an integer beyond 64 bits may be a float's value)
        numeric_array(f"{what} {_quoted(text)}", value, as_float=True)
    except ArgumentError as err:
        raise UsageError(err.message) from None
    return value  # converted to the parameter's dtype when bound


class _NamedFloats(pyast.NodeTransformer):
    """`nan` and `inf` as the floats (which Python literals cannot write)."""

    def visit_Name(self, node: pyast.Name) -> pyast.AST:
        if node.id in ("nan", "inf"):
            return pyast.copy_location(pyast.Constant(float(node.id)), node)
        return node


def _quoted(text: str, limit: int = 40) -> str:
    """`text` quoted for a message, its middle elided if it is long."""
    return repr(text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 2:]}")


def _call_arguments(texts: list[str], names: list[str]) -> tuple[list, dict]:
    """`run`'s ARGs as positional values and, for those written NAME=VALUE
    with NAME a parameter of the function, keyword ones (after which no
    positional one may come, as in Python)."""
    values, keywords = [], {}
    for text in texts:
        name, equals, value = text.partition("=")
        if equals and name in names:
            if name in keywords:
                raise UsageError(f"argument {name!r} is given twice")
            keywords[name] = _parse_arg(value, f"argument {name!r}")
        elif equals and name.isidentifier() and not text.endswith(".npy"):
            # (it said "cannot read argument 'q=2'")
            raise UsageError(f"{name!r} is not a parameter of the function: it takes "
                             f"{', '.join(names)}")
        elif keywords:
            raise UsageError(f"positional argument {text!r} follows a NAME=VALUE one")
        else:
            values.append(_parse_arg(text))
    return values, keywords


def _is_argument(text: str) -> bool:
    """Whether `text` reads as an argument of `run` (a number, a list, a
    .npy file)."""
    try:
        _parse_arg(text)
    except UsageError:
        return text.endswith(".npy")
    return True


def _format(value) -> str:
    """A result as printed: as NumPy prints it, to 8 digits (an f32's
    1.3132616, not its f64 digits), a scalar as a 0-d array is (a whole
    float with its 0: `1.0`, where NumPy writes `1.`)."""
    with np.printoptions(precision=8, suppress=False):
        text = np.array2string(np.asarray(value), separator=", ")
    return text + "0" if np.ndim(value) == 0 and text.endswith(".") else text


def _load(file: str) -> dsl.Module:
    return dsl.load(_existing(file))


def _named(text: str, what: str = "file") -> Path:
    """The path a command line argument names; an empty one names none
    (Path('') is '.': `gradc check ''` checked the working directory, and
    `gradc compile -o ''` wrote there)."""
    if not text:
        raise UsageError(f"no such {what}: '' (an empty path)")
    return Path(text)


def _existing(file: str) -> str:
    """`file`, or a usage error saying why it is not a readable file (a
    pipe or a device is refused: reading one may wait for ever, or never
    end)."""
    path = _named(file)
    if not path.exists():
        raise UsageError(f"no such file: {file}")
    if path.is_dir():
        raise UsageError(f"cannot read {file}: it is a directory")
    if not path.is_file():
        raise UsageError(f"cannot read {file}: it is not a regular file (a pipe or a device); "
                         "write the source to a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read {file}: permission denied")
    return file


def _set_params(module: dsl.Module, assignments: Sequence[str]) -> None:
    given = set()
    for assignment in assignments:
        name, equals, text = assignment.partition("=")
        if not equals or not name.strip():
            raise UsageError(f"--param takes NAME=VALUE, got {assignment!r}")
        if name.strip() in given:  # (which one was meant? the last silently won)
            raise UsageError(f"--param {name.strip()} is given twice")
        given.add(name.strip())
        try:
            module.params[name.strip()] = _parse_arg(text.strip(), f"--param {name.strip()}",
                                                    may_be_none=False)
        except ParamError as err:  # no such param
            raise UsageError(err.message) from None
        except ArgumentError as err:  # a value the param cannot take
            raise UsageError(f"--param {name.strip()}: {err.message}") from None


def _lookup(module: dsl.Module, name: str, file: str):
    """Function `name` of `module`; naming none is a usage error (the
    program is fine: there is no line of it to show)."""
    functions = module.functions
    if name not in functions:
        known = ", ".join(functions) or "none"
        what = (f"{name!r} is a param of {file}, not a function" if module.params.declares(name)
                else f"no function {name!r} in {file}")
        raise UsageError(f"{what} (it defines: {known})")
    return functions[name]


def cmd_run(args) -> int:
    module = _load(args.file)
    _set_params(module, args.param or ())
    f = _lookup(module, args.fn, args.file)
    for spec in f.param_specs:
        if spec.name not in module.params:
            raise UsageError(f"{args.fn}() reads param {spec.name!r}, which is not set; set "
                             f"it with --param {spec.name}=VALUE")
    names = {s.name for s in f.specs + f.param_specs}  # (a parameter may be named nan)
    for w in args.wrt or ():  # it takes every word after it: arguments too
        if not re.fullmatch(r"\d+", w, re.ASCII) and w not in names and _is_argument(w):
            raise UsageError(f"--wrt takes names and positions of parameters, got {w!r}; "
                             "give the arguments before --wrt")
    values, keywords = _call_arguments(args.args, [s.name for s in f.specs])
    if args.wrt:
        wrt = [_position(w, f) if re.fullmatch(r"\d+", w, re.ASCII) else w for w in args.wrt]
    else:  # every argument and param that gets a gradient (numbers become f64;
        # .npy keep theirs)
        given = {**dict(zip((s.name for s in f.specs), values)), **keywords}
        wrt = [s.name for s in f.specs if s.differentiable and s.name in given
               and not (isinstance(given[s.name], np.ndarray) and given[s.name].dtype.kind != "f")]
        wrt += [s.name for s in f.param_specs if s.differentiable]
    # everything is computed before anything is printed: an error (a bad
    # --wrt, an argument that cannot be differentiated) prints alone
    gradient = dsl.grad(f, wrt=tuple(wrt)) if wrt else None
    result = f(*values, **keywords)
    grads = gradient(*values, **keywords) if gradient else ()
    outs = result if isinstance(result, tuple) else (result,)
    for k, out in enumerate(outs):
        label = f"{args.fn}" if len(outs) == 1 else f"{args.fn}[{k}]"
        print(f"{label} = {_format(out)}")
    if not wrt:
        print("(no differentiable arguments)")
    for w, g in zip(wrt, grads):
        name = f.specs[w].name if isinstance(w, int) else w
        print(f"d/d{name} = {_format(g)}")
    return 0


def cmd_show(args) -> int:
    """Run the pipeline on each signature up to the stage `--emit` names
    (on the value and gradient for `grad-` stages, on the outputs and their
    tangents along every float argument for `jvp-` stages) and print it, as
    `gradc compile` compiles it."""
    from dsl.aot import ahead_of_time
    with ahead_of_time():
        return _show(args)


def _show(args) -> int:
    from dsl.aot import _lower, _types, default_sig, parse_sig, signed
    from dsl.forward import jvp_function
    module = _load(args.file)
    stage, transform = pipeline.stage_of(args.emit)
    if args.fn:
        _lookup(module, args.fn, args.file)
    names = [args.fn] if args.fn else [f.name for f in module._ast.funcs]
    if not names and not args.sig:  # (a --sig names a function)
        print(_terminal(args.file))
        _say_no_functions()
        return 0
    if args.sig:
        sigs = args.sig
        if args.fn and all(parse_sig(sig)[0] != args.fn for sig in sigs):
            raise UsageError(f"no --sig is of --fn {args.fn} (each is shown only for it)")
    elif stage != "check":
        sigs = [default_sig(_lookup(module, n, args.file))[0] for n in names]
    else:
        sigs = []
    # each --sig read and checked against its function first, also for the
    # AST, which no signature changes (then one per function they name)
    signed_sigs = [(sig, *parse_sig(sig)) for sig in sigs]
    functions = {name: signed(module.functions, name, sig, args.file)
                 for sig, name, _ in signed_sigs if not args.fn or name == args.fn}
    if stage == "check":  # (--fn may name an imported function: its own definition)
        for name in (functions if args.sig else names):
            print(ast.outline(_lookup(module, name, args.file).fdef))
        return 0
    for sig, name, sig_args in signed_sigs:
        if args.fn and name != args.fn:
            continue
        f = functions[name]
        types = _types(f, sig_args, sig)
        shown = f
        if transform:
            wrt = tuple(n for n, t in types.items() if t.is_float and
                        next(s for s in f.specs + f.param_specs if s.name == n).differentiable)
            if transform == "jvp":
                shown = jvp_function(f, wrt)
                types = {**types, **{t: types[n] for n, t in zip(wrt, shown.tangent_names)}}
            elif wrt:  # (with none, the value alone, as `gradc run` prints it)
                shown = dsl.value_and_grad(f, wrt=wrt)
        print(pipeline.emit(_lower(f, shown, types, sig_args), stage, args.target))
    return 0


def _terminal(text: str) -> str:
    """User text (a file name, a --sig) as gradc prints it: each character a
    terminal would act on (an escape sequence, a line break that forges a
    line of output) as U+FFFD, as a `GradError` shows it, and so each lone
    surrogate of a file name that is not UTF-8 (`os.fsdecode`), which a
    UTF-8 stream that is not the C locale's refuses to write (a
    UnicodeEncodeError traceback)."""
    return one_line(text)


def _say_no_functions() -> None:
    """What show and check print under a file that defines no function."""
    print("  (it defines no functions)")


def cmd_check(args) -> int:
    path = _named(args.path)
    failed = 0
    if path.is_dir():
        files = sorted(p for p in path.glob("*.grad") if not p.is_dir())  # (a dir: no module)
        if not files:
            raise UsageError(f"no .grad files in {path}")
        modules = []
        for file in files:  # one that does not load fails; the others are checked
            try:
                modules.append((file, dsl.load(file)))
            except GradError as err:
                print(_shown(err), file=sys.stderr)
                failed += 1
        if args.fn:  # checked in the files that define it
            modules = [(file, m) for file, m in modules if args.fn in m.functions]
            if not modules and not failed:
                raise UsageError(f"no function {args.fn!r} in any .grad file of {path}")
    else:
        modules = [(path, dsl.load(_existing(args.path)))]
    for file, module in modules:
        names = [args.fn] if args.fn else [f.name for f in module._ast.funcs]
        for name in names:
            _lookup(module, name, str(file))
        print(_terminal(str(file)), flush=True)  # the table comes once every column's width is known
        if not names:
            _say_no_functions()
            continue
        table: list[list[str]] = []
        # printed after the table, on stderr, each as a terminal shows it
        # (an error's own lines, its source line and caret, kept apart)
        messages: list[str] = []
        for name in names:
            f = _lookup(module, name, str(file))
            try:
                rows = check_function(f, module.params, args.order, args.seed)
            except ReturnsSequence:  # (a shape helper: its callers are checked)
                table.append([name] + [""] * 8 + ["skipped: returns a compile-time tuple"])
                continue
            except GradError as err:
                failed += 1
                table.append([name] + [""] * 8 + ["could not be checked (below)"])
                messages.append(_shown(err))
                continue
            if len(rows) == 0:  # (a result is falsy when a row failed)
                table.append([name] + [""] * 8 + [f"skipped: {rows.unchecked}"])
            for r in rows:
                errors = [f"{r.max_abs:.2e}", f"{r.max_rel:.2e}"] if r.points else ["-", "-"]
                table.append([r.function, r.dtype, str(r.order), r.wrt, r.source, str(r.points),
                              *errors, "yes" if r.nonfinite else "no", r.verdict])
            messages += [_terminal(f"{file}: warning: {w}") for w in rows.warnings]
            for r in rows.failures:
                failed += 1
                if r.nonfinite and r.against == "f64":
                    what = "is NaN/Inf in f32 where the f64 gradient or the f32 value is finite"
                elif r.nonfinite:
                    what = "has NaN/Inf where the function is finite"
                else:
                    against = "reverse mode" if r.against == "reverse" else "finite differences"
                    what = f"disagrees with {against} (max rel err {r.max_rel:.2g})"
                at = f", {r.failed_at}" if r.failed_at else ""
                messages.append(_terminal(f"{file}: error: {r.function}(): the order-{r.order} "
                                          f"gradient w.r.t. {r.wrt} from {r.source} {what}{at}"))
        header = ["function", "dtype", "order", "wrt", "gradient", "points", "max abs err",
                  "max rel err", "NaN/Inf", "verdict"]
        for line in _aligned([header] + table, right={2, 5, 6, 7}):
            print(f"  {line}")
        sys.stdout.flush()
        for message in messages:  # (a GradError's `str` shows its user text already)
            print(message, file=sys.stderr)
    return 1 if failed else 0


def _shown(err: GradError) -> str:
    """`err` as printed, with the source line under its position also where
    it came without the text (an argument's error, at the function's `def`)."""
    if err.source is None and err.span is not UNKNOWN_SPAN:
        try:
            err.with_source(read_source(Path(err.span.file), err.span))
        except (GradError, OSError):  # (not a file: the position alone)
            pass
    return str(err)


def _aligned(rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows of cells as lines whose columns start at the same offsets (each
    as wide as its widest cell); columns in `right` align right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def cmd_compile(args) -> int:
    from dsl.aot import compile_module
    progress = _progress if sys.stderr.isatty() else None
    file = _existing(args.file)
    out_dir = str(_named(args.output, "directory"))
    target = compile_module(file, out_dir, args.sig, args.target,
                            precompile=bool(args.sig), progress=progress, force=args.force,
                            note=lambda text: print(f"note: {_terminal(text)}", file=sys.stderr))
    if progress:
        sys.stderr.write("\n")
    print(f"wrote {_terminal(str(target))}")
    if not target.stem.isidentifier() or keyword.iskeyword(target.stem):
        print(f"note: {target.stem!r} is no name an import statement takes; load the module "
              "with importlib.util.spec_from_file_location, or rename the .grad file",
              file=sys.stderr)
    return 0


def _progress(message: str) -> None:
    sys.stderr.write("\r\033[K" + message)
    sys.stderr.flush()


def _position(digits: str, f) -> int:
    """A --wrt position, which `dsl.grad` checks; one of more digits than
    int() reads (4300: its ValueError, a traceback) is out of range."""
    try:
        return int(digits)
    except ValueError:
        raise UsageError(f"--wrt {shown(digits)} is out of range: {f.name}() has "
                         f"{len(f.specs)} parameter(s)") from None


def _at_least(minimum: int, what: str, maximum: float = float("inf")):
    """An argparse type: an integer from `minimum` to `maximum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {shown(text)}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradc", description="The .grad compiler.")
    parser.add_argument("--version", action="version", version=f"gradc {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a function and print its value and gradients")
    run.add_argument("file", help="the .grad file")
    run.add_argument("fn", help="the function to run")
    run.add_argument("args", nargs="*", help="arguments: numbers, [1, 2] lists, .npy files")
    run.add_argument("--wrt", nargs="+", help="differentiate w.r.t. these parameters "
                     "(names or positions); default: every differentiable one")
    run.add_argument("--param", action="append", metavar="NAME=VALUE",
                     help="set a param the function reads: a number, a list, or a .npy file")
    # argparse takes a negative number for an option unless it matches this
    # (its own pattern has no exponent: "-1e3"); run has no option like one
    run._negative_number_matcher = re.compile(r"^-(\.?\d|inf$|nan$)")
    run.set_defaults(func=cmd_run)
    show = sub.add_parser("show", help="print a compiler stage")
    show.add_argument("file")
    show.add_argument("--fn", help="only this function")
    show.add_argument("--emit", required=True, choices=pipeline.EMITS, metavar="STAGE",
                      help="the stage to stop after: " + ", ".join(pipeline.EMITS) +
                      " (grad-: on the value and gradient; jvp-: on the outputs and "
                      "their tangents; ir: the optimized IR)")
    show.add_argument("--target", default=targets.DEFAULT, choices=tuple(targets.TARGETS),
                      help="the target of loops, kernels and llvm (default: cpu)")
    show.add_argument("--sig", nargs="+", action="extend",
                      help="signatures like 'f(f64[:])' (default: f64 arrays of each "
                      "function's annotated, else rank-1, shape)")
    show.set_defaults(func=cmd_show)
    check = sub.add_parser("check", help="compare every gradient with finite differences "
                           "(f64) and with the f64 gradient (f32); NaN/Inf gradients fail")
    check.add_argument("path", help="a .grad file or a directory of them")
    check.add_argument("--fn", help="only this function")
    check.add_argument("--order", default=2,
                       type=_at_least(1, f"an order from 1 to {MAX_ORDER}", MAX_ORDER),
                       help=f"highest order, at most {MAX_ORDER}: each order's program "
                       "is about three times the size of the one below (default 2)")
    check.add_argument("--seed", type=_at_least(0, "a non-negative integer"), default=0,
                       help="seed of the random points")
    check.set_defaults(func=cmd_check)
    comp = sub.add_parser("compile", help="write an importable module of compiled kernels")
    comp.add_argument("file")
    comp.add_argument("-o", "--output", default=".", help="output directory (default: .)")
    comp.add_argument("--target", default=targets.DEFAULT, choices=tuple(targets.TARGETS))
    comp.add_argument("--sig", nargs="+", action="extend", help="signatures to compile now, like "
                      "'f(f64[:], f32[n, 3])'; the machine code is cached beside the module")
    comp.add_argument("--force", action="store_true",
                      help="overwrite NAME.py even if gradc did not write it")
    comp.set_defaults(func=cmd_compile)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gradlang")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # (a failure to write the output is caught here, not at exit)
        return status
    except (UsageError, OutputError) as err:
        print(f"gradc: error: {_terminal(str(err))}", file=sys.stderr)
        return 2
    except TargetError as err:  # --target names one that cannot do this here
        print(f"gradc: error: {_terminal(err.message)}", file=sys.stderr)
        return 2
    except SizesNeeded as err:  # a usage error too, at the expression needing a size
        print(_shown(err), file=sys.stderr)
        return 2
    except SignatureError as err:  # a bad --sig is a usage error
        note = f"\nnote: {_terminal(err.note)}" if err.note else ""
        print(f"gradc: error: {_terminal(err.message)}{note}", file=sys.stderr)
        return 2
    except GradError as err:
        print(_shown(err), file=sys.stderr)
        return 1
    except MemoryError as err:  # sizes the data asked for (NumPy says how much)
        print(f"gradc: error: out of memory: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the user knows; a traceback would bury it
        print("gradc: interrupted", file=sys.stderr)
        return 130  # (as a shell reports a command SIGINT ended)
    except BrokenPipeError:  # the reader went away (`gradc show ... | head`): quietly
        _drop_stdout()
        return 1
    except OSError as err:  # (inputs are checked as read: the output, to a full disk)
        _drop_stdout()
        print(f"gradc: error: {_terminal(str(err.strerror or err))}", file=sys.stderr)
        return 1


def _drop_stdout() -> None:
    """Send what is left of stdout to devnull: Python's flush of it at exit
    would fail again, with a message of its own."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
