"""Study: the rstd pass (kernel.row_rstd) beside FLA's l2norm pass, which it replaces in the op, timed in turn in
one process (README.md; ``python -m kernel.studies.row_rstd``)."""
