"""``benchmarks/step_cost.py``, one module per job.

=================  ===================================================================================
``models``         the networks (``reproduce.models``), one fixed batch, precisions, the functional loss
``methods``        the rows: method names, the gamfunc estimator of each, every-k rows and their floor
``authors_gam``    the authors' GAM optimiser, eager ``nn.Module`` + ``torch.optim`` (``authors_gam``)
``runners``        one object per row that runs a training step: torch.optim SGD, the authors' GAM,
                   a gamfunc step (eager or ``step.compile``), one plain gradient evaluation
``timing``         set-up (compile, warm-up, recompile check, peak memory), interleaved timing
``profiling``      ``--profile``: steps under ``torch.profiler``, summarised per step
``pool``           ``--compile-jobs``: cold compiles in parallel worker processes
``report``         ratios between rows, the table, the run's metadata
``group``          one model in one precision: set up, pre-compile, time, profile
``cli``            the flags and ``main``
=================  ===================================================================================
"""
