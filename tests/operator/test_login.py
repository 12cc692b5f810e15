"""The operator's credentials (login.py) and its HTTP door's answer to a refused token (rest.py):
kubeconfig paths relative to the file, a token from a file or from a credential program, the
service account in a pod, and a 401 answered by logging in again."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from meshrun_operator.client import login as login_module
from meshrun_operator.client.errors import ApiError, ApiTimeout
from meshrun_operator.client.login import LoginError, from_kubeconfig, login
from meshrun_operator.client.rest import Rest

pytestmark = pytest.mark.unit


def kubeconfig(folder: Path, user: dict[str, Any], server: str = "https://10.0.0.1:6443") -> Path:
    cluster = {"server": server}
    if server.startswith("https"):
        cluster["certificate-authority"] = "ca.crt"
    context = {"cluster": "c", "user": "u", "namespace": "ml"}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "here",
        "contexts": [{"name": "here", "context": context}],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
    }
    path = folder / "config"
    path.write_text(yaml.safe_dump(config))
    return path


def test_paths_are_relative_to_the_kubeconfig_and_a_token_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("file-token\n")
    user = {
        "client-certificate": "certs/me.crt",
        "client-key": "certs/me.key",
        "tokenFile": "token",
    }
    info = from_kubeconfig(str(kubeconfig(tmp_path, user)))
    assert info.server == "https://10.0.0.1:6443" and info.default_namespace == "ml"
    assert info.ca_path == str(tmp_path / "ca.crt")
    assert info.certificate_path == str(tmp_path / "certs/me.crt")
    assert info.private_key_path == str(tmp_path / "certs/me.key")
    assert info.token == "file-token"


def test_a_credential_program_gives_the_token_and_when_it_expires(tmp_path: Path) -> None:
    program = tmp_path / "issue.py"
    program.write_text(
        "import json, os, sys\n"
        "asked = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "print(json.dumps({'apiVersion': asked['apiVersion'], 'kind': 'ExecCredential', 'status': "
        "{'token': 'from-' + sys.argv[1] + '-' + os.environ['TEAM'], "
        "'expirationTimestamp': '2027-01-02T03:04:05Z'}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(program), "exec"],
            "env": [{"name": "TEAM", "value": "vision"}],
        }
    }
    info = from_kubeconfig(str(kubeconfig(tmp_path, user)))
    assert info.token == "from-exec-vision"
    assert info.expiration == datetime(2027, 1, 2, 3, 4, 5, tzinfo=UTC)
    failing = {"exec": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}}
    with pytest.raises(LoginError, match="exec"):
        from_kubeconfig(str(kubeconfig(tmp_path, failing)))


def test_no_kubeconfig_and_no_current_context_are_named(tmp_path: Path) -> None:
    with pytest.raises(LoginError, match="missing"):
        from_kubeconfig(str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(LoginError, match="no complete current context"):
        from_kubeconfig(str(tmp_path / "empty"))


def test_in_a_pod_the_service_account_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "namespace").write_text("meshrun-system")
    monkeypatch.setattr(login_module, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setattr(login_module, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = login()
    assert info.server == "https://[fd00::1]:443" and info.token == "sa-token"
    assert info.ca_path == str(tmp_path / "ca.crt")
    assert info.default_namespace == "meshrun-system"


def test_a_refused_token_logs_in_again_once(tmp_path: Path) -> None:
    """A projected service account token rotates: the API server answers 401 to the old one,
    and the request is sent again with the new one; a second 401 is the answer."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer fresh":
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        return web.json_response({"kind": "Pod", "echo": await request.json()})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        tokens = iter(["stale", "fresh", "stale", "stale"])

        def issue() -> Any:
            path = kubeconfig(tmp_path, {"token": next(tokens)}, f"http://127.0.0.1:{port}")
            return from_kubeconfig(str(path))

        rest = Rest(issue, ApiTimeout.of(5))
        try:
            answer = await rest.request("POST", "/api/v1/pods", body={"a": 1})
            assert answer == {"kind": "Pod", "echo": {"a": 1}}
            assert seen == ["Bearer stale", "Bearer fresh"]
            await rest.close()
            rest.info = None  # the next login's token is stale, and so is the one after it
            with pytest.raises(ApiError) as refused:
                await rest.request("GET", "/api/v1/pods")
            assert refused.value.status == 401 and refused.value.message == "Unauthorized"
            assert seen[2:] == ["Bearer stale", "Bearer stale"]
        finally:
            await rest.close()
            await runner.cleanup()

    asyncio.run(scenario())
