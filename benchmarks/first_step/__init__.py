"""How long until the first training step: each estimator in each mode, from model set-up to the end of
its first steps, cold (an empty inductor cache) and warm (the same cache again), each in a fresh
process, with the steady-state ms per step beside it.

    python -m benchmarks.first_step                      # ResNet-50 and ViT-S/32, bf16, every cell
    python -m benchmarks.first_step --model resnet50 --estimators gradient,gam_fd --jobs 4
    python -m benchmarks.first_step --quick              # the tiny model on the CPU: a minute or two

=========  ===========================================================================================
``cells``  the rows: estimator × mode on a model and precision, and the runner of each (step_cost's
           models, estimators and ``Functional``, ``gamfunc.cuda_graph`` for the graph modes)
``worker`` what runs in a worker process: one cell's first steps, or a model's steady state
``cli``    the flags, the worker processes (first steps in parallel, then the steady state alone),
           the ratios, the JSON and the table
=========  ===========================================================================================
"""
