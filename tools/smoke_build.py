"""Import every built function's handler the way Lambda would, from the output of `sam build`.

Each function is imported in its own interpreter (this Python, 3.12 = the Lambda runtime, started with -S so no
site-packages are visible) whose sys.path is only the function's built code dir (/var/task) and every built
layer's python/ dir (/opt/python). A dependency missing from a layer, a wheel built for the wrong Python, or a
handler that needs a development-only package fails here instead of on AWS.

Usage: .venv-sam/bin/python tools/smoke_build.py [.aws-sam/build]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


class _CfnLoader(yaml.SafeLoader):
    """Keeps CloudFormation short-form tags (!Ref, !Sub, ...) as plain values."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


_CfnLoader.add_multi_constructor("!", _tag)

PROBE = """
import importlib, sys
sys.path[:0] = sys.argv[1:-1]
module, _, attr = sys.argv[-1].rpartition(".")
handler = getattr(importlib.import_module(module), attr)
assert callable(handler), f"{sys.argv[-1]} is not callable"
"""


def main(build_dir: Path) -> int:
    template = yaml.load((build_dir / "template.yaml").read_text(), Loader=_CfnLoader)
    resources: dict[str, Any] = template["Resources"]
    globals_fn = template.get("Globals", {}).get("Function", {})
    layers = [
        str((build_dir / r["Properties"]["ContentUri"] / "python").resolve())
        for r in resources.values()
        if r["Type"] == "AWS::Serverless::LayerVersion"
    ]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
        "POWERTOOLS_TRACE_DISABLED": "true",
    }
    failures = 0
    for name, resource in sorted(resources.items()):
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        props = resource["Properties"]
        runtime = props.get("Runtime", globals_fn.get("Runtime"))
        if not str(runtime).startswith("python"):
            continue
        code = str((build_dir / props["CodeUri"]).resolve())
        result = subprocess.run(
            [sys.executable, "-S", "-c", PROBE, code, *layers, props["Handler"]],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            print(f"ok    {name}: {props['Handler']}")
        else:
            failures += 1
            print(f"FAIL  {name}: {props['Handler']}\n{result.stderr.strip()}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".aws-sam/build")))
