"""The training step and what stands on it (layer 6), one way inside, lowest first: its state, the
non-finite guard and the policies of when a step is flat (``state``, ``guard``, ``when``); the body
of one step (``body``); the step (``step``: ``make_step``); the forms built on a step
(``convenience``'s ``gam_step``, ``ensemble``, ``cuda_graphs``)."""
