"""Sweeps over configuration fields × seeds, one module each.

* `reproduce.sweeps.plan`: the cells and runs of a grid, and their folders.
* `reproduce.sweeps.grid`: each run trained by ``reproduce/train.py``, in this process or as
  subprocesses, a finished run reused.
* `reproduce.sweeps.vmapped`: runs that differ only in seed and a few hyperparameters, trained
  as the members of one vmapped step.
* `reproduce.sweeps.vmap_grid`: ``reproduce/sweep.py --vmap``, a whole grid as one vmapped step.
* `reproduce.sweeps.table`: mean ± std over seeds, the cell selected on validation.

``reproduce/sweep.py`` is the command line over them.
"""
