"""Golden tests: each tests/golden/*.grad file names a stage (`# emit:`)
and a signature (`# sig:`); its trailing `#|` comment lines hold what
`gradc show` prints for it (less the content hash of runtime/cpu_math.py
in the CPU kernel header, which changes with every edit there).
GOLDEN_UPDATE=1 rewrites them."""
import os
import re
from pathlib import Path

import pytest

from dsl.cli import main

GOLDEN = sorted((Path(__file__).resolve().parent / "golden").glob("*.grad"))


def split(path: Path):
    lines = path.read_text().splitlines()
    header = {l[2:].split(":", 1)[0]: l.split(":", 1)[1].strip()
              for l in lines if l.startswith("# ") and ":" in l[:12]}
    source = [l for l in lines if not l.startswith("#|")]
    expected = [l[3:] if l.startswith("#| ") else l[2:] for l in lines if l.startswith("#|")]
    return header, source, expected


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden(path, capsys, tmp_path):
    header, source, expected = split(path)
    copy = tmp_path / path.name
    copy.write_text("\n".join(source) + "\n")
    argv = ["show", str(copy), "--emit", header["emit"]]
    if "sig" in header:
        argv += ["--sig", header["sig"]]
    assert main(argv) == 0
    got = capsys.readouterr().out.replace(str(copy), path.name).rstrip("\n")
    got = re.sub(r"(# cpu_math) [0-9a-f]{12}$", r"\1 <hash>", got, flags=re.M).splitlines()
    if os.environ.get("GOLDEN_UPDATE"):
        path.write_text("\n".join(source + [("#| " + l) if l else "#|" for l in got]) + "\n")
        return
    assert got == expected


def test_every_stage_has_a_golden_file():
    stages = {split(p)[0]["emit"] for p in GOLDEN}
    assert {"ast", "ir", "grad-ir", "kernels", "grad-kernels"} <= stages
