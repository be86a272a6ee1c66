"""A static per-channel scale on a drafter's feature input, folded into ``fc.weight`` on save.

Target residual streams carry massive-activation channels (a few channels with 10-100x the RMS of
the rest), which make ``fc``'s output, and so every context position, look alike. Training therefore
feeds ``fc`` the features times a per-channel ``feature_scale`` (from feature statistics, see
:mod:`flashdraft.train.diagnostics`); the scale is a non-saved buffer and is folded into
``fc.weight`` on save (fc(x * s) == (W * s) x), so the files keep their format and a server applies
no extra scaling. Any family whose features enter through a bias-free ``fc`` mixes this in.
"""

from __future__ import annotations

import torch

from flashdraft.models.drafter import DrafterError


class FeatureScaled:
    """Mixin for an ``nn.Module`` with a bias-free ``self.fc``: call :meth:`init_feature_scale` in ``__init__``."""

    def init_feature_scale(self) -> None:
        # [K * target_hidden] per-channel input scale of fc; ones when loaded (folded into fc.weight on save)
        self.register_buffer("feature_scale", torch.ones(self.fc.in_features), persistent=False)
        self._has_scale = False  # whether feature_scale differs from ones (set_feature_scale)

    def scale_features(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., K * H] in fc's dtype, times the feature scale when one is set."""
        x = features.to(self.fc.weight.dtype)
        return x * self.feature_scale.to(x.dtype) if self._has_scale else x

    @torch.no_grad()
    def set_feature_scale(self, scale: torch.Tensor, keep_function: bool = True) -> None:
        """Feed fc the features times ``scale`` [K * H] from now on.

        keep_function: rescale fc.weight so the drafter computes the same function (for a trained or
        loaded drafter); False for a fresh one (its random fc then starts on the scaled features).
        """
        scale = torch.as_tensor(scale, dtype=torch.float32, device=self.fc.weight.device).flatten()
        if scale.numel() != self.fc.in_features or not bool(torch.isfinite(scale).all()) or bool((scale <= 0).any()):
            raise DrafterError(f"feature scale must hold {self.fc.in_features} finite positive values, got {scale.numel()}")
        if keep_function:
            self.fc.weight.mul_((self.feature_scale / scale).to(self.fc.weight.dtype)[None, :])
        self.feature_scale.copy_(scale)
        self._has_scale = not bool((scale == 1).all())

    @torch.no_grad()
    def reset_feature_scale_after_load(self) -> None:
        """Weights were just loaded from a (folded) file: the buffer goes back to ones (same function)."""
        self.feature_scale.fill_(1.0)
        self._has_scale = False

    def feature_scale_state(self) -> dict[str, torch.Tensor]:
        """What a training checkpoint keeps to resume the scaled form exactly (the saved fc.weight is folded)."""
        return {"fc_weight": self.fc.weight.detach().clone(), "feature_scale": self.feature_scale.clone()}

    @torch.no_grad()
    def restore_feature_scale(self, state: dict, scale: torch.Tensor) -> None:
        """Just loaded folded weights: back to the training form in ``state`` (:meth:`feature_scale_state`),
        or, when the checkpoint has none, to ``scale`` keeping the function."""
        self.reset_feature_scale_after_load()
        if "fc_weight" in state and "feature_scale" in state:
            self.fc.weight.copy_(state["fc_weight"])
            self.set_feature_scale(state["feature_scale"], keep_function=False)
        else:
            self.set_feature_scale(scale, keep_function=True)

    def folded_fc_weight(self) -> torch.Tensor:
        """fc.weight with the feature scale folded in (what files hold) -> [d, K * H] on the CPU."""
        w = self.fc.weight.detach()
        if self._has_scale:  # fc(x * s) == (W * s) x
            w = (w.float() * self.feature_scale[None, :]).to(w.dtype)
        return w.contiguous().cpu()
