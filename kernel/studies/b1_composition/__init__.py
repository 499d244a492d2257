"""Study B1: can 4 tiles composed into one 64-token serial step make Kernel A meet 0.5x FLA at B = 1?

:mod:`.compose` (numpy) and :mod:`.composed_step` (the serial step on the GPU); the
question, the method and the measured answer are in README.md beside this file.
"""
