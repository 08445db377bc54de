"""The input pipeline's cost: images/s of the ImageNet loaders alone, and what each adds to a step.

``python -m benchmarks.input_pipeline`` (:mod:`.__main__`); :mod:`.jpeg_folder` writes the synthetic
JPEG folder it reads when no ``--data`` is given.
"""
