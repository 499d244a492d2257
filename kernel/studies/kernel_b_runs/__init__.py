"""Study: Kernel B's CTA walking a run of consecutive chunks, timed at each run length in turn in one process
(README.md; ``python -m kernel.studies.kernel_b_runs``)."""
