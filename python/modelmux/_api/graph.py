"""An application's graph: the ingress and the bound deployments among its arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from modelmux._api.deployment import Application
from modelmux._api.multiplex import find_multiplexed


def bound_in(value: Any) -> Iterator[Application]:
    """The bound deployments in `value`: itself, or inside lists, tuples and dict values."""
    if isinstance(value, Application):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from bound_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from bound_in(item)


def arguments_of(app: Application) -> Iterator[Application]:
    """The bound deployments among `app`'s positional and keyword arguments."""
    yield from bound_in(app.args)
    yield from bound_in(app.kwargs)


def replace_bound(value: Any, replace: Callable[[Application], Any]) -> Any:
    """`value` with every bound deployment in it (as `bound_in` finds them) replaced."""
    if isinstance(value, Application):
        return replace(value)
    if isinstance(value, list):
        return [replace_bound(v, replace) for v in value]
    if isinstance(value, tuple):
        items = [replace_bound(v, replace) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {k: replace_bound(v, replace) for k, v in value.items()}
    return value


def deployments_of(root: Application) -> dict[str, Application]:
    """Every bound deployment of the graph by name, the ingress first.

    A deployment bound more than once (with other arguments, or another deployment of the same
    name) gets a name of its own for each further node, `<name>_1`, `<name>_2`, ..., in the
    order the graph is walked, as Ray names them; the node keeps it (it is pickled with the
    application), so every process that walks the graph again finds the same names.

    Raises TypeError when a class has more than one multiplexed method.
    """
    found: dict[str, Application] = {}
    pending = [root]
    while pending:
        app = pending.pop(0)
        if any(seen is app for seen in found.values()):
            continue
        if app.name in found:
            base, k = app.deployment.name, 1
            while f"{base}_{k}" in found:
                k += 1
            app.renamed = f"{base}_{k}"
        find_multiplexed(app.deployment.func_or_class)
        found[app.name] = app
        pending.extend(arguments_of(app))
    return found
