"""Flatness metrics: Hessian spectrum and trace, R0/R1 flatness, minima density, loss landscapes."""

__all__: list[str] = []
