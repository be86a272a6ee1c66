"""Layer-id convention and choice rule; feature capture equals HF hidden_states[i + 1]."""

import pytest
import torch

from flashdraft.models.forward import capture_layer_outputs
from flashdraft.models.target import TargetError, check_target_layer_ids, default_target_layer_ids, load_target
from tests.tiny import tiny_target


def test_default_layer_ids_match_published_configs():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # Qwen3.6-27B
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]  # Qwen3.5-4B
    assert default_target_layer_ids(18, 1) == [9]
    for n_layers in range(4, 80):
        for k in range(2, 6):
            ids = default_target_layer_ids(n_layers, k)
            assert ids[0] == 1 and ids[-1] == n_layers - 3 and max(ids) < n_layers - 1


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "llama"])
def test_capture_is_output_of_layer_i(family):
    target = tiny_target(family)
    ids = torch.tensor([[5, 7, 11, 13, 2]])
    with capture_layer_outputs(target, [0, 2, 4]) as feats:
        out = target.model(ids, output_hidden_states=True)
    for f, i in zip(feats, [0, 2, 4]):
        assert torch.equal(f, out.hidden_states[i + 1])


def test_check_target_layer_ids():
    check_target_layer_ids([1, 3], 6)
    with pytest.raises(TargetError, match="repeat"):
        check_target_layer_ids([1, 1], 6)
    with pytest.raises(TargetError, match="empty"):
        check_target_layer_ids([], 6)


def test_unknown_target_spec_is_a_clear_error(tmp_path):
    with pytest.raises(TargetError, match="neither"):
        load_target(str(tmp_path / "nope"))


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "llama"])
@pytest.mark.parametrize("rows", [1, 8, 64, 65])
def test_lm_logits_equal_the_head_module(family, rows):
    """lm_logits' CPU path (hidden @ a transposed copy of the head, for verify-sized batches) computes the head's
    own logits (softcapped where the config says so), for every row count on either side of the switch."""
    from flashdraft.models.forward import lm_logits

    target = tiny_target(family)
    hidden = torch.randn(rows, target.hidden_size)
    want = target.model.get_output_embeddings()(hidden).float()
    cap = getattr(target.config, "final_logit_softcapping", None)
    if cap:
        want = torch.tanh(want / cap) * cap
    got = lm_logits(target, hidden)
    assert got.shape == (rows, target.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_lm_logits_follow_an_in_place_change_of_the_head_and_pass_gradients():
    """The head's transposed copy is remade when the weight changes in place, and the hidden states keep
    their gradient through it (a drafter scored with the target's head trains through lm_logits)."""
    from flashdraft.models.forward import lm_logits

    target = tiny_target("qwen3")
    head = target.model.get_output_embeddings()
    hidden = torch.randn(4, target.hidden_size)
    before = lm_logits(target, hidden)
    with torch.no_grad():
        head.weight.mul_(2.0)
    torch.testing.assert_close(lm_logits(target, hidden), 2.0 * before, rtol=1e-5, atol=1e-5)
    h = hidden.clone().requires_grad_(True)
    lm_logits(target, h).sum().backward()
    torch.testing.assert_close(h.grad, head.weight.detach().sum(0).expand(4, -1), rtol=1e-5, atol=1e-5)
