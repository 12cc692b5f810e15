"""What a trainer pod gets for NCCL and shared memory, and what its template keeps."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_operator.children.podtemplate import NCCL_DEFAULTS
from test_builders import container, env_of, pod_for

pytestmark = pytest.mark.unit


def _shm(pod: dict[str, Any]) -> dict[str, Any] | None:
    mount = next(
        (m for m in container(pod).get("volumeMounts", []) if m["mountPath"] == "/dev/shm"), None
    )
    if mount is None:
        return None
    volume: dict[str, Any] = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    return volume


def test_gpu_pods_get_memory_backed_shm_and_nccl_error_handling() -> None:
    pod = pod_for(resources={"accelerator": "nvidia.com/gpu", "sharedMemoryGiB": 16})
    assert _shm(pod) == {
        "name": "meshrun-shm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"},
    }
    env = env_of(pod)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith("/checkpoints/")


def test_shm_without_a_size_and_no_nccl_variables_on_cpu() -> None:
    pod = pod_for(resources={"accelerator": "cpu"})
    assert _shm(pod) == {"name": "meshrun-shm", "emptyDir": {"medium": "Memory"}}
    assert not set(NCCL_DEFAULTS) & set(env_of(pod))


def test_the_templates_nccl_settings_and_shm_pass_untouched() -> None:
    user_env = [
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth1"},
        {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "3"},
    ]
    own_shm = {"name": "big-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}
    template = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "env": user_env,
                    "volumeMounts": [{"name": "big-shm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [own_shm],
        }
    }
    pod = pod_for(resources={"accelerator": "nvidia.com/gpu"}, podTemplate=template)
    env = env_of(pod)
    for item in user_env:
        assert env[item["name"]] == item["value"], item["name"]
    assert _shm(pod) == own_shm
    assert not any(v["name"] == "meshrun-shm" for v in pod["spec"]["volumes"])
