"""`pgdrain invoke`: run the function's handler in this process the way `sam local invoke` runs
it in a container, without Docker.

From template.yaml it takes the function's Handler, CodeUri, Timeout, MemorySize and
Environment (with Globals, and CloudFormation intrinsics resolved from parameter defaults, as
sam does); env.json (`--env-vars`) overrides variables the template declares and only those.
Unlike sam, a variable the template leaves empty takes this shell's value, so
`DATABASE_URL=... pgdrain invoke` works; with no database at all the embedded PostgreSQL is
used, as the CLI does. The context's remaining time counts down from the template's Timeout.
What the function prints (logs, metrics) goes to stderr; the result is returned for stdout."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pgdrain.api import jsonbound
from pgdrain.api.registry import on_sys_path
from pgdrain.aws.context import FakeContext
from pgdrain.errors import BadInput

DEFAULT_TEMPLATE = "template.yaml"
FUNCTION_TYPES = ("AWS::Serverless::Function", "AWS::Lambda::Function")
SAM_DEFAULT_TIMEOUT = 3
SAM_DEFAULT_MEMORY = 128
LOCAL_ACCOUNT = "123456789012"
LOCAL_STACK = "local"
DATABASE_VARIABLES = ("DATABASE_URL", "PGDRAIN_DB_SECRET_ARN")
MAX_EVENT_BYTES = 6 * 1024 * 1024  # Lambda's payload limit for a synchronous invoke


class Unresolved:
    """An intrinsic that cannot be resolved without a deployed stack (GetAtt, ImportValue...)."""

    def __repr__(self) -> str:
        return "<unresolved>"


UNRESOLVED = Unresolved()
NO_VALUE = object()  # AWS::NoValue: the property is dropped


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    function_name: str
    handler: str  # module.function
    code_dir: Path
    timeout: int
    memory_size: int
    environment: dict[str, str] = field(default_factory=dict)  # every declared variable
    # Every function of the template, by logical id: the sections an env.json may hold.
    template_functions: tuple[str, ...] = ()


@dataclass(frozen=True)
class InvokeResult:
    payload: Any  # what the handler returned, or Lambda's error shape if it raised
    failed: bool  # it raised or timed out, or it returned {"ok": false}
    ignored_overrides: tuple[str, ...] = ()
    # Set in the shell, but the template gives a value of its own (as the stack would): unused.
    shell_unused: tuple[str, ...] = ()


def local_context(
    spec: FunctionSpec, region: str, clock: Callable[[], float] = time.monotonic
) -> FakeContext:
    """A Lambda context whose remaining time counts down from the function's Timeout."""
    return FakeContext(
        spec.timeout,
        f"arn:aws:lambda:{region}:{LOCAL_ACCOUNT}:function:{spec.function_name}",
        clock=clock,
        memory_mb=spec.memory_size,
        log_stream=f"local/[$LATEST]{uuid.uuid4().hex}",
    )


# -- template.yaml -------------------------------------------------------------------------


def load_template(path: Path) -> dict[str, Any]:
    """Parse a CloudFormation/SAM template; short-form intrinsics (!Ref, !Sub, !If, ...) become
    their long form ({"Ref": ...}, {"Fn::Sub": ...})."""
    try:
        import yaml
    except ImportError:
        raise BadInput(
            "`pgdrain invoke` reads template.yaml with PyYAML, which is not installed: "
            "pip install PyYAML (pgdrain's [invoke] extra)"
        ) from None

    class CloudFormationLoader(yaml.SafeLoader):
        pass

    def intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
        value: Any
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        if suffix == "GetAtt" and isinstance(value, str):
            value = value.split(".", 1)
        key = suffix if suffix in ("Ref", "Condition") else f"Fn::{suffix}"
        return {key: value}

    CloudFormationLoader.add_multi_constructor("!", intrinsic)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(
            f"no template {path}: run `pgdrain invoke` in the folder of a SAM project "
            "(`pgdrain init` writes one), or name its template with --template"
        ) from None
    except OSError as exc:
        raise BadInput(f"cannot read the template {path}: {exc.strerror}") from None
    try:
        document = yaml.load(text, Loader=CloudFormationLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise BadInput(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise BadInput(f"{path} is not a template: it has no Resources")
    return document


def read_function(template_path: Path, logical_id: str | None = None) -> FunctionSpec:
    template = load_template(template_path)
    functions = {
        name: resource
        for name, resource in template["Resources"].items()
        if isinstance(resource, dict) and resource.get("Type") in FUNCTION_TYPES
    }
    every_function = tuple(sorted(functions))
    if logical_id is None:
        # A function whose Condition is false under the defaults (an optional one) is not there.
        defaults = Resolver(template)
        functions = {
            name: resource
            for name, resource in functions.items()
            if "Condition" not in resource or defaults.condition(resource["Condition"])
        }
        if len(functions) != 1:
            names = ", ".join(sorted(functions)) or "none"
            raise BadInput(f"name the function to invoke: {template_path} has {names}")
        logical_id = next(iter(functions))
    if logical_id not in functions:
        names = ", ".join(sorted(functions)) or "none"
        raise BadInput(f"{template_path} has no function {logical_id!r} (it has {names})")
    resolver = Resolver(template)
    globals_section = template.get("Globals")
    shared = globals_section.get("Function") if isinstance(globals_section, dict) else None
    shared = shared if isinstance(shared, dict) else {}
    own = functions[logical_id].get("Properties")
    own = own if isinstance(own, dict) else {}
    props = {**shared, **own}
    variables = {**_variables(shared), **_variables(own)}  # sam merges Globals' variables

    handler = resolver.text(props.get("Handler"), "Handler")
    code_uri = resolver.text(props.get("CodeUri", "."), "CodeUri")
    name = resolver.resolve(props.get("FunctionName", logical_id))
    environment: dict[str, str] = {}
    for key, raw in variables.items():
        value = resolver.resolve(raw)
        if value is NO_VALUE:
            continue
        environment[str(key)] = "" if isinstance(value, Unresolved) else _env_text(value)
    return FunctionSpec(
        logical_id=logical_id,
        function_name=name if isinstance(name, str) and name else logical_id,
        handler=handler,
        code_dir=(template_path.parent / code_uri).resolve(),
        timeout=resolver.number(props.get("Timeout", SAM_DEFAULT_TIMEOUT), "Timeout"),
        memory_size=resolver.number(props.get("MemorySize", SAM_DEFAULT_MEMORY), "MemorySize"),
        environment=environment,
        template_functions=every_function,
    )


def _variables(props: Mapping[str, Any]) -> dict[str, Any]:
    env = props.get("Environment") or {}
    variables = env.get("Variables") if isinstance(env, dict) else None
    return dict(variables) if isinstance(variables, dict) else {}


def _env_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_env_text(v) for v in value)
    return str(value)


class Resolver:
    """Resolves the intrinsics sam resolves locally, from parameter defaults and conditions."""

    def __init__(self, template: Mapping[str, Any], region: str | None = None) -> None:
        self.region = region or local_region()
        self.parameters: dict[str, Any] = {}
        for name, spec in (template.get("Parameters") or {}).items():
            default = spec.get("Default", UNRESOLVED) if isinstance(spec, dict) else UNRESOLVED
            if isinstance(spec, dict) and spec.get("Type") == "CommaDelimitedList":
                default = [] if default in ("", UNRESOLVED) else str(default).split(",")
            self.parameters[name] = default
        self.pseudo: dict[str, Any] = {
            "AWS::Region": self.region,
            "AWS::AccountId": LOCAL_ACCOUNT,
            "AWS::StackName": LOCAL_STACK,
            "AWS::StackId": f"arn:aws:cloudformation:{self.region}:{LOCAL_ACCOUNT}:stack/local/0",
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": NO_VALUE,
        }
        self.resources = set(template.get("Resources") or {})
        self.conditions: Mapping[str, Any] = template.get("Conditions") or {}

    def text(self, value: object, what: str) -> str:
        resolved = self.resolve(value)
        if (
            not isinstance(resolved, str | int | float)
            or isinstance(resolved, bool)
            or resolved == ""
        ):
            raise BadInput(f"the template's {what} cannot be resolved locally: {value!r}")
        return str(resolved)

    def number(self, value: object, what: str) -> int:
        resolved = self.resolve(value)
        try:
            return int(str(resolved))
        except ValueError:
            raise BadInput(f"the template's {what} is not a number: {value!r}") from None

    def resolve(self, value: object) -> Any:
        if isinstance(value, list):
            return [v for v in (self.resolve(item) for item in value) if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) != 1:
            return {
                k: v
                for k, v in ((k, self.resolve(v)) for k, v in value.items())
                if v is not NO_VALUE
            }
        ((key, arg),) = value.items()
        if key == "Ref":
            return self._ref(str(arg))
        if key == "Fn::Sub":
            return self._sub(arg)
        if key == "Fn::If":
            condition, when_true, when_false = arg
            return self.resolve(when_true if self.condition(condition) else when_false)
        if key == "Fn::Join":
            delimiter, items = arg
            parts = self.resolve(items)
            if any(isinstance(p, Unresolved) for p in parts):
                return UNRESOLVED
            return str(delimiter).join(_env_text(p) for p in parts)
        if key == "Fn::Select":
            index, items = arg
            resolved = self.resolve(items)
            return resolved[int(self.resolve(index))] if isinstance(resolved, list) else UNRESOLVED
        if key == "Fn::Split":
            delimiter, source = arg
            text = self.resolve(source)
            return text.split(delimiter) if isinstance(text, str) else UNRESOLVED
        if key in ("Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or", "Condition"):
            return self._evaluate(key, arg)
        if key.startswith("Fn::"):
            return UNRESOLVED  # GetAtt, ImportValue, FindInMap, ...: needs a deployed stack
        return {key: self.resolve(arg)}

    def condition(self, name: object) -> bool:
        definition = self.conditions.get(str(name))
        if definition is None:
            raise BadInput(f"the template has no condition {name!r}")
        return bool(self.resolve(definition))

    def _evaluate(self, key: str, arg: Any) -> bool:
        if key == "Condition":
            return self.condition(arg)
        if key == "Fn::Equals":
            left, right = (self.resolve(a) for a in arg)
            return bool(_env_text(left) == _env_text(right))
        if key == "Fn::Not":
            return not bool(self.resolve(arg[0]))
        if key == "Fn::And":
            return all(bool(self.resolve(a)) for a in arg)
        return any(bool(self.resolve(a)) for a in arg)

    def _ref(self, name: str) -> Any:
        if name in self.parameters:
            return self.parameters[name]
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.resources:
            return name  # sam uses the logical id for a resource's name
        return UNRESOLVED

    def _sub(self, arg: Any) -> Any:
        text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        variables = {k: self.resolve(v) for k, v in dict(extra).items()}
        out: list[str] = []
        rest = str(text)
        while "${" in rest:
            before, _, after = rest.partition("${")
            name, closed, rest = after.partition("}")
            if not closed:
                out.append(before + "${" + after)
                rest = ""
                break
            out.append(before)
            if name.startswith("!"):
                out.append("${" + name[1:] + "}")
                continue
            value = variables[name] if name in variables else self._ref(name)
            if "." in name and name not in variables:
                value = UNRESOLVED  # ${Resource.Attribute}
            if isinstance(value, Unresolved) or value is NO_VALUE:
                return UNRESOLVED
            out.append(_env_text(value))
        out.append(rest)
        return "".join(out)


def local_region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


# -- env.json ------------------------------------------------------------------------------


def read_overrides(path: Path, spec: FunctionSpec) -> tuple[dict[str, str], tuple[str, ...]]:
    """sam's env.json: {"Parameters": {...all functions...}, "LogicalId": {...one function...}}.
    Returns the overrides for the template's declared variables, and the names ignored."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path} is not UTF-8 text (offset {exc.start})") from None
    document = jsonbound.loads(text, str(path))
    if not isinstance(document, dict):
        raise BadInput(f"{path} must be a JSON object of variables per function")
    sections = ("Parameters", spec.logical_id, spec.function_name, *spec.template_functions)
    stray = [str(key) for key in document if key not in sections]
    if stray:
        # sam ignores such a key without a word: a misspelt function, or variables left at the
        # top level, and the invoke runs against another database than the one meant.
        raise BadInput(
            f'{path}: {stray[0][:60]!r} is neither "Parameters" nor a function of the '
            f"template ({', '.join(spec.template_functions)}): variables go in one of those"
        )
    merged: dict[str, object] = {}
    for section in ("Parameters", spec.logical_id, spec.function_name):
        values = document.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise BadInput(f"{path}: {section!r} must be an object of variable names to values")
        merged.update(values)
    overrides, ignored = {}, []
    for name, value in merged.items():
        if name not in spec.environment:
            ignored.append(name)
            continue
        if isinstance(value, dict | list) or value is None:
            raise BadInput(f"{path}: {name} must be a string, a number or a boolean")
        overrides[name] = _env_text(value)
    return overrides, tuple(sorted(ignored))


def shell_unused(
    spec: FunctionSpec, overrides: Mapping[str, str], shell: Mapping[str, str]
) -> tuple[str, ...]:
    """The template's variables the shell sets to another value than the template's own,
    which wins (only an empty one takes the shell's): said, so that a setting is not lost
    without a word (--env-vars gives it)."""
    return tuple(
        sorted(
            name
            for name, value in spec.environment.items()
            if value and name not in overrides and shell.get(name) not in (None, "", value)
        )
    )


def function_environment(
    spec: FunctionSpec,
    overrides: Mapping[str, str],
    shell: Mapping[str, str],
    region: str,
) -> dict[str, str]:
    """The variables the handler sees: the template's, an empty one filled from the shell, then
    env.json's; plus what the Lambda runtime sets."""
    env = dict(spec.environment)
    for name, value in env.items():
        if not value and shell.get(name):
            env[name] = shell[name]
    env.update(overrides)
    env.update(
        {
            "AWS_LAMBDA_FUNCTION_NAME": spec.function_name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_size),
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(spec.timeout),
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": shell.get("AWS_DEFAULT_REGION") or region,
            "AWS_SAM_LOCAL": "true",  # as in sam's containers: the run does not continue itself
            "_HANDLER": spec.handler,
        }
    )
    return env


# -- the invoke ----------------------------------------------------------------------------


def read_event(path: str | None) -> Any:
    """The event: a JSON file, "-" for stdin, or {} when none is given (as sam does). At most
    Lambda's own limit is read (so /dev/zero or an endless pipe ends too); it must be UTF-8
    JSON nested no deeper than jsonbound.MAX_DEPTH."""
    if path is None:
        return {}
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_EVENT_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_EVENT_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"cannot read the event {path}: {exc.strerror}") from None
    if len(data) > MAX_EVENT_BYTES:
        raise BadInput(f"the event {path} is larger than Lambda's limit of {MAX_EVENT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = data[exc.start]
        raise BadInput(
            f"the event {path} is not UTF-8 text: byte 0x{byte:02x} at offset {exc.start}"
        ) from None
    return jsonbound.loads(text, f"the event {path}")


def invoke(
    *,
    template: Path = Path(DEFAULT_TEMPLATE),
    function: str | None = None,
    event_path: str | None = None,
    env_vars_path: str | None = None,
    output: TextIO | None = None,
    resolve_database: Callable[[], str],
) -> InvokeResult:
    """Invoke the handler once, in-process. What the function prints goes to `output`
    (stderr by default). The handler module is imported once per process, like a warm
    container: its cold-start state is kept between invokes. `resolve_database` gives a
    DATABASE_URL when the function's environment names no database (the CLI: the embedded
    server)."""
    spec = read_function(template, function)
    event = read_event(event_path)
    overrides, ignored = read_overrides(Path(env_vars_path), spec) if env_vars_path else ({}, ())
    region = local_region()
    env = function_environment(spec, overrides, os.environ, region)
    unused = shell_unused(spec, overrides, os.environ)
    if not any(env.get(name) for name in DATABASE_VARIABLES):
        env["DATABASE_URL"] = resolve_database()
    module_name, _, attribute = spec.handler.rpartition(".")
    if not module_name:
        raise BadInput(f"Handler {spec.handler!r} is not module.function")
    stream = output or sys.stderr
    with _environment(env), contextlib.redirect_stdout(stream), on_sys_path(spec.code_dir):
        try:
            handler = getattr(importlib.import_module(module_name), attribute)
        except Exception as exc:  # reported as the Lambda runtime reports a failed init
            error = {
                "errorType": "Runtime.ImportModuleError",
                "errorMessage": f"Unable to import module {module_name!r}: {exc}",
            }
            return InvokeResult(
                payload=error, failed=True, ignored_overrides=ignored, shell_unused=unused
            )
        context = local_context(spec, region)
        payload, failed = _call(handler, event, context, spec.timeout)
    if not failed and isinstance(payload, dict) and payload.get("ok") is False:
        failed = True
    return InvokeResult(
        payload=payload, failed=failed, ignored_overrides=ignored, shell_unused=unused
    )


def _call(
    handler: Callable[[Any, Any], Any], event: Any, context: FakeContext, timeout: int
) -> tuple[Any, bool]:
    """Call the handler on a thread; past the Timeout it is abandoned, as Lambda would kill it."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["payload"] = handler(event, context)
        except Exception as exc:  # reported the way Lambda reports an unhandled error
            outcome["error"] = {"errorType": type(exc).__name__, "errorMessage": str(exc)}

    thread = threading.Thread(target=run, name="pgdrain-invoke", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return {
            "errorType": "TimeoutError",
            "errorMessage": f"Task timed out after {timeout}.00 seconds",
        }, True
    if "error" in outcome:
        return outcome["error"], True
    return outcome.get("payload"), False


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
