"""GTN-style graphs: the :class:`Graph` type, its operations, text/binary io, comparison,
and the numba kernels behind them (topological scores, composition)."""
