"""The training step and what stands on it (layers 6 and 7), lowest first: its state, the
non-finite guard and the policies of when a step is flat (``state``, ``guard``, ``when``); the step
itself (``step``, with the body of one step in ``body``); the forms built on a step (``convenience``'s
``gam_step``, ``ensemble``, ``cuda_graphs``)."""
