"""The scaling demo (`smoothscale demo`, `make demo`)."""
