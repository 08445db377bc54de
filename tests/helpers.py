"""Shared test models and naive references written with torch.autograd on flat vectors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The packages of the "plot", "reproduce" and "imagenet" extras, absent from a [dev]-only install: a test that
# needs one skips, naming it (tests/conftest.py does so for modules that import one at the top).
OPTIONAL = (
    "torchvision",
    "tensorboard",
    "matplotlib",
    "einops",
    "tqdm",
    "mnist1d",
    "sklearn",
    "nvidia.dali",
)


def mlp_params(dtype=torch.float64, seed=0, device="cpu", width=5):
    """Parameters of the tanh MLP 4-width-3 of :func:`mlp_loss`."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"w1": (width, 4), "b1": (width,), "w2": (3, width), "b2": (3,)}
    return {k: torch.randn(s, generator=g, dtype=dtype).to(device) for k, s in shapes.items()}


def mlp_batch(n=12, dtype=torch.float64, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g, dtype=dtype).to(device)
    y = torch.randint(0, 3, (n,), generator=g).to(device)
    return x, y


def mlp_loss(params, batch):
    """A tanh MLP 4-5-3 with cross-entropy: smooth, so finite differences converge."""
    x, y = batch
    h = torch.tanh(x @ params["w1"].T + params["b1"])
    return F.cross_entropy(h @ params["w2"].T + params["b2"], y)


def relu_mlp_loss(params, batch):
    x, y = batch
    h = torch.relu(x @ params["w1"].T + params["b1"])
    return F.cross_entropy(h @ params["w2"].T + params["b2"], y)


def flatten(params):
    return torch.cat([v.reshape(-1) for v in params.values()])


def unflatten(flat, like):
    out, i = {}, 0
    for k, v in like.items():
        out[k] = flat[i : i + v.numel()].reshape(v.shape)
        i += v.numel()
    return out


def dense_hessian(loss_fn, params, batch):
    """The Hessian of ``loss_fn`` at ``params`` as one matrix over the flattened parameters."""
    return torch.func.hessian(lambda t: loss_fn(unflatten(t, params), batch))(flatten(params))


def rel_err(a, b):
    if isinstance(a, dict):
        a, b = flatten(a), flatten(b)
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# ---- naive references on a flat θ with torch.autograd -------------------------------------------


class Naive:
    """∇L, H·v and the estimators' formulas, written directly with torch.autograd.grad."""

    def __init__(self, loss_fn, params, batch, eps=1e-12):
        self.loss_fn, self.like, self.batch, self.eps = loss_fn, params, batch, eps

    def L(self, theta):
        return self.loss_fn(unflatten(theta, self.like), self.batch)

    def grad(self, theta):
        theta = theta.detach().requires_grad_(True)
        return torch.autograd.grad(self.L(theta), theta)[0]

    def hvp(self, theta, v):
        theta = theta.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(self.L(theta), theta, create_graph=True)
        return torch.autograd.grad(g @ v, theta)[0]

    def unit(self, v):
        return v / (v.norm() + self.eps)

    def grad_norm_grad(self, theta):
        g = self.grad(theta)
        return self.hvp(theta, self.unit(g))

    def sam(self, theta, rho):
        return self.grad(theta + rho * self.unit(self.grad(theta)))

    def asam(self, theta, rho, eta):
        """Kwon et al. 2021, Eq. 8: ε = ρ·T²g/‖T g‖, T = |θ| + η elementwise."""
        g = self.grad(theta)
        t = theta.abs() + eta
        return self.grad(theta + rho * t * t * g / ((t * g).norm() + self.eps))

    def gnp_exact(self, theta, alpha):
        return self.grad(theta) + alpha * self.grad_norm_grad(theta)

    def gnp_zhao(self, theta, alpha, r):
        g = self.grad(theta)
        return (1 - alpha / r) * g + (alpha / r) * self.grad(theta + r * self.unit(g))

    def gam(self, theta, rho, alpha, oracle="gradient", oracle_rho=None):
        f = self.grad_norm_grad(theta)
        theta_adv = theta + rho * self.unit(f)
        h_norm = rho * self.grad_norm_grad(theta_adv)
        h_loss = self.grad(theta) if oracle == "gradient" else self.sam(theta, oracle_rho)
        return h_loss + alpha * h_norm

    def gam_fd(self, theta, rho, alpha, r):
        def fd_f(t):
            g = self.grad(t)
            return (self.grad(t + r * self.unit(g)) - g) / r

        theta_adv = theta + rho * self.unit(fd_f(theta))
        return self.grad(theta) + alpha * rho * fd_f(theta_adv)

    def gam_accelerated(self, theta, rho, rho_p, alpha, beta, gamma, convention):
        g0 = self.grad(theta)
        g1 = self.grad(theta + rho_p * self.unit(g0))
        t2 = theta + rho * self.unit(g1 - g0)
        g2 = self.grad(t2)
        g3 = self.grad(t2 + rho_p * self.unit(g2))
        hp = alpha * g1 + (1 - alpha) * g3
        hm = beta * g0 + (1 - beta) * g2 if convention == "paper" else g0 + abs(1 - beta) * g2
        u = self.unit(hp)
        return hp - gamma * (hm - (hm @ u) * u)


# ---- a quadratic with known Hessian ----------------------------------------------------------------


def quadratic(dim=6, seed=0, dtype=torch.float64, cond=10.0):
    """L(θ) = ½(θ−θ*)ᵀA(θ−θ*) over params {"a": θ[:2], "b": θ[2:]}; returns (loss_fn, A, θ*)."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.float64  # built in float64 (no QR in half precision), then cast to ``dtype``
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=wide))
    eig = torch.logspace(0, torch.log10(torch.tensor(cond)).item(), dim, dtype=wide)
    A = (q @ torch.diag(eig) @ q.T).to(dtype)
    theta_star = torch.randn(dim, generator=g, dtype=wide).to(dtype)

    def loss_fn(params, batch):
        e = torch.cat([params["a"], params["b"]]) - theta_star
        return 0.5 * e @ (A @ e)

    return loss_fn, A, theta_star


def split(theta):
    return {"a": theta[:2], "b": theta[2:]}


def as_flat(params):
    return torch.cat([params["a"], params["b"]])


class HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the reads of a device value on the host (``.item()``, ``bool()``, ``float()``)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))
