"""The operator's credentials (login.py, the kubernetes package's loader) and its HTTP door's
answer to a refused token (rest.py), against real aiohttp servers (HTTP and HTTPS): kubeconfig
paths, tokenFile, exec plugins, tls-server-name, proxy-url, the service account and its rotated
token, one login for many requests, and a 401 that cancels nothing in flight."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import os
import ssl
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from meshrun_operator.client import credentials as credentials_module
from meshrun_operator.client import login as login_module
from meshrun_operator.client.credentials import LoginError
from meshrun_operator.client.errors import ApiError, ApiTimeout
from meshrun_operator.client.login import Login, from_kubeconfig, login
from meshrun_operator.client.rest import Rest, smaller_tls_buffers
from waiting import until

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def kubeconfig(
    folder: Path,
    user: dict[str, Any],
    server: str = "https://10.0.0.1:6443",
    **cluster_fields: Any,
) -> Path:
    cluster = {"server": server, **cluster_fields}
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


@asynccontextmanager
async def serving(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """A real HTTP(S) server on 127.0.0.1 answering every path with ``handler``; its port."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def certificate(folder: Path, name: str, alt_names: str) -> tuple[Path, ssl.SSLContext]:
    """A self-signed server certificate for ``alt_names``; (its file, a server TLS context)."""
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", f"/CN={name}", "-addext", f"subjectAltName={alt_names}",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


def credential_program(folder: Path, seconds: float = 0.0) -> dict[str, Any]:
    """A kubeconfig ``exec`` user whose program issues the token in ``folder/token`` (and logs
    each run in ``folder/runs``)."""
    program = folder / "issue.py"
    program.write_text(
        "import json, os, sys, time\n"
        f"time.sleep({seconds})\n"
        "folder = sys.argv[1]\n"
        "with open(os.path.join(folder, 'runs'), 'a') as runs: runs.write('run\\n')\n"
        "asked = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "token = open(os.path.join(folder, 'token')).read().strip()\n"
        "print(json.dumps({'apiVersion': asked['apiVersion'], 'kind': 'ExecCredential', "
        "'status': {'token': token + '-' + os.environ['TEAM'], "
        "'expirationTimestamp': '2099-01-02T03:04:05Z'}}))\n"
    )
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(program), str(folder)],
            "env": [{"name": "TEAM", "value": "vision"}],
        }
    }


def runs(folder: Path) -> int:
    path = folder / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_paths_are_relative_to_the_kubeconfig_and_a_token_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("file-token\n")
    (tmp_path / "certs").mkdir()
    for name in ("ca.crt", "certs/me.crt", "certs/me.key"):
        (tmp_path / name).write_text("x")
    user = {
        "client-certificate": "certs/me.crt",
        "client-key": "certs/me.key",
        "tokenFile": "token",
    }
    info = from_kubeconfig(str(kubeconfig(tmp_path, user, **{"certificate-authority": "ca.crt"})))
    assert info.server == "https://10.0.0.1:6443" and info.default_namespace == "ml"
    assert info.certificate_path == str(tmp_path / "certs/me.crt")
    assert info.private_key_path == str(tmp_path / "certs/me.key")
    assert info.as_http_headers() == {"Authorization": "Bearer file-token"}


@pytest.mark.parametrize(
    ("skip", "insecure"),
    [(None, False), (False, False), ("false", False), ("False", False), (True, True),
     ("true", True)],
)  # fmt: skip
def test_insecure_skip_tls_verify_is_read_as_a_boolean(
    tmp_path: Path, skip: object, insecure: bool
) -> None:
    # The kubernetes package's loader takes the string "false" as true (Python's truth).
    fields = {} if skip is None else {"insecure-skip-tls-verify": skip}
    info = from_kubeconfig(str(kubeconfig(tmp_path, {"token": "t"}, **fields)))
    assert info.insecure is insecure


def test_a_credential_program_gives_the_token_and_when_it_expires(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-exec")
    info = from_kubeconfig(str(kubeconfig(tmp_path, credential_program(tmp_path))))
    assert info.token == "from-exec-vision"
    assert info.expiration == datetime(2099, 1, 2, 3, 4, 5, tzinfo=UTC)
    failing = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": ["-c", "raise SystemExit(3)"],
        }
    }
    with pytest.raises(LoginError, match=r"exec.*returned 3"):
        from_kubeconfig(str(kubeconfig(tmp_path, failing)))


def test_missing_kubeconfig_impersonation_and_no_server_are_named(tmp_path: Path) -> None:
    with pytest.raises(LoginError, match="missing"):
        from_kubeconfig(str(tmp_path / "missing"))
    with pytest.raises(LoginError, match=r"impersonates \(as, as-groups\)"):
        from_kubeconfig(
            str(
                kubeconfig(tmp_path, {"token": "t", "as": "admin", "as-groups": ["system:masters"]})
            )
        )
    (tmp_path / "empty").write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(LoginError, match="empty"):
        from_kubeconfig(str(tmp_path / "empty"))


def test_an_oidc_id_token_and_basic_auth_are_sent_as_the_loader_reads_them(
    tmp_path: Path,
) -> None:
    # An ID token that expires in 2099 (header.payload.signature, base64url without padding).
    id_token = "eyJhbGciOiJub25lIn0.eyJleHAiOjQwNzA5MDg4MDB9.c2ln"
    provider = {"name": "oidc", "config": {"id-token": id_token, "idp-issuer-url": "https://x"}}
    info = from_kubeconfig(str(kubeconfig(tmp_path, {"auth-provider": provider})))
    assert info.as_http_headers() == {"Authorization": f"Bearer {id_token}"}
    basic = from_kubeconfig(str(kubeconfig(tmp_path, {"username": "u", "password": "p"})))
    assert basic.as_http_headers() == {"Authorization": "Basic dTpw"}


def test_in_a_pod_the_service_account_is_used_and_its_rotated_token_read_without_a_401(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet replaces a projected token file before the old token expires: the next
    request carries the new token, with no 401 first."""
    account = tmp_path / "account"
    account.mkdir()
    ca, tls = certificate(tmp_path, "apiserver", "IP:127.0.0.1")
    (account / "ca.crt").write_bytes(ca.read_bytes())
    (account / "token").write_text("sa-token-1")
    (account / "namespace").write_text("meshrun-system")
    monkeypatch.setattr(credentials_module, "SERVICE_ACCOUNT", account)
    monkeypatch.setattr(credentials_module, "SERVICE_ACCOUNT_NAMESPACE", account / "namespace")
    monkeypatch.setattr(login_module, "STAT_SECONDS", 0.0)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = login()
    assert info.server == "https://[fd00::1]:443" and info.token == "sa-token-1"
    assert info.ca_path == str(account / "ca.crt") and info.default_namespace == "meshrun-system"

    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"kind": "Status"})

    async def scenario() -> None:
        async with serving(handler, tls) as port:
            monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
            rest = Rest(Login(), ApiTimeout.of(5))
            try:
                await rest.request("GET", "/api")
                replacement = account / "token.new"
                replacement.write_text("sa-token-2")
                os.replace(replacement, account / "token")  # as the kubelet's atomic writer
                await rest.request("GET", "/api")
            finally:
                await rest.close()

    asyncio.run(scenario())
    assert seen == ["Bearer sa-token-1", "Bearer sa-token-2"]


def test_a_large_answer_reads_whole_through_the_small_tls_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # monkeypatch puts asyncio's own size back after the test.
    monkeypatch.setattr(asyncio.sslproto.SSLProtocol, "max_size", 256 * 1024)
    smaller_tls_buffers()
    ca, tls = certificate(tmp_path, "apiserver", "IP:127.0.0.1")
    items = [{"metadata": {"name": f"node-{i}"}, "padding": "x" * 1000} for i in range(1500)]

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"kind": "NodeList", "items": items})

    async def scenario() -> dict[str, Any]:
        async with serving(handler, tls) as port:
            server = f"https://127.0.0.1:{port}"
            config = kubeconfig(
                tmp_path, {"token": "t"}, server, **{"certificate-authority": str(ca)}
            )
            rest = Rest(Login(str(config)), ApiTimeout.of(10))
            try:
                answer: dict[str, Any] = await rest.request("GET", "/api/v1/nodes")
                return answer
            finally:
                await rest.close()

    answer = asyncio.run(scenario())
    assert asyncio.sslproto.SSLProtocol.max_size == 16 * 1024
    assert answer["items"] == items  # 1.5 MB, about a hundred reads of 16 KiB


def test_tls_server_name_checks_the_certificate_for_that_name(tmp_path: Path) -> None:
    ca, tls = certificate(tmp_path, "api.internal", "DNS:api.internal")

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions"})

    async def scenario() -> None:
        async with serving(handler, tls) as port:
            server = f"https://127.0.0.1:{port}"
            named = kubeconfig(
                tmp_path,
                {"token": "t"},
                server,
                **{"certificate-authority": str(ca), "tls-server-name": "api.internal"},
            )
            rest = Rest(Login(str(named)), ApiTimeout.of(5))
            try:
                assert await rest.request("GET", "/api") == {"kind": "APIVersions"}
            finally:
                await rest.close()
            plain = kubeconfig(
                tmp_path, {"token": "t"}, server, **{"certificate-authority": str(ca)}
            )
            rest = Rest(Login(str(plain)), ApiTimeout.of(5))
            try:
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await rest.request("GET", "/api")  # the certificate is not for 127.0.0.1
            finally:
                await rest.close()

    asyncio.run(scenario())


def proxied_requests(tmp_path: Path, setup: Callable[[str], dict[str, Any]]) -> list[str]:
    """The URLs a proxy was asked for while the operator's client sent GET /api to
    http://api.invalid:6443, logged in with a kubeconfig whose cluster gets ``setup(proxy)``'s
    fields (``setup`` may also point the environment at the proxy)."""
    proxied: list[str] = []

    async def proxy(request: web.Request) -> web.Response:
        proxied.append(str(request.url))  # a proxy is asked for the absolute URL
        return web.json_response({"kind": "APIVersions"})

    async def scenario() -> None:
        async with serving(proxy) as port:
            fields = setup(f"http://127.0.0.1:{port}")
            config = kubeconfig(tmp_path, {"token": "t"}, "http://api.invalid:6443", **fields)
            rest = Rest(Login(str(config)), ApiTimeout.of(5))
            try:
                assert await rest.request("GET", "/api") == {"kind": "APIVersions"}
            finally:
                await rest.close()

    asyncio.run(scenario())
    return proxied


def test_requests_go_through_the_clusters_proxy_url(tmp_path: Path) -> None:
    proxied = proxied_requests(tmp_path, lambda proxy: {"proxy-url": proxy})
    assert proxied == ["http://api.invalid:6443/api"]


def test_without_a_proxy_url_the_environments_proxy_is_used_unless_no_proxy_exempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def from_environment(proxy: str) -> dict[str, Any]:
        monkeypatch.setenv("http_proxy", proxy)
        return {}

    assert proxied_requests(tmp_path, from_environment) == ["http://api.invalid:6443/api"]
    # Which proxy a server gets: its scheme's, else all_proxy's; none where no_proxy names its
    # host (or a domain above it, or everything).
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        for variant in (name, name.upper()):
            monkeypatch.delenv(variant, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://corporate:3128")
    monkeypatch.setenv("ALL_PROXY", "http://fallback:3128")
    monkeypatch.setenv("NO_PROXY", "10.96.0.1,.cluster.local")
    proxy_of = credentials_module.environment_proxy
    assert proxy_of("https://api.example:6443") == "http://corporate:3128"
    assert proxy_of("http://api.example:6443") == "http://fallback:3128"
    assert proxy_of("https://10.96.0.1:443") is None
    assert proxy_of("https://kubernetes.default.svc.cluster.local") is None
    monkeypatch.setenv("NO_PROXY", "*")
    assert proxy_of("https://api.example:6443") is None


def test_a_cold_start_makes_one_login_and_a_rotated_token_cancels_nothing_in_flight(
    tmp_path: Path,
) -> None:
    """40 requests at once on 8 connections. At a cold start: one run of the credential program
    for all of them. After the API server stopped accepting the token: every request answered
    (none cut off by the new login), one more run of the program, and the old session closed
    only once its last request ended."""
    accepted = {"Bearer one-vision"}
    refused = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal refused
        await asyncio.sleep(0.05)  # keeps the 8 connections busy, so requests queue for them
        if request.headers.get("Authorization") not in accepted:
            refused += 1
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        return web.json_response({"kind": "Pod", "path": request.path})

    async def burst(rest: Rest) -> list[Any]:
        return await asyncio.gather(
            *(rest.request("GET", f"/api/v1/pods/{i}") for i in range(40)), return_exceptions=True
        )

    async def scenario() -> None:
        (tmp_path / "token").write_text("one")
        async with serving(handler) as port:
            config = kubeconfig(
                tmp_path, credential_program(tmp_path, 0.2), f"http://127.0.0.1:{port}"
            )
            rest = Rest(Login(str(config)), ApiTimeout.of(10), connections=8)
            try:
                answers = await burst(rest)
                assert all(isinstance(a, dict) for a in answers), answers
                assert runs(tmp_path) == 1 and rest.login.logins == 1 and refused == 0
                first = rest._current
                assert first is not None

                (tmp_path / "token").write_text("two")
                accepted.clear()
                accepted.add("Bearer two-vision")  # the old token is refused from now on
                answers = await burst(rest)
                errors = [a for a in answers if not isinstance(a, dict)]
                assert errors == [], f"{len(errors)} requests failed: {errors[:3]}"
                assert [a["path"] for a in answers] == [f"/api/v1/pods/{i}" for i in range(40)]
                assert runs(tmp_path) == 2 and rest.login.logins == 2
                assert 0 < refused <= 40
                assert rest._current is not first and first.users == 0
                await asyncio.sleep(0)  # the old session's close was scheduled when it emptied
                assert first.session.closed
            finally:
                await rest.close()

    asyncio.run(scenario())


def test_a_refused_token_logs_in_again_once_and_kopf_gets_the_new_one(tmp_path: Path) -> None:
    """A 401 logs in again and sends the request once more; a second 401 is the answer. kopf,
    asking again after its own 401, gets what the operator's requests already renewed, with no
    login of its own."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer fresh-vision":
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        return web.json_response({"kind": "Pod", "echo": await request.json()})

    async def scenario() -> None:
        async with serving(handler) as port:
            (tmp_path / "token").write_text("stale")
            config = kubeconfig(tmp_path, credential_program(tmp_path), f"http://127.0.0.1:{port}")
            credentials = Login(str(config))
            for_kopf = await credentials.for_kopf()
            assert for_kopf.token == "stale-vision"
            rest = Rest(credentials, ApiTimeout.of(5))
            try:
                (tmp_path / "token").write_text("fresh")
                answer = await rest.request("POST", "/api/v1/pods", body={"a": 1})
                assert answer == {"kind": "Pod", "echo": {"a": 1}}
                assert seen == ["Bearer stale-vision", "Bearer fresh-vision"]
                assert runs(tmp_path) == 2
                renewed = await credentials.for_kopf()  # kopf's stale token was refused
                assert renewed.token == "fresh-vision" and runs(tmp_path) == 2

                (tmp_path / "token").write_text("revoked")
                await credentials.refused(renewed)
                with pytest.raises(ApiError) as answer_401:
                    await rest.request("GET", "/api/v1/pods")
                assert answer_401.value.status == 401 and answer_401.value.message == "Unauthorized"
                assert seen[2:] == ["Bearer revoked-vision", "Bearer revoked-vision"]
            finally:
                await rest.close()

    asyncio.run(scenario())


def test_the_aiohttp_floor_has_the_decompression_bomb_fix() -> None:
    # Before 3.13.3 a compressed answer (a /progress read, an API server's) decompressed
    # without bound (GHSA-6mq8-rvhq-8wgg).
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (floor,) = [d for d in project["project"]["optional-dependencies"]["operator"]
                if d.startswith("aiohttp")]  # fmt: skip
    version = tuple(int(part) for part in floor.removeprefix("aiohttp>=").split("."))
    assert version >= (3, 13, 3), floor
    assert tuple(int(p) for p in aiohttp.__version__.split(".")[:3]) >= version


def test_a_hung_credential_program_is_one_process_however_often_the_login_is_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A credential program that does not return: each try gives up after LOGIN_SECONDS, and
    the next waits for the same run instead of starting another program on another thread;
    once the program answers, its token is used."""
    monkeypatch.setattr(login_module, "LOGIN_SECONDS", 0.3)
    program = tmp_path / "hang.py"
    program.write_text(
        "import json, os, sys, time\n"
        "folder = sys.argv[1]\n"
        "with open(os.path.join(folder, 'runs'), 'a') as runs: runs.write('run\\n')\n"
        "while not os.path.exists(os.path.join(folder, 'release')): time.sleep(0.05)\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        "'kind': 'ExecCredential', 'status': {'token': 'late'}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(program), str(tmp_path)],
        }
    }
    login = Login(str(kubeconfig(tmp_path, user)))

    async def scenario() -> None:
        for _ in range(5):
            with pytest.raises(TimeoutError):
                await login.current()
        # The first try started the program; a loaded machine may take longer than the tries'
        # 1.5 s to start its interpreter and note its run.
        await until(lambda: runs(tmp_path) >= 1, "the credential program's run", seconds=60)
        assert runs(tmp_path) == 1, "a credential program was started again while one runs"
        (tmp_path / "release").touch()
        for _ in range(100):  # tries go on until the one run answers
            try:
                info = await login.current()
                break
            except TimeoutError:
                continue
        assert info.token == "late"
        assert runs(tmp_path) == 1 and login.logins == 1

    try:
        asyncio.run(scenario())
    finally:
        (tmp_path / "release").touch()
