"""GTN-style graphs: the `Graph` type, its operations, text/binary io, comparison,
and the numba kernels behind them (topological scores, composition)."""
