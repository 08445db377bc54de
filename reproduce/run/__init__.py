"""One training run of ``reproduce/train.py``, one module per job.

* `reproduce.run.loop`: the training loop of one estimator: start-up, the epochs, the end.
* `reproduce.run.epoch`: the training loop, and a run's epochs on it (steps, logging, guards, close).
* `reproduce.run.records`: each epoch's record and the end-of-run metrics.
* `reproduce.run.summary`: the end of a run (diverged or not) and its summary.json.
* `reproduce.run.resume`: resume, start afresh or reuse a finished run; writing the checkpoint.
* `reproduce.run.checkpoint_body`: a checkpoint's entries checked before a run resumes from it.
* `reproduce.run.context`: what the loop's parts share (run, parts, progress, session).
* `reproduce.run.signals`: SIGINT and SIGTERM, phase by phase.
* `reproduce.run.loaders`: which loader feeds a run its batches.
* `reproduce.run.checkpoint`: checkpoints that survive a crash.
* `reproduce.run.evaluation`: loss and accuracy over a split, the flatness metrics.
* `reproduce.run.launch`: the processes of a run (one, or many under ``torchrun``).
* `reproduce.run.report`: progress, TensorBoard scalars, summaries and the comparison table.
"""
