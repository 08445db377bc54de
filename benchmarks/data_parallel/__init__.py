"""Data-parallel scaling of gamfunc's steps against DistributedDataParallel on one machine.

``python -m benchmarks.data_parallel`` (:mod:`.driver`) starts every run itself, each a ``torchrun``
of :mod:`.worker`; :mod:`.projection` projects its reports to more GPUs, :mod:`.trace_gaps` reads a
profiled run's timeline.
"""
