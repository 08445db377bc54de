"""What a training step costs: every estimator × model × precision, against the compiled gradient
step of the same model, the authors' GAM optimiser and an eager ``torch.optim.SGD`` step, all timed in
the same process.

    python -m benchmarks.step_cost                       # ResNet-18, eager and compiled
    python -m benchmarks.step_cost --model resnet50 --dtype fp32,bf16-cl --modes pass-reduce-overhead
    python -m benchmarks.step_cost --quick               # the tiny model, eager, on the CPU: seconds
    python -m benchmarks.step_cost --facade=only --model resnet50,vit_s32 --dtype bf16-cl

=================  ===================================================================================
``models``         the networks (``reproduce.models``), one fixed batch, precisions, the functional loss
``methods``        the rows: method names, the gamfunc estimator of each, every-k rows and their floor
``authors_gam``    the authors' GAM optimiser, eager ``nn.Module`` + ``torch.optim`` (``authors_gam``)
``runners``        one object per row that runs a training step: torch.optim SGD, the authors' GAM,
                   a gamfunc step (eager or ``step.compile``), one plain gradient evaluation
``timing``         set-up (compile and its phases, warm-up, recompile check, peak memory),
                   interleaved timing
``profiling``      ``--profile``: steps under ``torch.profiler``, summarised per step
``pool``           ``--compile-jobs``: cold compiles in parallel worker processes
``report``         ratios between rows, the table, the run's metadata
``group``          one model in one precision: set up, pre-compile, time, profile
``facade``         ``--facade``: the ``torch.optim`` facade against make_step and davda54's SAM
``cli``            the flags and ``main``
=================  ===================================================================================
"""
