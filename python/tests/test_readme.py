"""README.md's quick start, its first Python block, run as printed against a real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import Server

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.MULTILINE | re.DOTALL)
    assert blocks, "README.md has no Python block"
    return str(blocks[0])


def test_the_readmes_quick_start_runs_as_printed(server: Server) -> None:
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{server.port}"}
    done = subprocess.run(
        [sys.executable, "-c", quick_start()], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"paid under fence \d+\n", done.stdout), done.stdout
    with server.client() as probe:
        assert probe.get("invoice:123:total") == b"10"
        assert probe.exists("invoice:123") == 0, "the lease was released"
