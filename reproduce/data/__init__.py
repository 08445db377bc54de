"""The input pipelines of ``reproduce/train.py``, one module each.

* :mod:`reproduce.data.sets`: the data sets (in memory and folders), splits, label noise,
  augmentation and the resumable batch order; :class:`~reproduce.data.sets.FolderLoader` decodes
  folder images on the CPU.
* :mod:`reproduce.data.nvjpeg`: the same batches of a JPEG folder decoded on the GPU by nvJPEG.
* :mod:`reproduce.data.dali`: the same batches through NVIDIA DALI.
"""
