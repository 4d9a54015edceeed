# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The controller's Python packages that ansible-core does not bring with it (jsonschema and its referencing).

Imported through require() where they are used, never at a plugin's import: a controller without one gets a task
error naming the package and the Python to install it into, not "Unexpected Exception, this is probably a bug".
"""

from __future__ import annotations

import importlib
import sys

from ansible.errors import AnsibleError


class MissingPackage(AnsibleError):
    """A controller-side package is not importable; the message says what to install where."""


def require(module, package=None):
    """The imported module, or MissingPackage naming `package` (the distribution to pip install, default module)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = package or module.split(".", 1)[0]
        raise MissingPackage(
            "kentino.gpufleet needs the Python package %s on the controller (%s). Install it into the Python that "
            "runs Ansible: %s -m pip install %s (or install the collection's requirements: pip install -e . in its "
            "repository)" % (package, exc, sys.executable, package)) from None
