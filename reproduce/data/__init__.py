"""The input pipelines of ``reproduce/train.py``, one module each.

* :mod:`reproduce.data.sets`: the data sets (in memory and folders), splits, label noise and
  augmentation, over :mod:`reproduce.data.examples` (the containers) and
  :mod:`reproduce.data.batches` (the resumable batch order;
  :class:`~reproduce.data.batches.FolderLoader` decodes folder images on the CPU).
* :mod:`reproduce.data.nvjpeg`: the same batches of a JPEG folder decoded on the GPU by nvJPEG.
* :mod:`reproduce.data.dali`: the same batches through NVIDIA DALI.
"""
