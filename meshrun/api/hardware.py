"""Built-in profiles of GPU products, keyed by the nodes' ``nvidia.com/gpu.product`` label.

The label values are those NVIDIA's GPU Feature Discovery writes (the product name as
``nvidia-smi`` prints it, spaces as dashes). Figures are the vendors' datasheet numbers:

* ``peak_tflops``: dense (no 2:4 sparsity) bf16 tensor-core TFLOP/s;
* ``memory_gib``: memory one process can use, as ``nvidia-smi`` reports it (an H100 80GB shows
  81,559 MiB, an H200 143,771 MiB), rounded to whole GiB; it defaults
  ``spec.resources.acceleratorMemoryGiB``;
* ``memory_gbps``: HBM (or GDDR) bandwidth in GB/s;
* ``nvlink_gbps``: NVLink bandwidth per GPU and direction in GB/s (half the bidirectional
  figure datasheets print: 900 GB/s on an H100 SXM is 450 each way); 0 for PCIe-only cards;
* ``network_gbps``: the network a node of this product usually has per GPU, in Gb/s (one
  400 Gb/s InfiniBand NIC per GPU on DGX/HGX H100, H200 and B200, 200 Gb/s on DGX A100).

Sources: NVIDIA H100, H200, A100, B200, L40S and H100 NVL datasheets; DGX H100/A100/B200
user guides for the networks.
"""

from __future__ import annotations

from dataclasses import dataclass

PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label naming its GPU product (GPU Feature Discovery), which ``acceleratorProduct``
selects."""
PCIE_GBPS = {4: 25.0, 5: 50.0}
"""What a PCIe x16 link moves per direction in practice, GB/s, by generation (the raw rate is
32 and 64 GB/s; NCCL over PCIe and host bridges gets about 80% of it)."""
ETHERNET_GBITS = 25.0
"""Per-accelerator network of an Ethernet cluster, Gb/s (a 200 Gb/s NIC per 8-GPU node)."""
INFINIBAND_GBITS = 400.0
"""Per-accelerator network of an InfiniBand cluster of unknown product, Gb/s (as DGX H100)."""


@dataclass(frozen=True)
class AcceleratorProfile:
    """What the step-time model needs to know about one GPU product."""

    product: str
    """The ``nvidia.com/gpu.product`` label value."""
    peak_tflops: float
    """Dense bf16 tensor-core peak, TFLOP/s."""
    memory_gib: int
    """Usable memory of one GPU, GiB."""
    memory_gbps: float
    """Memory bandwidth, GB/s."""
    nvlink_gbps: float
    """NVLink bandwidth per GPU and direction, GB/s; 0 without NVLink."""
    pcie_generation: int
    """PCIe generation of the card's host link."""
    network_gbps: float
    """Typical inter-node network per GPU of nodes with this product, Gb/s."""

    @property
    def pcie_gbps(self) -> float:
        return PCIE_GBPS[self.pcie_generation]


PROFILES: dict[str, AcceleratorProfile] = {
    p.product: p
    for p in (
        AcceleratorProfile("NVIDIA-H100-80GB-HBM3", 989.0, 80, 3350.0, 450.0, 5, 400.0),
        AcceleratorProfile("NVIDIA-H100-NVL", 835.0, 94, 3900.0, 300.0, 5, 400.0),
        AcceleratorProfile("NVIDIA-H100-PCIe", 756.0, 80, 2000.0, 0.0, 5, 200.0),
        AcceleratorProfile("NVIDIA-H200", 989.0, 140, 4800.0, 450.0, 5, 400.0),
        AcceleratorProfile("NVIDIA-GH200-480GB", 989.0, 95, 4000.0, 450.0, 5, 400.0),
        AcceleratorProfile("NVIDIA-B200", 2250.0, 179, 8000.0, 900.0, 5, 400.0),
        AcceleratorProfile("NVIDIA-A100-SXM4-80GB", 312.0, 80, 2039.0, 300.0, 4, 200.0),
        AcceleratorProfile("NVIDIA-A100-SXM4-40GB", 312.0, 40, 1555.0, 300.0, 4, 200.0),
        AcceleratorProfile("NVIDIA-A100-80GB-PCIe", 312.0, 80, 1935.0, 0.0, 4, 100.0),
        AcceleratorProfile("NVIDIA-A100-PCIE-40GB", 312.0, 40, 1555.0, 0.0, 4, 100.0),
        AcceleratorProfile("NVIDIA-L40S", 362.0, 44, 864.0, 0.0, 4, 100.0),
        AcceleratorProfile("NVIDIA-A10G", 70.0, 22, 600.0, 0.0, 4, 50.0),
    )
}
"""The built-in products."""

DEFAULT_PRODUCT = "NVIDIA-H100-80GB-HBM3"
"""The profile a GPU job without ``acceleratorProduct`` (or with an unknown one) is estimated
on: the GPU most published layouts were measured on."""

CPU_PROFILE = AcceleratorProfile("cpu", 1.0, 0, 50.0, 0.0, 4, INFINIBAND_GBITS)
"""A nominal CPU socket slot (1 TFLOP/s, 50 GB/s): enough to rank layouts, not to promise."""


def profile_of(product: str | None) -> AcceleratorProfile | None:
    """The built-in profile of a label value, or None when it is not one of ``PROFILES``."""
    return PROFILES.get(product or DEFAULT_PRODUCT)


def job_profile(cpu: bool, product: str | None) -> AcceleratorProfile:
    """The profile a job is estimated on: the product's, the default GPU's for a GPU job without
    a known product, a nominal one for CPU jobs."""
    if cpu:
        return CPU_PROFILE
    return profile_of(product) or PROFILES[DEFAULT_PRODUCT]


def intra_node_rate(profile: AcceleratorProfile, kind: str, override_gbps: float | None) -> float:
    """Bytes/s per accelerator and direction inside a node: the override, else the product's
    NVLink (``nvlink``, when it has NVLink) or its PCIe link."""
    if override_gbps is not None:
        return override_gbps * 1e9
    fast = kind == "nvlink" and profile.nvlink_gbps > 0
    return (profile.nvlink_gbps if fast else profile.pcie_gbps) * 1e9


def inter_node_rate(profile: AcceleratorProfile, kind: str, override_gbits: float | None) -> float:
    """Bytes/s per accelerator between nodes: the override, else the product's usual network
    (``infiniband``) or an Ethernet cluster's."""
    if override_gbits is not None:
        gbits = override_gbits
    else:
        gbits = profile.network_gbps if kind == "infiniband" else ETHERNET_GBITS
    return gbits * 1e9 / 8
