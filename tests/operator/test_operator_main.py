"""``meshrun operator``: option errors, no cluster, and the explicit kopf settings."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
from meshrun_operator import kueue_watch
from meshrun_operator.handlers import register
from meshrun_operator.main import kopf_settings, main, parse_args

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--resync-seconds", "0"], "--resync-seconds"),
        (["--workers", "-1"], "--workers"),
        (["--no-such-flag"], "--no-such-flag"),
        (["--api-timeout-seconds", "0"], "--api-timeout-seconds"),
        (["--leader-election", "--lease-renew-deadline-seconds", "20"], "--lease-"),
        (["--operator-labels", "app"], "--operator-labels"),
    ],
)
def test_bad_options_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert flag in capsys.readouterr().err


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
