"""Study: which part of the forward's per-tile path binds its time, by knockout builds (copies of
kernel/forward/cuda with one part removed, results wrong on purpose) timed against the intact build in
one process (README.md; ``python -m kernel.studies.forward_critical_path``)."""
