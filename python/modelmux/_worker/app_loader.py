"""Loading an application from its `app_source` (`import:module:attr` or `pickle:/path`)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

import cloudpickle

from modelmux._api.deployment import Application, Deployment

WHERE_ATTR = "__modelmux_where__"
"""An exception attribute: the (file, line) to report it at, when its traceback has none."""


def _located(exc: Exception, file: str | None, line: int) -> Exception:
    if file:
        setattr(exc, WHERE_ATTR, (file, line))
    return exc


def prepare(working_dir: str | None) -> None:
    """Makes `working_dir` (when set) the current directory and the first `sys.path` entry."""
    if working_dir:
        working_dir = os.path.abspath(working_dir)
        os.chdir(working_dir)
        sys.path.insert(0, working_dir)
    elif "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _definition_line(module: Any, attr: str) -> int:
    """The line that assigns `attr` at the top of the module's source (1 when not found)."""
    try:
        lines = inspect.getsource(module).splitlines()
    except (OSError, TypeError):
        return 1
    pattern = re.compile(rf"^{re.escape(attr)}\s*(:[^=]*)?=")
    return next((n for n, text in enumerate(lines, 1) if pattern.match(text)), 1)


def _from_import(spec: str) -> tuple[Any, str, Any]:
    module_name, sep, attr = spec.rpartition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"app_source 'import:{spec}' must name a module and an attribute: import:module:attr"
        )
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _located(
                AttributeError(f"module '{module_name}' has no attribute '{attr}'"),
                getattr(module, "__file__", None),
                1,
            ) from None
    return obj, f"{module_name}:{attr}", module


@dataclass(frozen=True)
class Loaded:
    """A loaded application and where it is defined (for errors found in its graph)."""

    app: Application
    origin: tuple[str, int] | None


def load_application(app_source: str) -> Loaded:
    """The application (the ingress's bound deployment) that `app_source` names.

    Raises an exception naming the attribute when it is not an application.
    """
    kind, _, rest = app_source.partition(":")
    module: Any = None
    if kind == "import":
        obj, name, module = _from_import(rest)
    elif kind == "pickle":
        with open(rest, "rb") as f:
            obj = cloudpickle.load(f)
        name = app_source
    else:
        raise ValueError(f"app_source {app_source!r} must be import:module:attr or pickle:/path")
    file = getattr(module, "__file__", None)
    line = _definition_line(module, name.rpartition(":")[2]) if module is not None else 1
    if isinstance(obj, Application):
        return Loaded(obj, (file, line) if file else None)
    if isinstance(obj, Deployment):
        raise _located(
            TypeError(
                f"'{name}' is the deployment {obj.name}, not an application: bind it, "
                f"e.g. app = {obj.name}.bind()"
            ),
            file,
            line,
        )
    if inspect.isclass(obj):
        try:
            file, line = inspect.getsourcefile(obj) or file, inspect.getsourcelines(obj)[1]
        except (OSError, TypeError):
            pass
        raise _located(
            TypeError(
                f"'{name}' is the class {obj.__name__}, not a deployment: decorate it with "
                f"@serve.deployment and bind it (app = {obj.__name__}.bind())"
            ),
            file,
            line,
        )
    raise _located(
        TypeError(
            f"'{name}' is a {type(obj).__name__}, not an application (a bound deployment, "
            "Cls.bind(...))"
        ),
        file,
        line,
    )
