"""One training run of ``reproduce/train.py``, one module per job.

* :mod:`reproduce.run.loop`: the training loop of one estimator: start-up, the epochs, the end.
* :mod:`reproduce.run.epoch`: the training loop, and a run's epochs on it (steps, logging, guards, close).
* :mod:`reproduce.run.records`: each epoch's record and the end-of-run metrics.
* :mod:`reproduce.run.summary`: the end of a run (diverged or not) and its summary.json.
* :mod:`reproduce.run.resume`: resume, start afresh or reuse a finished run; writing the checkpoint.
* :mod:`reproduce.run.context`: what the loop's parts share (run, parts, progress, session).
* :mod:`reproduce.run.signals`: SIGINT and SIGTERM, phase by phase.
* :mod:`reproduce.run.loaders`: which loader feeds a run its batches.
* :mod:`reproduce.run.checkpoint`: checkpoints that survive a crash.
* :mod:`reproduce.run.evaluation`: loss and accuracy over a split, the flatness metrics.
* :mod:`reproduce.run.launch`: the processes of a run (one, or many under ``torchrun``).
* :mod:`reproduce.run.report`: progress, TensorBoard scalars, summaries and the comparison table.
"""
