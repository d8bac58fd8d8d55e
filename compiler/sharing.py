"""Kernel sharing: a loop runs as the kernel of a larger loop that contains it.

Contract: `share_kernels(steps, kernel_name)` returns the steps with some
loops rewritten so that fewer distinct kernels run (each is a Numba
compile in a cold process, 0.07-0.2 s): a loop L whose equations match
some of a larger loop M's (same ops, params and types, wired alike; M's
other equations arithmetic of no cost) becomes a copy of M computing L's
values, M's other values into scratch arrays, and M's other inputs read
from an input of L of the same type (`Loop.stand_ins`).  The copy is
accepted only when `kernel_name` renders it to M's kernel, so a match can
only ever save a kernel, never change one.  The price is bounded: at most
as many extra equations as L has, and they do arithmetic only.

(A gradient's first and last backward steps differ from the steps between
by an accumulation they have not started or no longer need: checkpoint's
plain gradient ran 5 kernels; sharing leaves 2.)
"""
from __future__ import annotations

from typing import Callable, Optional

from gradlang.compiler.fusion import Loop, Step
from gradlang.compiler.ir import Atom, Eqn, Lit, Var
from gradlang.compiler.ops import OPS


def share_kernels(steps: list[Step],
                  kernel_name: Callable[[Loop], Optional[str]]) -> list[Step]:
    """`kernel_name(loop)`: the kernel a loop renders to (None: it runs
    none, and is left alone)."""
    names = {id(s): kernel_name(s) for s in steps
             if isinstance(s, Loop) and not s.reductions}
    loops = [s for s in steps if names.get(id(s)) is not None]
    representative: dict[str, Loop] = {}
    for loop in loops:
        representative.setdefault(names[id(loop)], loop)
    # the largest kernels first: a kernel is dropped if a kept one covers it
    kept: list[Loop] = []
    host: dict[str, Loop] = {}
    for name, loop in sorted(representative.items(), key=lambda p: (
            -len(p[1].eqns), -len(p[1].outputs), -len(p[1].inputs))):
        big = next((m for m in kept if _cover(loop, m, kernel_name) is not None), None)
        if big is None:
            kept.append(loop)
        else:
            host[name] = big
    out = []
    for step in steps:
        if names.get(id(step)) in host:
            step = _cover(step, host[names[id(step)]], kernel_name) or step
        out.append(step)
    return out


def _cover(small: Loop, big: Loop, kernel_name: Callable[[Loop], str]) -> Optional[Loop]:
    """`big`'s equations on `small`'s values (see the module docstring), or
    None where they do not cover `small` or render another kernel."""
    if small.shape != big.shape or big.reductions or \
            len(big.eqns) > 2 * len(small.eqns):
        return None
    env: dict[Var, Atom] = {}  # big's values -> small's (or scratch)
    taken: set[int] = set()  # small's equations matched
    images: set[Var] = set()  # small's inputs given to a big input
    eqns: list[Eqn] = []
    # An equation reading a value of big's can only match one reading that
    # value's image: the fewest such readers are the candidates, not all of
    # small (a scan of all made covering a loop of a long chain cubic: 26 s
    # for two loops of 1,000 and 200 products).
    readers: dict[Var, list[int]] = {}
    for k, f in enumerate(small.eqns):
        for c in dict.fromkeys(a for a in f.inputs if isinstance(a, Var)):
            readers.setdefault(c, []).append(k)
    everything = range(len(small.eqns))
    for eqn in big.eqns:
        known = [readers.get(env[a], ()) for a in eqn.inputs if isinstance(a, Var) and a in env]
        candidates = min(known, key=len) if known else everything
        match = next((k for k in candidates if k not in taken and
                      _matches(eqn, small.eqns[k], big, small, env, images)), None)
        if match is not None:
            f = small.eqns[match]
            taken.add(match)
            for a, c in zip(eqn.inputs, f.inputs):
                if isinstance(a, Var) and a not in big.produced:
                    images.add(c)
                    env[a] = c
            outputs = f.outputs
        elif OPS[eqn.op].cost == 0:  # arithmetic, on scratch
            outputs = tuple(Var(v.type, "scratch") for v in eqn.outputs)
        else:
            return None
        env.update(zip(eqn.outputs, outputs))
        eqns.append(eqn)
    if len(taken) != len(small.eqns):
        return None
    stand_ins: dict[Var, Var] = {}
    for a in big.inputs:
        if a not in env:
            donor = next((v for v in small.inputs if v.type == a.type), None)
            if donor is None:
                return None
            env[a] = Var(a.type, "stand_in")
            stand_ins[env[a]] = donor
    outputs = [env[v] for v in big.outputs]
    if not set(small.outputs) <= set(outputs):
        return None

    def sub(a: Atom) -> Atom:
        return env[a] if isinstance(a, Var) else a

    shared = Loop(small.shape, small.start,
                  [Eqn(e.op, tuple(sub(a) for a in e.inputs), tuple(env[o] for o in e.outputs),
                       e.params, e.span) for e in eqns],
                  {env[o] for e in eqns for o in e.outputs},
                  [env[a] for a in big.inputs], outputs, stand_ins=stand_ins)
    return shared if kernel_name(shared) == kernel_name(big) else None


def _matches(e: Eqn, f: Eqn, big: Loop, small: Loop, env: dict, images: set) -> bool:
    """Whether small's equation `f` can be big's `e`: same op, params and
    types, and each input what the match so far makes e's, an input of
    big's new to it an input of small's new to it."""
    if (e.op, e.params) != (f.op, f.params) or \
            [v.type for v in e.outputs] != [v.type for v in f.outputs]:
        return False
    bound: dict[Var, Atom] = {}  # what this match adds to env and images
    for a, c in zip(e.inputs, f.inputs):
        if isinstance(a, Lit) or isinstance(c, Lit):
            if a != c:
                return False
        elif a in env or a in bound:
            if env.get(a, bound.get(a)) is not c:
                return False
        elif (a in big.produced or c in small.produced or c in images
              or c in bound.values() or a.type != c.type):
            return False
        else:
            bound[a] = c
    return True
