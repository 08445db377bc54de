"""Loss wrappers (layer 5): each wraps ``loss_fn`` (or an estimator) through the protocol of
``gamfunc.loss.Objective``: micro-batches (``accumulate``), mixed precision (``precision``), data
parallel (``distributed``), compiled passes (``regional``) and m-sharpness (``m_sharpness``)."""
