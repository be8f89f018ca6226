"""One rank of a training Job: ``python -m bench.training.job`` in each Pod of an
Indexed Job.

The rank is the Job's completion index (``JOB_COMPLETION_INDEX``), the world size
and rendezvous come from ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, and the
training is the harness's trial given as JSON in ``SDCTRAIN_TRIAL`` (the same loop
the tests and the benchmark run, faults included). Its identity (node, Pod, Job, GPU)
and its ServiceAccount token come from the Pod, as in any training Pod; detections
are reported when the trial says so. The rank's result is printed as one JSON line.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys

import torch
import torch.distributed as dist

from bench.training.harness import Trial, _run_trial


def main() -> int:
    rank = int(os.environ["JOB_COMPLETION_INDEX"])
    world = int(os.environ["WORLD_SIZE"])
    trial = Trial(**json.loads(os.environ["SDCTRAIN_TRIAL"]))
    torch.set_num_threads(1)
    address = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ['MASTER_PORT']}"
    dist.init_process_group(
        "gloo", init_method=address, rank=rank, world_size=world, timeout=dt.timedelta(minutes=3)
    )
    try:
        result = _run_trial(trial, rank, world)
    finally:
        dist.destroy_process_group()
    keep = ("rank", "detections", "stop_step", "refused", "audits", "fault_hits")
    print(json.dumps({k: result[k] for k in keep}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
