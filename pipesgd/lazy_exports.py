"""Public names of a package that load their defining module on first use (PEP 562 ``__getattr__``), so that the
package's torch-free modules import without torch (the analytic timing model reads them)."""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load_export"]


def load_export(namespace: dict[str, Any], exports: dict[str, str], name: str) -> Any:
    """The attribute ``name`` of a package whose ``globals()`` are ``namespace``: imported from the module that
    ``exports`` names for it and kept in ``namespace`` (later look-ups skip the package's ``__getattr__``);
    ``AttributeError`` for a name not exported."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value
