"""Every benchmark script, started as ``python bench/<name>.py``, imports the project's packages,
not a same-named script of bench/ (bench/maintenance.py once shadowed the ``maintenance``
package for four other scripts: each failed in ``django.setup()``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name != "machine.py")

# As the interpreter starts a script: its folder first on the path; then the script's module
# code (not its main) runs, and the package names resolve.
PROBE = """
import importlib.util, runpy, sys
sys.path.insert(0, {bench!r})
runpy.run_path({script!r}, run_name="bench_probe")
for name in ("maintenance", "memory", "config"):
    origin = importlib.util.find_spec(name).origin
    assert origin.endswith(name + "/__init__.py"), (name, origin)
print("ok")
"""


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bench_script_sees_the_project_packages(script: str) -> None:
    bench = str(ROOT / "bench")
    code = PROBE.format(bench=bench, script=str(ROOT / "bench" / script))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
