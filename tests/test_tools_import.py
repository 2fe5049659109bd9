"""Every script in tools/ still imports: a package refactor that moves a name a benchmark or
builder uses breaks that script, and nothing else runs tools/ in CI (bench_video_peers.py
went a sitting without running after the tasks protocol moved ``ItemDecoder``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"

# In a child process: the scripts put their checkout on sys.path at import, which must not
# leak into this test process (the warm fork server is keyed by sys.path).
_IMPORT_ALL = """
import importlib, json, pathlib, sys
failed = {}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.py")):
    try:
        importlib.import_module(path.stem)
    except Exception as e:
        failed[path.name] = f"{type(e).__name__}: {e}"
print(json.dumps(failed))
"""


def test_every_tool_imports():
    scripts = sorted(TOOLS.glob("*.py"))
    assert len(scripts) > 20  # the folder is where this test thinks it is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOOLS), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, str(TOOLS)],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout.splitlines()[-1]) == {}
