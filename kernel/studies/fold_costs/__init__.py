"""Study: what each fold of docs/kda_forward.md section 8 costs in the kernel that takes it and saves in the pass
it removes, timed in turn in one process (README.md; ``python -m kernel.studies.fold_costs``)."""
