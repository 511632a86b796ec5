"""template.yaml as SAM deploys it: expanded by the SAM translator (the `aws-sam-translator`
package that `sam build`/`sam deploy` run), then its conditions and `Fn::If`s resolved for
given parameters (pgdrain.aws.local_invoke's resolver). What SAM adds (roles, managed policies,
permissions) is in the result, where a test can see it; the template's text does not show it."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pgdrain.aws import local_invoke

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
# The AWS managed policies SAM may attach by name, with their ARNs (the translator asks IAM
# for them otherwise).
MANAGED = {
    name: f"arn:aws:iam::aws:policy/{path}{name}"
    for name, path in (
        ("AWSLambdaBasicExecutionRole", "service-role/"),
        ("AWSLambdaVPCAccessExecutionRole", "service-role/"),
        ("AWSXrayWriteOnlyAccess", ""),
        ("AWSXRayDaemonWriteAccess", ""),
    )
}


class _Policies:
    def load(self) -> dict[str, str]:
        return dict(MANAGED)


def expand(template: Mapping[str, Any]) -> dict[str, Any]:
    """The CloudFormation template SAM makes of `template` (a CodeUri stands in for the S3
    object `sam deploy` uploads)."""
    from samtranslator.translator.transform import transform

    fragment = copy.deepcopy(dict(template))
    for resource in fragment["Resources"].values():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = "s3://bucket/handler.zip"
    loader: Any = _Policies()  # stands for its ManagedPolicyLoader, which asks IAM
    expanded: dict[str, Any] = transform(fragment, {}, loader)
    return expanded


def resolve(expanded: Mapping[str, Any], **parameters: Any) -> dict[str, Any]:
    """Its resources with the conditions decided for `parameters` (else the defaults): what
    CloudFormation creates. References to other resources stay as they are."""
    resolver = local_invoke.Resolver(expanded, region="us-east-1")
    resolver.parameters.update(parameters)
    resources: dict[str, Any] = {}
    for name, resource in expanded["Resources"].items():
        condition = resource.get("Condition")
        if condition is not None and not resolver.condition(condition):
            continue
        resources[name] = _resolve_ifs(resolver, resource)
    return resources


def _resolve_ifs(resolver: local_invoke.Resolver, node: Any) -> Any:
    """Fn::If and Ref AWS::NoValue decided; every other intrinsic left as written."""
    if isinstance(node, list):
        items = [_resolve_ifs(resolver, item) for item in node]
        return [item for item in items if item is not local_invoke.NO_VALUE]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Fn::If"}:
        condition, when_true, when_false = node["Fn::If"]
        return _resolve_ifs(resolver, when_true if resolver.condition(condition) else when_false)
    if node == {"Ref": "AWS::NoValue"}:
        return local_invoke.NO_VALUE
    resolved = {key: _resolve_ifs(resolver, value) for key, value in node.items()}
    return {k: v for k, v in resolved.items() if v is not local_invoke.NO_VALUE}


def statements(policy_document: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = policy_document.get("Statement", [])
    return [found] if isinstance(found, dict) else list(found)


def role_statements(role: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for policy in role["Properties"].get("Policies", []):
        yield from statements(policy["PolicyDocument"])


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
