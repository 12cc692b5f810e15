"""The one way into the operator's process: ``meshrun operator`` and ``python -m meshrun_operator``.

The operator logs in with the ``kubernetes`` package's config loader (client/credentials.py) and
talks to the API server itself (client/rest.py). Importing ``kubernetes`` the usual way runs its
package ``__init__``s, which import every generated API class and model: a fifth of the
operator's memory for objects it never makes, and kopf imports them too whenever the package is
installed, only to recognise model objects the operator never hands it. So before kopf is
imported, ``kubernetes`` and ``kubernetes.client`` are registered as bare packages over their
real folders: the loader's modules (``kubernetes.config``, ``kubernetes.client.configuration``)
import as usual, the models never do, and kopf finds no model classes to recognise. The
loader's OIDC refresh names ``requests_oauthlib.OAuth2Session`` at import time too: it is a
stand-in until a session is made, which keeps ``requests`` out of the process.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any


class DeferredApiClient:
    """``kubernetes.client.ApiClient``, imported (models and all) only when one is made: the
    config loader names it at import time but uses it only to refresh an OIDC token."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.api_client import ApiClient

        return ApiClient(*args, **kwargs)


OAUTH_SESSIONS = "requests_oauthlib"
"""The package of ``OAuth2Session``: it imports ``requests`` (with urllib3's and charset
detection's modules, 209 in all, 7.3 MiB of the operator's memory) for an object the config
loader makes only to refresh an OIDC token."""


class DeferredOAuth2Session:
    """``requests_oauthlib.OAuth2Session``, imported only when one is made; until then the
    package is a stand-in in ``sys.modules`` (see :func:`lean_kubernetes`)."""

    standin: types.ModuleType | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real().OAuth2Session(*args, **kwargs)

    @classmethod
    def real(cls) -> types.ModuleType:
        """The real package, imported in the stand-in's place on first use."""
        if cls.standin is not None and sys.modules.get(OAUTH_SESSIONS) is cls.standin:
            del sys.modules[OAUTH_SESSIONS]
        return importlib.import_module(OAUTH_SESSIONS)


def _real_attribute(name: str) -> Any:
    """Any other public name of the stand-in is the real package's (importing it then); the
    import system's own probes (``__path__`` and the like) find nothing, as on any module."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(DeferredOAuth2Session.real(), name)


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

    def lazy(name: str) -> Any:
        if name == "Configuration":
            return importlib.import_module("kubernetes.client.configuration").Configuration
        if name == "ApiClient":
            return DeferredApiClient
        raise AttributeError(f"module 'kubernetes.client' has no attribute {name!r} here")

    client.__getattr__ = lazy  # type: ignore[method-assign]
    root.client = client  # type: ignore[attr-defined]
    sys.modules["kubernetes"], sys.modules["kubernetes.client"] = root, client
    if OAUTH_SESSIONS not in sys.modules and importlib.util.find_spec(OAUTH_SESSIONS):
        standin = types.ModuleType(OAUTH_SESSIONS)
        standin.OAuth2Session = DeferredOAuth2Session  # type: ignore[attr-defined]
        standin.__getattr__ = _real_attribute  # type: ignore[method-assign]
        DeferredOAuth2Session.standin = sys.modules[OAUTH_SESSIONS] = standin


def main(argv: list[str] | None = None) -> int:
    """Keep the generated kubernetes client out, then run the operator."""
    lean_kubernetes()
    from meshrun_operator.main import main as run_operator

    return run_operator(argv)
