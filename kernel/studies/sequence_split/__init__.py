"""Study: how many segments Kernel A's sequence split should cut a sequence into (see README.md)."""
