"""What one login reads: the ``kubernetes`` package's config loader, its result as kopf's
``ConnectionInfo`` (``Credentials``), and which files' change makes it stale. When to log in is
login.py's.

In a pod, its service account (the loader's in-cluster config); elsewhere the current context of
KUBECONFIG (or ~/.kube/config), merged and read by the loader: client certificates, a token or a
``tokenFile``, basic auth, an ``exec`` credential plugin, an OIDC ``auth-provider`` (its ID
token refreshed with its refresh token once expired), ``tls-server-name`` and ``proxy-url``. Only
the loader is imported, never the generated API classes (their models cost memory the operator
has no use for), nor their Configuration: the loaders fill in a :class:`Loaded` instead, since
the Configuration's module imports urllib3 (1.8 MiB of the operator's memory) for its own HTTP
client. Without a ``proxy-url``, the environment's proxy (HTTPS_PROXY and the like) is used
unless NO_PROXY exempts the server, as kubectl does. The loader does not read a user's
impersonation fields (``as``, ``as-groups``): a kubeconfig with them is refused rather than used
under the wrong identity.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kopf
from kubernetes.config import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_ACCOUNT_NAMESPACE = SERVICE_ACCOUNT / "namespace"

REFRESH_BEFORE = timedelta(minutes=5)
"""Credentials that expire are renewed this long before (the loader's own margin), or at 80%
of their lifetime when that is shorter."""

IMPERSONATION = ("as", "as-uid", "as-groups", "as-user-extra")
"""A kubeconfig user's impersonation fields, which the loader ignores."""


class LoginError(Exception):
    """No credentials to reach a cluster with."""


class ServerNameContext(ssl.SSLContext):
    """TLS that checks the server's certificate for (and sends as SNI) ``server_name``
    instead of the URL's host: a kubeconfig cluster's ``tls-server-name``."""

    server_name: str = ""

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(incoming, outgoing, server_side, self.server_name, session)


@dataclass(frozen=True, kw_only=True)
class Credentials(kopf.ConnectionInfo):
    """kopf's ``ConnectionInfo`` with what kopf has no field for."""

    tls_server_name: str | None = None
    """The name the server's certificate is checked for, when not the URL's host."""

    def as_ssl_context(self) -> ssl.SSLContext:
        if not self.tls_server_name or self.insecure:
            return super().as_ssl_context()
        # The loader hands files (a temporary one for inline data), never data.
        context = ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)
        context.server_name = self.tls_server_name
        if self.ca_path:
            context.load_verify_locations(cafile=self.ca_path)
        else:
            context.load_default_certs()
        if self.certificate_path:
            context.load_cert_chain(self.certificate_path, self.private_key_path)
        return context


@dataclass
class Loaded:
    """What the config loaders set on the configuration they are handed (``load_and_set``): the
    fields the operator reads, with the generated client's defaults."""

    host: str = ""
    ssl_ca_cert: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify_ssl: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None
    """The cluster's ``proxy-url``."""
    api_key: dict[str, str] = field(default_factory=dict)
    refresh_api_key_hook: Callable[[Any], None] | None = None
    """Set by the loaders, never called: refreshing is Login's."""


def environment_proxy(server: str) -> str | None:
    """The proxy the environment names for ``server``'s scheme (``https_proxy``, then
    ``all_proxy``, either case), unless ``no_proxy`` exempts its host."""
    url = urlsplit(server)
    proxies = urllib.request.getproxies_environment()
    if url.hostname and urllib.request.proxy_bypass(url.hostname):
        return None
    return proxies.get(url.scheme) or proxies.get("all")


@dataclass
class Issued:
    """One login's credentials, and what makes them stale."""

    info: Credentials
    watched: tuple[Path, ...] = ()
    """Files whose change (inode, mtime, size) means logging in again."""
    stamps: tuple[tuple[int, int, int] | None, ...] = field(default=())
    refresh_at: datetime | None = None
    """When to log in again ahead of the expiry (None: no expiry known)."""


def stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (None when it is missing)."""
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_ino, found.st_mtime_ns, found.st_size)


def in_a_pod() -> bool:
    """Whether the process runs in a pod with its service account mounted."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    return bool(host and port and (SERVICE_ACCOUNT / "token").exists())


def _credentials(config: Loaded, namespace: str | None, expiration: datetime | None) -> Credentials:
    """kopf's view of what the loader filled in."""
    # The loader reads a tokenFile as it is: its final newline would break the header.
    header = str(config.api_key.get("BearerToken") or "").strip()
    scheme, _, token = header.partition(" ") if " " in header else ("", "", header)
    return Credentials(
        server=str(config.host),
        ca_path=config.ssl_ca_cert or None,
        insecure=not config.verify_ssl,
        scheme=scheme.capitalize() or None,
        token=token or None,
        certificate_path=config.cert_file or None,
        private_key_path=config.key_file or None,
        default_namespace=namespace,
        proxy_url=config.proxy or environment_proxy(str(config.host)),
        expiration=expiration,
        tls_server_name=config.tls_server_name or None,
    )


def _skips_verification(cluster: dict[str, Any]) -> bool:
    """Whether a kubeconfig's cluster entry turns off the server certificate's verification:
    ``insecure-skip-tls-verify`` true, or the string "true" (any case); "false" does not."""
    value = cluster.get("insecure-skip-tls-verify")
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return value is True


def _service_account() -> Issued:
    token = SERVICE_ACCOUNT / "token"
    config = Loaded()
    try:
        # Refreshing is Login's (on a file change), not the loader's once a minute.
        loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(token),
            cert_filename=str(SERVICE_ACCOUNT / "ca.crt"),
            try_refresh_token=False,
        )
        loader.load_and_set(config)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as error:
        raise LoginError(f"service account {SERVICE_ACCOUNT}: {error}") from error
    return Issued(_credentials(config, own_namespace(), None), (token,), (stamp(token),))


@contextlib.contextmanager
def _loader_errors() -> Iterator[list[str]]:
    """The errors the loader logs instead of raising (a failed exec plugin), on this thread."""
    seen: list[str] = []
    me = threading.get_ident()

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR and record.thread == me:
                seen.append(record.getMessage())

    keep, root = Keep(), logging.getLogger()
    root.addHandler(keep)
    try:
        yield seen
    finally:
        root.removeHandler(keep)


class KubeconfigLogin:
    """The kubeconfig files in ``listed`` (separated as in PATH), read by the loader once and
    again when one of them changes; kept in between, so that an OIDC refresh token the loader
    renewed is the one used next time."""

    def __init__(self, listed: str) -> None:
        self.listed = listed
        self.files = tuple(Path(p).expanduser() for p in listed.split(os.pathsep) if p)
        self._loader: KubeConfigLoader | None = None
        self._merged: Any = None
        self._stamps: tuple[tuple[int, int, int] | None, ...] = ()

    def _read(self) -> None:
        stamps = tuple(stamp(f) for f in self.files)
        if self._loader is not None and stamps == self._stamps:
            return
        if not any(stamps):
            raise LoginError(f"no service account, and no kubeconfig at {self.listed}")
        try:
            merger = KubeConfigMerger(self.listed)  # type: ignore[no-untyped-call]
            if merger.config is None:
                raise ConfigException("no configuration found")
            self._loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
                config_dict=merger.config, config_base_path=None
            )
        except (ConfigException, OSError, ValueError) as error:
            raise LoginError(f"kubeconfig {self.listed}: {error}") from error
        self._merged, self._stamps = merger.config, stamps

    def _cluster(self, name: str | None) -> dict[str, Any]:
        """The current context's cluster entry."""
        node = self._merged["clusters"].get_with_name(name, safe=True) if name else None
        return dict(node.value.get("cluster") or {}) if node is not None else {}

    def _user(self, name: str | None) -> tuple[dict[str, Any], Path | None]:
        """The current context's user entry, and the file that defines it."""
        if not name:
            return {}, None
        node = self._merged["users"].get_with_name(name, safe=True)
        if node is None:
            return {}, None
        return dict(node.value.get("user") or {}), Path(node.path) if node.path else None

    def issue(self) -> Issued:
        self._read()
        assert self._loader is not None
        config = Loaded()
        try:
            context = dict(self._loader.current_context.get("context") or {})
            user, defined_in = self._user(context.get("user"))
            refused = [key for key in IMPERSONATION if user.get(key)]
            if refused:
                raise LoginError(
                    f"kubeconfig {self.listed}: user {context.get('user')!r} impersonates "
                    f"({', '.join(refused)}), which the kubernetes package's loader does not "
                    "support; give the operator a user of its own"
                )
            with _loader_errors() as errors:
                self._loader.load_and_set(config)  # type: ignore[no-untyped-call]
        except ConfigException as error:
            raise LoginError(f"kubeconfig {self.listed}: {error}") from error
        if user.get("exec") and errors:
            raise LoginError(f"kubeconfig {self.listed}: user exec: {errors[-1]}")
        if not config.host:
            raise LoginError(f"kubeconfig {self.listed}: the current cluster names no server")
        # The loader takes the field's truth as Python's: the string "false" is true, and would
        # turn off the server's verification. Only a true (or "true") skips it.
        config.verify_ssl = not _skips_verification(self._cluster(context.get("cluster")))
        expiry: datetime | None = getattr(self._loader, "expiry", None)
        watched = list(self.files)
        if user.get("tokenFile"):
            folder = defined_in.parent if defined_in else Path()
            watched.append(folder / Path(str(user["tokenFile"])).expanduser())
        issued = Issued(
            _credentials(config, context.get("namespace"), expiry),
            tuple(watched),
            tuple(stamp(w) for w in watched),
        )
        if expiry is not None:
            left = expiry - datetime.now(UTC)
            issued.refresh_at = expiry - min(REFRESH_BEFORE, left / 5)
        return issued


def source(kubeconfig: str | None) -> Callable[[], Issued]:
    if kubeconfig is None and in_a_pod():
        return _service_account
    return KubeconfigLogin(kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config").issue


def own_namespace() -> str | None:
    """The namespace this operator runs in: POD_NAMESPACE (the chart sets it from the downward
    API), else its service account's, else None (it runs outside the cluster)."""
    found = os.environ.get("POD_NAMESPACE")
    if found:
        return found
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
