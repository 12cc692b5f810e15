"""The one way into the operator's process: ``meshrun operator`` and ``python -m meshrun_operator``.

The operator logs in with the ``kubernetes`` package's config loader (client/credentials.py) and
talks to the API server itself (client/rest.py). Importing ``kubernetes`` the usual way runs its
package ``__init__``s, which import every generated API class and model: a fifth of the
operator's memory for objects it never makes, and kopf imports them too whenever the package is
installed, only to recognise model objects the operator never hands it. So before kopf is
imported, ``kubernetes`` and ``kubernetes.client`` are registered as bare packages over their
real folders: the loader's modules (``kubernetes.config`` and what it imports when used)
import as usual, the models never do, and kopf finds no model classes to recognise. The
loader names more at import time than it uses to log in: the client's ``ApiClient`` and
``Configuration``, ``requests_oauthlib.OAuth2Session`` and ``oauthlib.oauth2`` (for an OIDC
refresh) and ``urllib3`` (for basic auth). Each is a stand-in that imports the real one when it
is first used, which keeps ``requests``, urllib3 and oauthlib out of a process that logs in
with a token, a certificate or a service account.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any


class Deferred(type):
    """The type of a stand-in class (:func:`deferred_class`): what the stand-in lacks, its
    class attributes and methods (``Configuration.set_default``), are the real class's."""

    def __getattr__(cls, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(cls.real(), attribute)

    def real(cls) -> type:
        real: type = getattr(real_module(cls.__module__), cls.__name__)
        return real


def deferred_class(module: str, name: str) -> type:
    """A stand-in for class ``module.name`` that imports the module only when an instance is
    made or another attribute is read: making one makes an instance of the real class."""

    def new(cls: Deferred, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    return Deferred(name, (), {"__new__": new, "__module__": module})


OAUTH_SESSIONS = "requests_oauthlib"
"""The package of ``OAuth2Session``: it imports ``requests`` (with urllib3's and charset
detection's modules, 209 in all, 7.3 MiB of the operator's memory) for an object the config
loader makes only to refresh an OIDC token."""

OAUTH_ERRORS = "oauthlib.oauth2"
"""The package the config loader imports at the top only to name, in an ``except`` of its OIDC
refresh, the error a refused client id raises: 60 modules, 0.8 MiB of the operator's memory."""


URLLIB3 = "urllib3"
"""The loader imports it for basic auth's header; the operator's own HTTP is aiohttp's. With its
modules (importlib.metadata and zipfile among them), 1.8 MiB of the operator's memory."""


PROBES = frozenset({"__file__", "__cached__", "__loader__", "__path__", "__wrapped__"})
"""Names that tools ask any module in ``sys.modules`` for (``inspect``, the import system):
a stand-in answers them as a module without them does, rather than importing the real one.
Any other name (``__version__`` included) is the real module's."""


def real_module(name: str) -> types.ModuleType:
    """Module ``name`` itself, imported in its stand-in's place (see :func:`stand_in`)."""
    if getattr(sys.modules.get(name), "__standin__", False):
        del sys.modules[name]
    return importlib.import_module(name)


def stand_in(name: str, **early: Any) -> None:
    """Register a stand-in for module ``name`` that imports the real one when first asked for
    any other public name: ``import name`` costs nothing until the module is used. The names in
    ``early`` are the stand-in's own, answered without importing (a ``from name import x`` asks
    at import time). Nothing happens when the module is missing or already imported."""
    spec = None if name in sys.modules else importlib.util.find_spec(name)
    if spec is None:
        return
    module = types.ModuleType(name)
    if spec.submodule_search_locations is not None:
        # A package's submodules import under the stand-in (``import urllib3.exceptions`` by
        # another package) and are the real package's once its ``__init__`` runs.
        module.__path__ = list(spec.submodule_search_locations)

    def real_attribute(attribute: str) -> Any:
        if attribute in PROBES:
            raise AttributeError(attribute)
        return getattr(real_module(name), attribute)

    module.__dict__.update(early, __standin__=True, __getattr__=real_attribute)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:  # ``import parent.child`` binds the parent, whose attribute the code then reads
        setattr(sys.modules[parent], child, module)


def bare_package(name: str, folder: Path) -> types.ModuleType:
    """A package module over ``folder`` whose ``__init__`` is never run."""
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    module.__spec__ = ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [str(folder)]
    return module


def lean_kubernetes() -> None:
    """Register ``kubernetes`` and ``kubernetes.client`` as bare packages (see the module's
    docstring); nothing happens when the package is missing or already imported."""
    if "kubernetes" in sys.modules:
        return
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or not spec.submodule_search_locations:
        return
    root = bare_package("kubernetes", Path(next(iter(spec.submodule_search_locations))))
    client = bare_package("kubernetes.client", Path(root.__path__[0]) / "client")

    # The loader names both at import time; it makes them only for an OIDC refresh and in
    # the load_* functions the operator does not call (it fills in credentials.Loaded).
    client.__dict__.update(
        ApiClient=deferred_class("kubernetes.client.api_client", "ApiClient"),
        Configuration=deferred_class("kubernetes.client.configuration", "Configuration"),
    )
    root.client = client  # type: ignore[attr-defined]
    sys.modules["kubernetes"], sys.modules["kubernetes.client"] = root, client
    stand_in(OAUTH_SESSIONS, OAuth2Session=deferred_class(OAUTH_SESSIONS, "OAuth2Session"))
    stand_in(OAUTH_ERRORS)
    stand_in(URLLIB3)


def main(argv: list[str] | None = None) -> int:
    """Keep the generated kubernetes client out, then run the operator."""
    lean_kubernetes()
    from meshrun_operator.main import main as run_operator

    return run_operator(argv)
