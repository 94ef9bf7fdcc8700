"""Run hostile-input checks in a child process under an address-space limit and a timeout.

A regression in a size check must fail the test, not take the machine down or hang the
suite: the child gets ``RLIMIT_AS`` (so a claimed 4 TiB allocation raises ``MemoryError``
there) and a wall-clock timeout. The child prints one JSON line describing the outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PRELUDE = """
import json, resource, sys, traceback
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
def _report(kind, error=None, message="", value=None):
    print("HOSTILE-RESULT " + json.dumps(
        {{"kind": kind, "error": error, "message": message[:2000], "value": value}}))
try:
    import feedline as fl
    from feedline.errors import FeedlineError
    def body():
{body}
    _value = body()
    _plain = (int, float, str, list, dict, type(None))
    _report("ok", value=_value if isinstance(_value, _plain) else repr(_value))
except FeedlineError as exc:
    _report("feedline", type(exc).__name__, str(exc))
except MemoryError as exc:
    _report("raw", "MemoryError", traceback.format_exc())
except BaseException as exc:
    _report("raw", type(exc).__name__, traceback.format_exc())
"""


@dataclass
class Outcome:
    """What the child reported.

    ``kind`` is ``ok``, ``feedline`` (a FeedlineError), ``raw`` (any other exception),
    ``timeout`` or ``died``.
    """

    kind: str
    error: str | None
    message: str
    value: object = None
    stderr: str = ""


def run_limited(body: str, *, memory: int = 2 << 30, timeout: float = 60.0) -> Outcome:
    """Run ``body`` (the body of a function; ``fl`` is imported) in a limited child process.

    Parameters
    ----------
    body
        Python source run as a function body; its return value is reported as ``value``.
    memory
        The child's address-space limit in bytes (``RLIMIT_AS``; default 2 GiB, enough for
        pyarrow and numpy to import, far less than any hostile claim).
    timeout
        Seconds before the child is killed and the outcome is ``timeout``.
    """
    source = _PRELUDE.format(limit=memory, body=textwrap.indent(textwrap.dedent(body), " " * 8))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    try:
        done = subprocess.run(
            [sys.executable, "-c", source],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(REPO),
        )
    except subprocess.TimeoutExpired as exc:
        return Outcome("timeout", None, f"no result within {timeout} s", stderr=str(exc.stderr))
    for line in done.stdout.splitlines():
        if line.startswith("HOSTILE-RESULT "):
            data = json.loads(line[len("HOSTILE-RESULT ") :])
            return Outcome(data["kind"], data["error"], data["message"], data["value"], done.stderr)
    return Outcome("died", None, f"exit code {done.returncode}", stderr=done.stderr[-4000:])
