"""One training run of ``reproduce/train.py``, one module per job.

* :mod:`reproduce.run.loop`: the training loop of one estimator (epochs, evaluation, resumption,
  signals).
* :mod:`reproduce.run.checkpoint`: checkpoints that survive a crash.
* :mod:`reproduce.run.evaluation`: loss and accuracy over a split, the flatness metrics.
* :mod:`reproduce.run.launch`: the processes of a run (one, or many under ``torchrun``).
* :mod:`reproduce.run.report`: progress, TensorBoard scalars, summaries and the comparison table.
"""
