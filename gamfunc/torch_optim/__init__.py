"""Train an ``nn.Module`` with GAM, SAM or any estimator from ``torch.optim``-style code.

[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] is a ``torch.optim.Optimizer`` whose ``step`` runs the pure step of
[`gamfunc.make_step`][gamfunc.make_step] on the module's tensors and writes the result back into the module. It is a
shell, not a second implementation: the estimator computes the direction as a pure function, the
base optimiser applies it, and [`gamfunc.make_step`][gamfunc.make_step] joins them, with its one non-finite guard.
[`GAM`][gamfunc.torch_optim.GAM] and [`SAM`][gamfunc.torch_optim.SAM] only choose the estimator.

The base optimiser is any of:

* a gamfunc optimiser, ``GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05, alpha=0.1)``;
* a ``torch.optim.Optimizer`` over the model's parameters (torch's, or a third party's),
  ``GAM(model, torch.optim.AdamW(model.parameters(), lr=1e-3), rho=0.05, alpha=0.1)`` or
  ``base_optimizer=torch.optim.AdamW(...)``;
* davda54/sam's form, the class and its keyword arguments,
  ``GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.1)``.

A ``torch.optim`` optimiser becomes a [`Transform`][gamfunc.optim.base.Transform] of the step
(``gamfunc.torch_optim.bridge``): the step runs on copies of the parameters and of
its state, its ``step()`` on its own tensors with the direction as ``.grad``, and its state tensors
travel in the step's state, kept or dropped by make_step's guard. So every option of the step carries over whatever the base optimiser: ``compile=``, ``every=``,
``accumulate=``, ``precision=``, ``max_grad_norm=``, ``cuda_graph=`` and the guard.

Switching a ``torch.optim`` loop:

```python
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # before
optimizer = GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.1)   # after

for inputs, targets in loader:
    loss = optimizer.step((inputs, targets))   # replaces zero_grad / forward / backward / step
    scheduler.step()                            # any torch.optim.lr_scheduler drives the lr
```

How the loss reaches the pure step:

* ``step(batch)`` with ``batch = (inputs, targets)``: the loss is ``criterion(model(inputs), targets)``,
  evaluated with the step's tensors in the module's place
  ([`gamfunc.nn.functionalize`][gamfunc.nn.functionalize]). This form can be compiled
  (``compile=True``) and accumulated (``accumulate=n``).
* ``step(batch)`` with a batch of any other form (a dict of tensors, a tuple of three), for an
  optimiser built with ``loss=``: the loss is ``loss(model, batch)``, evaluated, compiled and
  accumulated as the pair form is.
* ``step(closure)``: ``closure()`` takes no argument and returns the loss, computed by calling the
  model as usual. It is re-evaluated at every point the estimator needs (θ, θ + ε, ...), always
  eagerly. For an estimator built on gradients alone (SAM and its family, accelerated GAM, GAM and
  GNP with ``hvp=gamfunc.hvps.fd()``) in fp32 it is ``torch.optim``'s closure, which may call
  ``backward()`` (davda54/sam's, Lightning's automatic optimisation): the point is copied into the
  module, the gradient read from ``.grad``, θ put back before the update (`module_grads`). Otherwise (exact H·v, bf16 or fp16) it must
  not call ``backward()`` (``lambda: criterion(model(x), y)``): it runs with the module's tensors
  swapped ([`gamfunc.nn.Caller`][gamfunc.nn.Caller]) and gamfunc differentiates it.
* ``step(closure, batch=batch)``: what Lightning's manual optimisation passes (its closure runs hooks).
  The closure is called once under ``torch.enable_grad()``, as ``torch.optim`` does, its result is
  ignored, and the step is computed from ``batch``.

The package, a module per job:

* `optimizer`: [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer], the shell around make_step;
* `options`: [`Options`][gamfunc.torch_optim.Options], the options every facade takes, documented once;
* `parts`: what the shell is built of (its base optimiser, its losses, its two steps);
* `named`: [`GAM`][gamfunc.torch_optim.GAM], [`SAM`][gamfunc.torch_optim.SAM] and
  [`TorchBase`][gamfunc.torch_optim.TorchBase];
* `bridge`: a ``torch.optim`` optimiser as make_step's base optimiser;
* `losses`: the module's loss and a closure's, with the buffers each pass writes;
* `module_grads`: ``torch.optim``'s closure protocol, the closure evaluated on the module itself;
* `sharded`: a model under ``fully_shard`` (FSDP2) or ``DistributedDataParallel``, every pass of
  both forms through the module's own autograd (the hooks gather and reduce), norms over the
  ranks' shards; `sharded_checkpoint`: its sharded, atomic save and load by
  ``torch.distributed.checkpoint``;
* `habits`: the habits of a ``torch.optim`` loop a flatness step cannot follow, caught in one line;
* `last_direction`: the step's direction, left in ``.grad`` after ``step()``;
* `groups`: a gamfunc optimiser's hyperparameters as param groups, and back;
* `base`, `checks`, `copies`: the base optimiser as given, the argument checks, the copies kept
  from step to step.

"""

from gamfunc.torch_optim.named import GAM, SAM, TorchBase
from gamfunc.torch_optim.optimizer import FlatnessOptimizer
from gamfunc.torch_optim.options import Options

__all__ = ["GAM", "SAM", "FlatnessOptimizer", "Options", "TorchBase"]
