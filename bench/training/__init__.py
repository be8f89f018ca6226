"""Training-loop SDC benchmark: sdctrain in a gloo process group on the CPU."""
