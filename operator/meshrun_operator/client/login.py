"""The operator's credentials, as kopf's ``ConnectionInfo``: kopf's own watches and the
operator's requests (rest.py) log in the same way.

In a pod, its service account (as client-go's in-cluster config); elsewhere the current context
of KUBECONFIG (or ~/.kube/config), with file paths relative to the file that names them, as
kubectl reads them. A user whose token comes from a program (``exec``, the client-go credential
plugin protocol) or a file (``tokenFile``) is supported; the program runs again at every login,
and kopf logs in again when the API server answers 401 (an expired token).

https://kubernetes.io/docs/reference/access-authn-authz/authentication/#client-go-credential-plugins
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kopf
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_ACCOUNT_NAMESPACE = SERVICE_ACCOUNT / "namespace"
EXEC_SECONDS = 60
"""How long a credential program may run."""


class LoginError(Exception):
    """No credentials to reach a cluster with."""


def login(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """Its service account in a pod, else ``kubeconfig`` (default KUBECONFIG as it is now, else
    ~/.kube/config). LoginError names the file and what is missing."""
    token = SERVICE_ACCOUNT / "token"
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if kubeconfig is None and host and port and token.exists():
        ca = SERVICE_ACCOUNT / "ca.crt"
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        return kopf.ConnectionInfo(
            server=server,
            ca_path=str(ca) if ca.exists() else None,
            token=token.read_text().strip() or None,
            default_namespace=own_namespace(),
        )
    return from_kubeconfig(kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config")


def from_kubeconfig(listed: str) -> kopf.ConnectionInfo:
    """The current context of the kubeconfig files in ``listed`` (separated as in PATH): the
    first file that names a context, a cluster or a user wins, as kubectl merges them."""
    paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
    current: str | None = None
    found: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {
        "contexts": {},
        "clusters": {},
        "users": {},
    }
    for path in paths:
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise LoginError(f"no service account, and kubeconfig {path}: {error}") from error
        current = current or config.get("current-context")
        for section, entries in found.items():
            for item in config.get(section) or []:
                entry = item.get(section[:-1]) or {}
                entries.setdefault(str(item.get("name")), (entry, path.parent))
    try:
        context = found["contexts"][str(current)][0]
        cluster, cluster_dir = found["clusters"][str(context["cluster"])]
        user, user_dir = found["users"][str(context["user"])]
    except KeyError as error:
        raise LoginError(f"kubeconfig {listed}: no complete current context ({error})") from error
    if not cluster.get("server"):
        raise LoginError(f"kubeconfig {listed}: the current cluster names no server")

    def file(entry: dict[str, Any], key: str, folder: Path) -> str | None:
        value = entry.get(key)
        return str(folder / Path(str(value)).expanduser()) if value else None

    credentials: dict[str, Any] = dict(
        token=user.get("token"),
        certificate_path=file(user, "client-certificate", user_dir),
        certificate_data=user.get("client-certificate-data"),
        private_key_path=file(user, "client-key", user_dir),
        private_key_data=user.get("client-key-data"),
    )
    expiration = None
    if user.get("tokenFile"):
        credentials["token"] = Path(str(file(user, "tokenFile", user_dir))).read_text().strip()
    elif user.get("exec"):
        issued = run_credential_program(user["exec"], user_dir)
        credentials.update({k: v for k, v in issued.items() if k != "expiration" and v})
        expiration = issued.get("expiration")
    elif user.get("auth-provider"):
        access = ((user["auth-provider"] or {}).get("config") or {}).get("access-token")
        credentials["token"] = credentials["token"] or access
    return kopf.ConnectionInfo(
        server=str(cluster["server"]),
        ca_path=file(cluster, "certificate-authority", cluster_dir),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        username=user.get("username"),
        password=user.get("password"),
        default_namespace=context.get("namespace"),
        proxy_url=cluster.get("proxy-url"),
        expiration=expiration,
        **credentials,
    )


def run_credential_program(spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Run a kubeconfig ``exec`` entry and read its ExecCredential: a token or a client
    certificate and key, and when they expire."""
    command = str(spec.get("command") or "")
    if not command:
        raise LoginError("kubeconfig user exec: no command")
    if "/" in command and not Path(command).is_absolute():
        command = str(folder / command)  # a relative path is relative to the kubeconfig
    env = dict(os.environ)
    env.update({str(e["name"]): str(e["value"]) for e in spec.get("env") or []})
    api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
    request = {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    env["KUBERNETES_EXEC_INFO"] = json.dumps(request)
    try:
        done = subprocess.run(
            [command, *map(str, spec.get("args") or [])],
            env=env,
            capture_output=True,
            text=True,
            timeout=EXEC_SECONDS,
            check=True,
        )
        status = json.loads(done.stdout).get("status") or {}
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError) as error:
        raise LoginError(f"kubeconfig user exec {command}: {error}") from error
    stamp = status.get("expirationTimestamp")
    return {
        "token": status.get("token"),
        "certificate_data": status.get("clientCertificateData"),
        "private_key_data": status.get("clientKeyData"),
        "expiration": datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        if stamp
        else None,
    }


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
