"""The forward in three passes (products, a 64-token chain, o), in the precision such kernels would keep,
against float64 and against the one pass's model (README.md)."""
