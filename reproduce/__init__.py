"""The paper's experiments: ``train.py``, its presets, sweeps and the evidence commands.

reproduce/ is an application of gamfunc, not part of its wheel: it runs from a checkout of the
repository, from the checkout's root, as timm's ``train.py`` does::

    pip install -e ".[reproduce]"        # gamfunc, and the packages reproduce/ needs
    python reproduce/train.py            # a script, run as a file
    python reproduce/sweep.py --help
    python -m reproduce.evidence minima  # a module, run with -m from the root

``python -m`` finds ``reproduce`` in the current folder, the root. A script run as a file has its own
folder, reproduce/, as ``sys.path[0]`` instead, where ``import reproduce`` finds nothing; the three
scripts run that way (``train.py``, also under ``torchrun``, ``sweep.py`` and ``preset_table.py``)
each begin with the same two lines, which put the checkout's root first on ``sys.path``::

    if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Imported (``import reproduce.train``) or run with ``-m``, a script has ``__package__ == "reproduce"``
and leaves ``sys.path`` as it is. The tests import reproduce/ through pytest's ``pythonpath`` (the
root, pyproject.toml) and start its scripts by their path.
"""
