"""Old module names, kept importable for one release: `import pgdrain.store` loads
`pgdrain.db.store` (the same module object) and warns once that the name moved."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# The name a module had before the package was laid out by layer -> where it lives now.
MOVED = {
    "pgdrain.registry": "pgdrain.api.registry",
    "pgdrain.enqueue": "pgdrain.api.enqueue",
    "pgdrain.retry": "pgdrain.api.retry",
    "pgdrain.periodic": "pgdrain.api.periodic",
    "pgdrain.jsonbound": "pgdrain.api.jsonbound",
    "pgdrain.drain": "pgdrain.runner.drain",
    "pgdrain.attempts": "pgdrain.runner.attempts",
    "pgdrain.claims": "pgdrain.runner.claiming",
    "pgdrain.claim_statement": "pgdrain.runner.claim_statement",
    "pgdrain.claim_ahead": "pgdrain.runner.prefetch",
    "pgdrain.sent_ahead": "pgdrain.runner.pipelining",
    "pgdrain.one_slot": "pgdrain.runner.loop_thread",
    "pgdrain.pool": "pgdrain.runner.worker_threads",
    "pgdrain.heartbeat": "pgdrain.runner.heartbeat",
    "pgdrain.deadline": "pgdrain.runner.deadline",
    "pgdrain.stop": "pgdrain.runner.stop",
    "pgdrain.abandoned": "pgdrain.runner.abandoned",
    "pgdrain.execute": "pgdrain.runner.execute",
    "pgdrain.reclaim": "pgdrain.runner.reclaim",
    "pgdrain.summary": "pgdrain.runner.summary",
    "pgdrain.session": "pgdrain.db.session",
    "pgdrain.pipeline": "pgdrain.db.pipeline",
    "pgdrain.store": "pgdrain.db.store",
    "pgdrain.sql": "pgdrain.db.sql",
    "pgdrain.migrate": "pgdrain.db.migrate",
    "pgdrain.retention": "pgdrain.db.retention",
    "pgdrain.report": "pgdrain.cli.report",
    "pgdrain.demo": "pgdrain.cli.demo",
    "pgdrain.embedded": "pgdrain.cli.embedded",
}
# `pgdrain.db` and `pgdrain.cli` are packages now; what `pgdrain.db` exported as a module
# (connect, describe...) is in pgdrain.db.connection, and `pgdrain.cli:main` still works.


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is now {self.new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module was executed under its new name; the import system has just set its
        # __spec__ to the old name's: give it back, so that reload() and the like see the truth.
        module.__spec__ = self._spec


class MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
    # `pgdrain.enqueue` and `pgdrain.drain` are functions of the facade as well as old module
    # names: registered as loaded, so that importing the module never rebinds the function.
    package = sys.modules["pgdrain"]
    for old, new in MOVED.items():
        name = old.rpartition(".")[2]
        if callable(getattr(package, name, None)) and new in sys.modules:
            sys.modules.setdefault(old, sys.modules[new])
