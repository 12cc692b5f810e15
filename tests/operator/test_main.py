"""``meshrun operator``: option errors, no cluster, and the explicit kopf settings."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import kopf
import pytest
from kopf._core.actions.loggers import ObjectLogger
from kopf._core.engines import posting
from meshrun_operator.main import kopf_settings, main, parse_args
from meshrun_operator.runtime import kueue_watch
from meshrun_operator.runtime.handlers import register

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--resync-seconds", "0"], "--resync-seconds"),
        (["--workers", "-1"], "--workers"),
        (["--no-such-flag"], "--no-such-flag"),
        (["--api-timeout-seconds", "0"], "--api-timeout-seconds"),
        (["--error-backoff-base-seconds", "0"], "--error-backoff-base-seconds"),
        (["--leader-election", "--lease-renew-deadline-seconds", "20"], "--lease-"),
        (["--operator-labels", "app"], "--operator-labels"),
    ],
)
def test_bad_options_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert flag in capsys.readouterr().err


def test_the_error_backoff_flags_reach_the_timing() -> None:
    argv = ["--error-backoff-base-seconds", "0.5", "--error-backoff-max-seconds", "4"]
    timing = parse_args(argv).timing
    assert [timing.error_backoff(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 4, 4]
    assert parse_args([]).timing.error_backoff(1) == 2


def test_no_cluster_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main([]) == 1
    assert "no cluster to talk to" in capsys.readouterr().err


def test_kopf_keys_live_under_meshrun_dev() -> None:
    settings = kopf_settings(parse_args(["--namespace", "a", "--namespace", "b"]))
    assert settings.persistence.finalizer == "meshrun.dev/finalizer"
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "meshrun.dev"
    # No kopf peering, with or without leader election: the Lease decides who acts.
    assert settings.peering.standalone
    elected = parse_args(["--leader-election", "--leader-election-namespace", "ops"])
    assert kopf_settings(elected).peering.standalone
    assert elected.leader is not None and elected.leader.namespace == "ops"
    assert elected.leader.lease == "meshrun-operator"
    assert parse_args([]).leader is None


def test_kopf_requests_are_bounded_and_only_the_operators_pods_are_watched() -> None:
    settings = kopf_settings(parse_args(["--api-timeout-seconds", "7"]))
    assert settings.networking.request_timeout == 7
    assert settings.networking.connect_timeout == 7
    assert settings.watching.client_timeout is not None  # a silent watch is ended, too
    # Existence selectors, sent to the API server: pods, Services, NetworkPolicies and
    # Workloads of meshrun jobs only.
    assert set(settings.watching.label_selectors.values()) == {"meshrun.dev/job-name"}
    selected = {key.plural or key.any_name for key in settings.watching.label_selectors}
    assert selected == {"pods", "services", "networkpolicies", "workloads"}


def test_no_essence_is_built_since_no_handler_diffs_one() -> None:
    settings = kopf_settings(parse_args([]))
    storage = settings.persistence.diffbase_storage
    body = kopf.Body({"metadata": {"name": "j"}, "spec": {"a": [1]}, "status": {"b": 2}})
    assert storage.build(body=body) == {} and storage.fetch(body=body) is None
    # Which is right only while the operator registers no change handler, daemon or timer:
    # those would diff the essence.
    registry = kopf.OperatorRegistry()
    register(registry, watch_nodes=True)
    kueue_watch.register(registry, with_kueue=True)
    assert registry._watching.get_all_handlers() and registry._indexing.get_all_handlers()
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()


@pytest.mark.parametrize(
    "entry",
    [
        "from meshrun.cli.main import main; main(['operator', '--no-such-flag'])",
        "import runpy; runpy.run_module('meshrun_operator', run_name='__main__')",
    ],
    ids=["meshrun-operator", "python-m-meshrun_operator"],
)
def test_every_way_in_keeps_the_generated_kubernetes_client_out(entry: str) -> None:
    # kopf imports the kubernetes client when it is installed (it is, here): both ways into
    # the operator must keep its generated models out before kopf is imported, while the
    # config loader the operator logs in with still imports. What the loader names only for
    # an OIDC refresh or basic auth (requests, oauthlib, urllib3, the client's Configuration)
    # comes in when first used, and is then the real thing.
    probe = (
        "import sys\n"
        f"try:\n    {entry}\nexcept SystemExit:\n    pass\n"
        "assert 'kopf' in sys.modules, 'the operator was not reached'\n"
        "import kubernetes.config\n"
        "from kubernetes.config import kube_config\n"
        "from meshrun_operator.client import credentials\n"
        "real = ('kubernetes.client.models', 'kubernetes.client.configuration', 'requests',\n"
        "        'oauthlib.oauth2.rfc6749', 'urllib3.util')\n"
        "print([name for name in real if name in sys.modules])\n"
        "import requests_oauthlib as named\n"
        "session = kube_config.OAuth2Session(client_id='meshrun')\n"
        "print(type(session).__module__, session.client_id, 'requests' in sys.modules)\n"
        "print(named.OAuth1Session.__module__)\n"
        "refused = kube_config.oauthlib.oauth2.rfc6749.errors.InvalidClientIdError\n"
        "print(refused.__module__)\n"
        "print(kube_config.urllib3.util.make_headers(basic_auth='a:b'))\n"
        "from kubernetes.client import Configuration\n"
        "made = Configuration(host='https://h')\n"
        "print(type(made).__module__, made.host, type(Configuration.get_default_copy()).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, "--no-such-flag"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:6] == [
        "[]",
        "requests_oauthlib.oauth2_session meshrun True",
        "requests_oauthlib.oauth1_session",
        "oauthlib.oauth2.rfc6749.errors",
        "{'authorization': 'Basic YTpi'}",
        "kubernetes.client.configuration https://h Configuration",
    ]


def _kopf_posts(settings: kopf.OperatorSettings) -> list[str]:
    """What kopf's own posting (its object logger and kopf.event/info/warn/exception, as a
    handler or kopf itself would call them) puts on the queue its poster writes Events from."""
    queue: posting.K8sEventQueue = asyncio.Queue()
    body = kopf.Body({"apiVersion": "meshrun.dev/v1alpha1", "kind": "ParallelTrainingJob",
                      "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}})  # fmt: skip

    async def scenario() -> None:
        posting.settings_var.set(settings)
        posting.event_queue_var.set(queue)
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        kopf.event(body, type="Normal", reason="Event", message="m")
        kopf.info(body, reason="Info", message="m")
        kopf.warn(body, reason="Warn", message="m")
        kopf.exception(body, reason="Exception", exc=RuntimeError("m"))
        logger = ObjectLogger(body=body, settings=settings)
        logger.warning("a handler's warning")
        logger.error("Handler 'job-changed' failed with an exception. Will retry.")

    asyncio.run(scenario())
    return [queue.get_nowait().reason for _ in range(queue.qsize())]


def test_kopf_itself_posts_no_event_only_the_leader_checked_client_does() -> None:
    """kopf's poster writes with kopf's own session, outside the leadership check: with the
    operator's settings nothing reaches it, whoever leads. (kopf's defaults would post them.)"""
    defaults = kopf.OperatorSettings()
    defaults.posting.loggers = True
    assert _kopf_posts(defaults) == ["Event", "Info", "Warn", "Exception", "Logging", "Logging"]
    assert _kopf_posts(kopf_settings(parse_args([]))) == []
    elected = parse_args(["--leader-election", "--leader-election-namespace", "ops"])
    assert _kopf_posts(kopf_settings(elected)) == []
