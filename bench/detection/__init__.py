"""Detection power of the probe's checks against the detectors in use (issue 5, issue 9).

``python -m bench.detection.run --mode quick|full`` runs fault profiles through
the golden check and through four baselines (ABFT at bf16 and fp32 resolution,
a loss-spike monitor, a gradient-norm monitor) on the same trials, and writes
``bench/results/detection.{json,md,png}``.
"""
