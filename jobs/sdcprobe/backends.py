"""Device backends: the little that differs between CPU, CUDA and XLA.

Every check is written against :class:`Backend` (device, sync, to-host, dtype
support, collective backend name), so the same code runs everywhere. Setting a
backend up also pins down everything that would make a healthy device's bits
vary between runs: deterministic algorithms, TF32 off, fixed cuBLAS workspace,
fixed thread count, no stochastic rounding.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from sdcprobe.devices import BackendName, apply_determinism_env, xla_on_host


@dataclass
class HostTraffic:
    """What crossed from the device to the host: every crossing goes through
    :meth:`Backend.to_host`, so these counters are the whole story (the structural
    test in ``tests/probe`` holds the checks to it)."""

    bytes: int = 0
    transfers: int = 0
    #: The largest single crossing, and what it was (for a readable failure).
    largest: int = 0
    largest_what: str = ""

    def snapshot(self) -> tuple[int, int]:
        """(bytes, transfers) so far, to take differences around a check's rounds."""
        return self.bytes, self.transfers


@dataclass
class Backend:
    """One device as seen by one worker process."""

    name: BackendName
    index: int
    device: torch.device
    threads: int
    traffic: HostTraffic = field(default_factory=HostTraffic)

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

    def to_host(self, tensor: torch.Tensor, what: str = "") -> torch.Tensor:
        """A contiguous CPU copy of ``tensor``: the one way data leaves the device.

        It waits for the device (a host sync) and is counted in :attr:`traffic`;
        ``what`` names the tensor for the counters and for the structural test."""
        nbytes = tensor.numel() * tensor.element_size()
        self.traffic.bytes += nbytes
        self.traffic.transfers += 1
        if nbytes > self.traffic.largest:
            self.traffic.largest, self.traffic.largest_what = nbytes, what
        return _copy_to_host(tensor)

    def stopwatch(self) -> Stopwatch:
        """Times device work without waiting for it (CUDA events; the wall clock
        where work runs synchronously, as on the CPU)."""
        return Stopwatch(self.name == "cuda")

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


def _copy_to_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu").contiguous()


class Stopwatch:
    """Marks on the device's timeline; read after the device has caught up.

    On CUDA a mark is an event recorded on the current stream (no sync): the
    elapsed time between two marks is the device's own time for the work between
    them, read once per round after the round's single host transfer. Elsewhere a
    mark is ``time.perf_counter()``: CPU work runs synchronously, and XLA marks
    sit around a ``step_boundary`` sync."""

    def __init__(self, events: bool) -> None:
        self.events = events

    def mark(self) -> object:
        """A point on the device's timeline."""
        if self.events:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()  # type: ignore[no-untyped-call]
            return event
        return time.perf_counter()

    def seconds(self, start: object, end: object) -> float:
        """Seconds between two marks (the device must have passed ``end``)."""
        if self.events:
            assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
            return float(start.elapsed_time(end)) / 1000.0  # type: ignore[no-untyped-call]
        assert isinstance(start, float) and isinstance(end, float)
        return end - start


def setup_backend(name: BackendName, index: int, threads: int) -> Backend:
    """Configure this process for deterministic execution on device ``index`` of ``name``."""
    apply_determinism_env()
    torch.set_num_threads(threads)
    # Strict: an op without a deterministic implementation raises, which makes
    # the check inconclusive. Warning instead would let it run and its run-to-run
    # noise would read as SDC on replay: a false quarantine.
    torch.use_deterministic_algorithms(True)
    # With deterministic algorithms on, torch also fills every newly allocated tensor
    # (each GEMM's output, every scratch buffer) with NaN, a debugging aid for kernels
    # that leave memory unwritten, at a real share of the compute check's time. Every
    # op the checks use writes its whole output, so the fill buys nothing here.
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
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
