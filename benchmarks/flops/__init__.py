"""What exact GAM's passes cost: ``python -m benchmarks.flops`` counts each pass's FLOPs in gradient
passes (:mod:`.__main__`, any machine); ``python -m benchmarks.flops.passes`` times the same regions
compiled, against a compiled gradient pass (:mod:`.passes`, a GPU)."""
