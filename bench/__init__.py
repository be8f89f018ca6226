"""Benchmarks: probe timings, detection power, operator scale. Results go to bench/results/."""
