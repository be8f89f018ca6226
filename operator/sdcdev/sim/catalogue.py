"""Built-in catalogue of real instance types the simulated fleet can be made of.

Each entry carries what a kubelet and the cloud's node agents put on a Node of
that type: capacity (CPU, memory, the accelerator's extended resource), the
labels the cloud and the device plugins add, and OS details for ``nodeInfo``.
Figures are the public specifications of the instance types; labels follow
EKS (with the NVIDIA GPU feature discovery and the Neuron device plugin) and
GKE conventions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

Provider = Literal["aws", "gcp"]

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"


@dataclass(frozen=True)
class OsInfo:
    """What ``nodeInfo`` reports about the node's OS image."""

    image: str
    kernel_version: str
    container_runtime: str


@dataclass(frozen=True)
class InstanceType:
    """One machine type: what its Node object says about it."""

    name: str
    provider: Provider
    cpu: int
    """vCPUs (capacity)."""
    memory_gib: int
    accelerator_resource: str | None
    """Extended resource the device plugin advertises, e.g. ``nvidia.com/gpu``."""
    accelerator_count: int
    accelerator_model: str
    """Human name of the accelerator, for logs and the status file."""
    region: str
    zones: tuple[str, ...]
    pool_label: str
    """Label the provider puts the node pool name in."""
    os: OsInfo
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Type-specific labels (device plugin, cloud); instance type and zone are added."""
    extra_resources: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Further extended resources, e.g. Neuron cores next to Neuron devices, or the MIG
    profiles (nvidia.com/mig-<profile>) of a node whose GPUs are all partitioned."""
    max_pods: int = 110

    @property
    def has_accelerators(self) -> bool:
        return self.accelerator_resource is not None and self.accelerator_count > 0

    def capacity(self) -> dict[str, str]:
        """Node ``status.capacity`` as Kubernetes quantities."""
        cap = {
            "cpu": str(self.cpu),
            "memory": f"{self.memory_gib}Gi",
            "pods": str(self.max_pods),
            "ephemeral-storage": "500Gi",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
        }
        if self.accelerator_resource is not None:
            cap[self.accelerator_resource] = str(self.accelerator_count)
        for name, count in self.extra_resources.items():
            cap[name] = str(count)
        return cap

    def allocatable(self) -> dict[str, str]:
        """Capacity less what kubelet and system daemons reserve (EKS-like formula)."""
        alloc = self.capacity()
        reserved_mcpu = 60 + 10 * min(self.cpu, 2) + 5 * max(0, min(self.cpu, 4) - 2)
        reserved_mcpu += int(2.5 * max(0, self.cpu - 4))
        alloc["cpu"] = f"{self.cpu * 1000 - reserved_mcpu}m"
        reserved_mib = 255 + 11 * self.max_pods + 100  # kube-reserved + eviction threshold
        alloc["memory"] = f"{self.memory_gib * 1024 - reserved_mib}Mi"
        alloc["ephemeral-storage"] = "450Gi"
        return alloc


_AL2023 = OsInfo(
    image="Amazon Linux 2023.9.20251105",
    kernel_version="6.1.155-176.282.amzn2023.x86_64",
    container_runtime="containerd://1.7.27",
)
_COS = OsInfo(
    image="Container-Optimized OS from Google",
    kernel_version="6.6.97+",
    container_runtime="containerd://2.0.6",
)


def _labels(**items: str) -> Mapping[str, str]:
    return MappingProxyType(dict(items))


def _nvidia_gfd(product: str, count: int, memory_mib: int, family: str) -> dict[str, str]:
    """Labels NVIDIA GPU feature discovery puts on a node."""
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.family": family,
        "nvidia.com/cuda.driver-version.full": "570.172.08",
        "nvidia.com/cuda.runtime-version.full": "12.8",
    }


CATALOGUE: Mapping[str, InstanceType] = MappingProxyType(
    {
        t.name: t
        for t in [
            InstanceType(
                name="p5.48xlarge",
                provider="aws",
                cpu=192,
                memory_gib=2048,
                accelerator_resource="nvidia.com/gpu",
                accelerator_count=8,
                accelerator_model="NVIDIA H100 80GB HBM3",
                region="us-east-2",
                zones=("us-east-2a", "us-east-2b", "us-east-2c"),
                pool_label="eks.amazonaws.com/nodegroup",
                labels=_labels(
                    **_nvidia_gfd("NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper"),
                    **{
                        "karpenter.k8s.aws/instance-gpu-name": "h100",
                        "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
                        "karpenter.k8s.aws/instance-family": "p5",
                    },
                ),
                extra_resources=MappingProxyType({"vpc.amazonaws.com/efa": 32}),
                os=_AL2023,
            ),
            InstanceType(
                name="p4d.24xlarge",
                provider="aws",
                cpu=96,
                memory_gib=1152,
                accelerator_resource="nvidia.com/gpu",
                accelerator_count=8,
                accelerator_model="NVIDIA A100-SXM4-40GB",
                region="us-east-1",
                zones=("us-east-1a", "us-east-1b", "us-east-1c"),
                pool_label="eks.amazonaws.com/nodegroup",
                labels=_labels(
                    **_nvidia_gfd("NVIDIA-A100-SXM4-40GB", 8, 40960, "ampere"),
                    **{
                        "karpenter.k8s.aws/instance-gpu-name": "a100",
                        "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
                        "karpenter.k8s.aws/instance-family": "p4d",
                    },
                ),
                extra_resources=MappingProxyType({"vpc.amazonaws.com/efa": 4}),
                os=_AL2023,
            ),
            # Every A100 partitioned by the GPU Operator's MIG manager (all-balanced:
            # per GPU two 1g.10gb, one 2g.20gb and one 3g.40gb), advertised with the
            # mixed strategy: one resource per profile and nvidia.com/gpu at 0.
            InstanceType(
                name="p4de.24xlarge",
                provider="aws",
                cpu=96,
                memory_gib=1152,
                accelerator_resource="nvidia.com/gpu",
                accelerator_count=0,
                accelerator_model="NVIDIA A100-SXM4-80GB (MIG all-balanced)",
                region="us-east-1",
                zones=("us-east-1a", "us-east-1b", "us-east-1c"),
                pool_label="eks.amazonaws.com/nodegroup",
                labels=_labels(
                    **_nvidia_gfd("NVIDIA-A100-SXM4-80GB", 8, 81920, "ampere"),
                    **{
                        "nvidia.com/mig.strategy": "mixed",
                        "nvidia.com/mig.config": "all-balanced",
                        "nvidia.com/mig.capable": "true",
                        "karpenter.k8s.aws/instance-gpu-name": "a100",
                        "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
                        "karpenter.k8s.aws/instance-family": "p4de",
                    },
                ),
                extra_resources=MappingProxyType(
                    {
                        "nvidia.com/mig-1g.10gb": 16,
                        "nvidia.com/mig-2g.20gb": 8,
                        "nvidia.com/mig-3g.40gb": 8,
                        "vpc.amazonaws.com/efa": 4,
                    }
                ),
                os=_AL2023,
            ),
            InstanceType(
                name="a3-highgpu-8g",
                provider="gcp",
                cpu=208,
                memory_gib=1872,
                accelerator_resource="nvidia.com/gpu",
                accelerator_count=8,
                accelerator_model="NVIDIA H100 80GB HBM3",
                region="us-central1",
                zones=("us-central1-a", "us-central1-c"),
                pool_label="cloud.google.com/gke-nodepool",
                labels=_labels(
                    **{
                        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
                        "cloud.google.com/gke-gpu": "true",
                        "cloud.google.com/machine-family": "a3",
                        "cloud.google.com/gke-os-distribution": "cos",
                    }
                ),
                os=_COS,
            ),
            InstanceType(
                name="trn1.32xlarge",
                provider="aws",
                cpu=128,
                memory_gib=512,
                accelerator_resource="aws.amazon.com/neuron",
                accelerator_count=16,
                accelerator_model="AWS Trainium",
                region="us-east-1",
                zones=("us-east-1c", "us-east-1d"),
                pool_label="eks.amazonaws.com/nodegroup",
                labels=_labels(
                    **{
                        "karpenter.k8s.aws/instance-accelerator-name": "trainium",
                        "karpenter.k8s.aws/instance-accelerator-manufacturer": "aws",
                        "karpenter.k8s.aws/instance-accelerator-count": "16",
                        "karpenter.k8s.aws/instance-family": "trn1",
                    }
                ),
                # The Neuron device plugin advertises devices and their cores.
                extra_resources=MappingProxyType(
                    {"aws.amazon.com/neuroncore": 32, "vpc.amazonaws.com/efa": 8}
                ),
                os=_AL2023,
            ),
            InstanceType(
                name="ct5lp-hightpu-4t",
                provider="gcp",
                cpu=112,
                memory_gib=192,
                accelerator_resource="google.com/tpu",
                accelerator_count=4,
                accelerator_model="TPU v5e",
                region="us-west4",
                zones=("us-west4-a",),
                pool_label="cloud.google.com/gke-nodepool",
                labels=_labels(
                    **{
                        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                        "cloud.google.com/gke-tpu-topology": "2x2",
                        "cloud.google.com/machine-family": "ct5lp",
                        "cloud.google.com/gke-os-distribution": "cos",
                    }
                ),
                os=_COS,
            ),
            InstanceType(
                name="ct5p-hightpu-4t",
                provider="gcp",
                cpu=208,
                memory_gib=448,
                accelerator_resource="google.com/tpu",
                accelerator_count=4,
                accelerator_model="TPU v5p",
                region="us-east5",
                zones=("us-east5-a",),
                pool_label="cloud.google.com/gke-nodepool",
                labels=_labels(
                    **{
                        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                        "cloud.google.com/gke-tpu-topology": "2x2x1",
                        "cloud.google.com/machine-family": "ct5p",
                        "cloud.google.com/gke-os-distribution": "cos",
                    }
                ),
                os=_COS,
            ),
            InstanceType(
                name="m7i.8xlarge",
                provider="aws",
                cpu=32,
                memory_gib=128,
                accelerator_resource=None,
                accelerator_count=0,
                accelerator_model="none",
                region="us-east-2",
                zones=("us-east-2a", "us-east-2b"),
                pool_label="eks.amazonaws.com/nodegroup",
                labels=_labels(**{"karpenter.k8s.aws/instance-family": "m7i"}),
                os=_AL2023,
            ),
        ]
    }
)


def lookup(name: str) -> InstanceType:
    """The catalogue entry for ``name``; KeyError names the known types."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(
            f"unknown instance type {name!r}; known: {', '.join(sorted(CATALOGUE))}"
        ) from None
