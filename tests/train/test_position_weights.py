"""The DDTree-aware slot weights: first-error (focal) and the tree surrogate's gradient."""

import torch

from flashdraft.train.objective import dpace_weights, first_error_weights, tree_weights


def test_tree_weights_are_the_gradient_of_the_tree_surrogate():
    torch.manual_seed(0)
    q = torch.rand(2, 3, 6).clamp(0.05, 0.95)
    sup = torch.rand(2, 3, 6) > 0.2
    for width, alpha in ((1, 0.0), (4, 0.0), (4, 0.5), (8, 0.3)):
        log_qs = ((1 - alpha) * q + alpha).log().requires_grad_(True)  # the gradient is taken in log q'
        qs = torch.where(sup, log_qs.exp(), torch.zeros_like(q))[..., 1:]
        p = 1 - (1 - qs) ** width
        expected_len = torch.cumprod(p, dim=-1).sum()
        (grad,) = torch.autograd.grad(expected_len, log_qs)
        w = tree_weights(q, sup, alpha, width)
        assert torch.allclose(w[..., 1:], grad[..., 1:], atol=1e-5), (width, alpha)
        assert (w[..., 0] == 0).all() and (w[~sup] == 0).all()


def test_tree_weights_do_not_vanish_for_a_fresh_drafter():
    """A fresh drafter gives its labels q ~ 1/vocab; the weights must still be of order one (smoothed q')."""
    q = torch.full((1, 2, 8), 1e-5)
    sup = torch.ones_like(q, dtype=torch.bool)
    w = tree_weights(q, sup, 0.5, 4)[..., 1:]
    assert (w > 0.05).all(), w
    assert torch.allclose(tree_weights(q, sup, 0.5, 1), dpace_weights(q, sup, 0.5))  # width 1 is D-PACE


def test_tree_of_width_one_without_smoothing_is_dpace():
    q = torch.tensor([[[0.9, 0.5, 0.8, 0.3, 0.6]]])
    sup = torch.ones_like(q, dtype=torch.bool)
    assert torch.allclose(tree_weights(q, sup, 0.0, 1), dpace_weights(q, sup, 0.0))


def test_first_error_weights_hand_checked():
    q = torch.tensor([[[0.0, 0.5, 0.8, 0.25, 0.9]]])  # slot 0 (the anchor) is never weighted
    sup = torch.tensor([[[True, True, True, False, True]]])
    w = first_error_weights(q, sup, alpha=0.0, focal=1.0)
    # reach: 1, 0.5, 0.4 (unsupervised slot 3 ends the chain: 0 after it); times (1 - q_k)
    assert torch.allclose(w, torch.tensor([[[0.0, 0.5, 0.5 * 0.2, 0.0, 0.0]]]))
    w2 = first_error_weights(q, sup, alpha=0.0, focal=2.0)
    assert torch.allclose(w2, torch.tensor([[[0.0, 0.25, 0.5 * 0.04, 0.0, 0.0]]]))
    w0 = first_error_weights(q, sup, alpha=0.5, focal=0.0)  # focal 0: the smoothed reach probability alone
    assert torch.allclose(w0, torch.tensor([[[0.0, 1.0, 0.75, 0.0, 0.0]]]))
