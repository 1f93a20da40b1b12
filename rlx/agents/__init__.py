"""One self-contained, vendorable module per algorithm; names are registered in ``rlx.algorithms``."""
