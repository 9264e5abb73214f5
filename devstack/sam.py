"""SAM → CloudFormation offline, by aws-sam-translator (the library ``sam deploy``'s transform is built from).

aws-sam-translator lives in ``.venv-sam`` with the SAM CLI (``make sam-venv``: the CLI pins old boto3 and click), so
it runs there as ``tools/translate_template.py``. The output is cached under ``.devstack/translated/`` by the SHA-256
of the template, the script and the translator's version: a template is translated once (about 2 s), and every later
stack, test worker and function of it reads the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["SamTranslationError", "sam_python", "translate"]

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
TRANSLATE_SCRIPT: Final = REPO_ROOT / "tools" / "translate_template.py"
CACHE_DIR: Final = REPO_ROOT / ".devstack" / "translated"


class SamTranslationError(ValueError):
    """The SAM transform refused the template (its message says why), or ``.venv-sam`` is missing."""


def sam_python() -> Path:
    """The interpreter that has aws-sam-translator: ``.venv-sam/bin/python``, or ``$SASFLOW_SAM_PYTHON``."""
    override = os.environ.get("SASFLOW_SAM_PYTHON")
    return Path(override) if override else REPO_ROOT / ".venv-sam" / "bin" / "python"


def _translator_version(python: Path) -> str:
    for info in python.parent.parent.glob("lib/python3*/site-packages/aws_sam_translator-*.dist-info"):
        return info.name
    return "unknown"


def translate(template: Mapping[str, Any]) -> dict[str, Any]:
    """The CloudFormation template SAM would deploy for ``template`` (long-form intrinsics, as `load_template` gives).

    Parameters are left unresolved: the output does not depend on their values, and `devstack.template.Stack`
    resolves it for one stack.

    Raises
    ------
    SamTranslationError
        ``.venv-sam`` is missing (run ``make sam-venv``), or the transform refuses the template.
    """
    python = sam_python()
    if not python.is_file():
        raise SamTranslationError(f"the SAM translator's environment is missing ({python}): run `make sam-venv`")
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    key = hashlib.sha256(
        b"\0".join([text.encode(), TRANSLATE_SCRIPT.read_bytes(), _translator_version(python).encode()])
    ).hexdigest()
    cached = CACHE_DIR / f"{key}.json"
    try:
        return json.loads(cached.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    except (OSError, ValueError):
        pass
    completed = subprocess.run(  # nosec B603 # our own interpreter and script, no shell
        [str(python), str(TRANSLATE_SCRIPT), "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if completed.returncode != 0:
        lines = completed.stderr.strip().splitlines()
        raise SamTranslationError(f"the SAM transform refused the template: {lines[-1] if lines else 'no output'}")
    translated: dict[str, Any] = json.loads(completed.stdout)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Written whole, then renamed: a parallel test worker never reads half a file.
    with tempfile.NamedTemporaryFile("w", dir=CACHE_DIR, suffix=".tmp", delete=False, encoding="utf-8") as handle:
        handle.write(completed.stdout)
    Path(handle.name).replace(cached)
    return translated
