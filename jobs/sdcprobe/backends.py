"""Device backends: the little that differs between CPU, CUDA and XLA.

Every check is written against :class:`Backend` (device, sync, to-host, dtype
support, collective backend name), so the same code runs everywhere. Setting a
backend up also pins down everything that would make a healthy device's bits
vary between runs: deterministic algorithms, TF32 off, fixed cuBLAS workspace,
fixed thread count, no stochastic rounding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from sdcprobe.devices import BackendName, apply_determinism_env, xla_on_host


@dataclass
class Backend:
    """One device as seen by one worker process."""

    name: BackendName
    index: int
    device: torch.device
    threads: int

    def sync(self) -> None:
        """Wait until queued device work is done (and, on XLA, cut the lazy graph)."""
        if self.name == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.name == "xla":
            import torch_xla

            torch_xla.sync(wait=True)

    def step_boundary(self) -> None:
        """End of a training step or GEMM round: on XLA this compiles/runs the graph."""
        if self.name == "xla":
            import torch_xla

            torch_xla.sync()

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU copy of ``tensor``."""
        return tensor.detach().to("cpu").contiguous()

    def supports(self, dtype: torch.dtype) -> bool:
        """Whether GEMMs in ``dtype`` are meaningful on this device."""
        if dtype == torch.float64:
            # TPUs emulate fp64 slowly and Neuron cores have none; PJRT CPU is fine.
            return self.name != "xla" or os.environ.get("PJRT_DEVICE", "CPU").upper() == "CPU"
        return True

    @property
    def dist_backend(self) -> str:
        """torch.distributed backend for collectives between this node's devices."""
        if self.name == "cuda":
            return "nccl"
        if self.name == "xla" and not xla_on_host():
            return "xla"
        # CPU replicas, and XLA on PJRT CPU (no cross-process XLA:CPU collectives):
        # gloo between processes.
        return "gloo"

    @property
    def collective_device(self) -> torch.device:
        """Where collective buffers live (the host when gloo stands in for XLA:CPU)."""
        if self.name == "xla" and xla_on_host():
            return torch.device("cpu")
        return self.device


def setup_backend(name: BackendName, index: int, threads: int) -> Backend:
    """Configure this process for deterministic execution on device ``index`` of ``name``."""
    apply_determinism_env()
    torch.set_num_threads(threads)
    # Strict: an op without a deterministic implementation raises, which makes
    # the check inconclusive. Warning instead would let it run and its run-to-run
    # noise would read as SDC on replay: a false quarantine.
    torch.use_deterministic_algorithms(True)
    if name == "cpu":
        return Backend(name, index, torch.device("cpu"), threads)
    if name == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        # Reduced-precision reductions would make half GEMMs accumulate in half:
        # less accurate and outside the ABFT bound.
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.cuda.set_device(index)
        return Backend(name, index, torch.device("cuda", index), threads)
    import torch_xla

    try:  # fp32 matmuls must be fp32 on TPU (the default uses bf16 passes)
        import torch_xla.backends

        if torch_xla.backends.get_mat_mul_precision() != "highest":
            torch_xla.backends.set_mat_mul_precision("highest")
    except (ImportError, AttributeError):  # older torch-xla
        pass
    return Backend(name, index, torch_xla.device(), threads)
