"""Issue 19: the forging estimators' batched gradients (paper 000, D000-2 / D000-3: f = ½(φ - t)²)
in closed form equal torch.func vmap(grad) of the model's loss, and the fallback keeps any other φ."""

import pytest
import torch
from torch.func import grad, vmap

from tasks.forging.models import SquaredLossModel, feature_grad, grad_w, make_model


@pytest.mark.parametrize("name", ["linreg", "relu1", "tanh1", "softplus1"])
def test_D000_closed_form_gradients_equal_vmap_grad(name):
    g = torch.Generator().manual_seed(3)
    model = make_model(name, 7, 0 if name == "linreg" else 11, g)
    X = torch.randn(300, 8, dtype=torch.float64, generator=g) * 4  # softplus reaches its linear branch (u > 20)
    X[0, :-1] = 0  # ReLU at exactly 0: ρ'(0) = 0 both ways
    ref = vmap(grad(model.loss, argnums=0), in_dims=(None, 0))(model.w, X)
    torch.testing.assert_close(grad_w(model, X), ref, rtol=1e-12, atol=1e-12)
    href = vmap(grad(model.phi, argnums=0), in_dims=(None, 0))(model.w, X[:, :-1])
    torch.testing.assert_close(feature_grad(model, X[:, :-1]), href, rtol=1e-12, atol=1e-12)


def test_D000_other_phi_falls_back_to_vmap_grad():
    w = torch.tensor([0.5, -1.0], dtype=torch.float64)
    model = SquaredLossModel("custom", lambda w_, z: torch.sin(z @ w_), w, 2)
    X = torch.tensor([[0.3, 0.2, 1.0], [1.0, -2.0, 0.0]], dtype=torch.float64)
    z, t = X[:, :2], X[:, 2]
    expected = ((torch.sin(z @ w) - t) * torch.cos(z @ w)).unsqueeze(-1) * z
    torch.testing.assert_close(grad_w(model, X), expected, rtol=1e-14, atol=1e-14)
