"""`--inspect`: load an application and print its deployments as one JSON object."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from modelmux._api.deployment import Application
from modelmux._api.graph import arguments_of, deployments_of
from modelmux._api.multiplex import find_multiplexed
from modelmux._api.options import SERVER_OPTIONS
from modelmux._worker import app_loader, errors


def describe(root: Application) -> dict[str, Any]:
    """The application's ingress and deployments, as `--inspect` prints them."""
    deployments = []
    for name, app in deployments_of(root).items():
        cls = app.deployment.func_or_class
        options = {k: v for k, v in app.deployment.user_options.items() if k in SERVER_OPTIONS}
        multiplexed = find_multiplexed(cls)
        handles = list(dict.fromkeys(bound.name for bound in arguments_of(app)))
        deployments.append(
            {
                "name": name,
                "options": options,
                "multiplexed": multiplexed[1].describe() if multiplexed else None,
                "handles": handles,
                "has_reconfigure": callable(getattr(cls, "reconfigure", None)),
            }
        )
    return {"ok": True, "ingress": root.name, "deployments": deployments}


def run(spec: dict[str, Any]) -> int:
    """Prints the description (exit status 0) or the error (exit status 2) on stdout.

    While the user's code runs, file descriptor 1 points at stderr, so that its prints do
    not mix with the JSON.
    """
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    loaded = None
    try:
        app_loader.prepare(spec.get("working_dir"))
        loaded = app_loader.load_application(spec["app_source"])
        result = describe(loaded.app)
        status = 0
    except (Exception, SystemExit) as e:
        traceback.print_exc()
        result = {"ok": False, "error": errors.summary(e, loaded.origin if loaded else None)}
        status = 2
    sys.stdout.flush()
    with out:
        out.write(json.dumps(result) + "\n")
    return status
