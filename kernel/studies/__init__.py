"""Studies of the kernels' designs (Kernel A's, the forward's, the layer's time): code that answered a
question, kept to be re-run.

Outside the wheel (pyproject's package list leaves ``kernel.studies`` out): run them
from a checkout, ``python -m kernel.studies.<study>.<module>``. Each study's README
says what it asked, how, and what it measured. The product never imports them.
"""
