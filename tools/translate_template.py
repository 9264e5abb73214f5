"""Print template.yaml as the SAM transform turns it into CloudFormation (JSON), offline.

Run with the SAM venv's interpreter (``.venv-sam/bin/python tools/translate_template.py [template | -]``): it has
aws-sam-translator, the library ``sam deploy``'s transform is built from. ``-`` reads the template as JSON (long-form
intrinsics) from standard input, as `devstack.sam.translate` sends it. Local code paths become placeholder S3 URIs (as
``sam validate`` does), and the managed-policy names SAM may attach resolve to their AWS ARNs without asking IAM, so
nothing leaves the machine. Tests read the output to check the policies, routes, log groups and alarms of what would
really deploy (tests/integration/test_template_security.py), and the local stack reads each function's role from it
(devstack/iam).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

#: The AWS managed policies SAM attaches to the roles it generates, by the names it asks for.
MANAGED_POLICIES = {
    "AWSLambdaBasicExecutionRole": "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    "AWSXrayWriteOnlyAccess": "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess",
    "AWSLambdaSQSQueueExecutionRole": "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole",
}


class _OfflinePolicies:
    def load(self) -> dict[str, str]:
        return MANAGED_POLICIES

    def get_managed_policy_map(self) -> dict[str, str]:
        return MANAGED_POLICIES


def main() -> None:
    argument = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    template = json.load(sys.stdin) if argument == "-" else yaml_parse(Path(argument).read_text())
    for resource in template.get("Resources", {}).values():
        properties = resource.get("Properties") or {}
        for key in ("CodeUri", "ContentUri"):
            if isinstance(properties.get(key), str):
                properties[key] = "s3://placeholder-bucket/placeholder-key"
    json.dump(transform(template, {}, _OfflinePolicies()), sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
