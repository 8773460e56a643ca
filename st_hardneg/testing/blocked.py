"""A saved model loaded the way a user without st-hardneg loads it: plain sentence-transformers in a fresh Python in
which ``st_hardneg`` cannot be imported (:func:`load_without_st_hardneg`), so a test can show that what st-hardneg
saves needs nothing of it, and that a folder which does need it (a kept train-only head) fails there.

Torch-free to import: the work happens in the subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BLOCKED_LOAD", "BlockedLoad", "load_without_st_hardneg"]

#: the script run by :func:`load_without_st_hardneg`: ``argv[1]`` the model folder, ``argv[2]`` the text; prints the
#: text's embedding (one JSON list), then one JSON object: the modules' class names, whether ``st_hardneg`` was
#: loaded, whether importing it fails
BLOCKED_LOAD = """
import json, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "st_hardneg" or name.startswith("st_hardneg."):
            raise ImportError("st_hardneg is blocked in this process")
sys.meta_path.insert(0, Block())
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
print(json.dumps(model.encode([sys.argv[2]], convert_to_tensor=True)[0].tolist()))
loaded = "st_hardneg" in sys.modules
try:
    import st_hardneg  # noqa: F401
    blocked = False
except ImportError:
    blocked = True
print(json.dumps({"modules": [type(m).__name__ for m in model], "loaded": loaded, "blocked": blocked}))
"""


@dataclass(frozen=True)
class BlockedLoad:
    """What the Python that could not import ``st_hardneg`` did: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    def read(self) -> tuple[list[float], dict[str, Any]]:
        """``(embedding, facts)``: the text's embedding and ``{"modules": the model's class names, "loaded":
        whether st_hardneg was imported, "blocked": whether importing it fails}``.

        Raises:
            ValueError: the process did not print the two lines (it failed: see :attr:`stderr`).
        """
        lines = self.stdout.strip().splitlines()
        if len(lines) != 2:
            raise ValueError(f"the blocked load printed {len(lines)} lines, not 2; stderr: {self.stderr[-2000:]}")
        return json.loads(lines[0]), json.loads(lines[1])


def load_without_st_hardneg(path: str | Path, text: str, timeout: float = 300) -> BlockedLoad:
    """Load the model saved at ``path`` with plain ``SentenceTransformer(path)`` in a fresh Python that cannot import
    ``st_hardneg`` and embed ``text``. A folder that needs st-hardneg (a kept train-only head) exits non-zero there,
    with the import error in :attr:`BlockedLoad.stderr`.

    Raises:
        TimeoutError: the load took longer than ``timeout`` seconds (the process is killed).

    Example:
        ::

            done = load_without_st_hardneg(out / "final", "my red cat sleeps .")
            assert done.returncode == 0, done.stderr
            vector, facts = done.read()
            assert facts == {"modules": ["Transformer", "Pooling"], "loaded": False, "blocked": True}
    """
    try:
        done = subprocess.run([sys.executable, "-c", BLOCKED_LOAD, str(path), text], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise TimeoutError(f"loading {path} without st_hardneg took over {timeout:g} s") from error
    return BlockedLoad(done.returncode, done.stdout, done.stderr)
