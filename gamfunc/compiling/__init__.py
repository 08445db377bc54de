"""Compile helpers (layer 4): compile any function (``compile``) and the inductor pass that computes
equal work once (``graph_sharing``); they know nothing of steps."""
