"""Which of Kernel B's bf16 roundings makes each gradient's error (numpy, float64 with rounding points)."""
