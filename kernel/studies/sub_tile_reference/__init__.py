"""Study: whether re-referencing a 16-token tile's gated products at sub-tile boundaries makes them exact
in fp32 for any gate, and what it costs (numpy, fp32 against float64; see README.md)."""
