"""Study: Kernel A and Kernel B side by side, on SMs split between them (README.md)."""
