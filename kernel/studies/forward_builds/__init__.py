"""Study: the forward's builds side by side, timed in turn in one process on one set of inputs, each
checked for the same bits as the first (README.md; ``python -m kernel.studies.forward_builds``)."""
