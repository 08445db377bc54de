"""The input pipelines of ``reproduce/train.py``, one module each.

* `reproduce.data.sets`: the data sets (in memory and folders), splits, label noise and
  augmentation, over `reproduce.data.examples` (the containers) and
  `reproduce.data.batches` (the resumable batch order;
  `FolderLoader` decodes folder images on the CPU) and `reproduce.data.folders` (image folders on
  disk, each file checked).
* `reproduce.data.nvjpeg`: the same batches of a JPEG folder decoded on the GPU by nvJPEG.
* `reproduce.data.dali`: the same batches through NVIDIA DALI.
"""
