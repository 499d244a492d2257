"""Where the GPU time of a training step of FLA's KDA layer goes, kernel by kernel, on FLA's path and on
``kernel.patch_fla()``'s (README.md)."""
