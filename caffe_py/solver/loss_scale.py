"""Dynamic loss scaling for ``precision: FLOAT16``.

float16's range ends at 65,504 and its smallest normal number is 6e-5, so small gradients
vanish unless the loss is scaled up before backward. The scale is a tensor on the device, so
that nothing here waits for the device and a CUDA graph captures every step:

1. the loss is multiplied by the scale before backward (:meth:`scaled`);
2. after the gradients are complete (summed over the replicas), :meth:`unscale` divides them
   by the scale and sets a flag where any is inf or NaN (torch's fused check and unscale);
3. the update runs with that flag: an overflowing iteration changes no weight and no history
   (the Updater's masked update), and :meth:`update` halves the scale; after
   ``loss_scale_window`` iterations in a row without an overflow it doubles.

The scale, its count of good iterations and the updates skipped so far travel in the solver
state, so a resume is exact. Replicas keep equal scales: with every replica updating its own
weights (captured whole iterations) each sees the same summed gradient and the same flag;
with the tree the scale is a state blob that flows down with the weights.
"""
from __future__ import annotations

from typing import Any

import torch

GROWTH, BACKOFF = 2.0, 0.5


class LossScale:
    """The loss scale of one replica (see the module docstring)."""

    def __init__(self, initial: float, window: int, device: torch.device):
        self.window = window
        self.scale = torch.full((), float(initial), dtype=torch.float32, device=device)
        self.good = torch.zeros((), dtype=torch.int32, device=device)
        """Iterations in a row without an overflow (torch's growth tracker)."""
        self.found = torch.zeros((), dtype=torch.float32, device=device)
        """1 when this iteration's gradients overflowed (made by :meth:`unscale`)."""
        self.skipped = torch.zeros((), dtype=torch.float32, device=device)
        """Updates skipped since the run began (read at display)."""
        self._inverse = torch.zeros((), dtype=torch.float32, device=device)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on."""
        return loss * self.scale

    def unscale(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Divide the gradients by the scale; returns the overflow flag (a device scalar)."""
        self.found.zero_()
        torch.reciprocal(self.scale, out=self._inverse)
        if grads:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found, self._inverse)
        return self.found

    def update(self) -> None:
        """After the (possibly skipped) update: halve on an overflow, double after a window."""
        self.skipped.add_(self.found)
        torch._amp_update_scale_(self.scale, self.good, self.found, GROWTH, BACKOFF,
                                 self.window)

    def tensors(self) -> list[torch.Tensor]:
        """The float tensors that make the scale's state (flow down the tree with the
        weights: the scale itself)."""
        return [self.scale]

    def describe(self) -> str:
        """The display line's text (a host sync)."""
        return f"loss scale = {self.scale.item():g} ({int(self.skipped.item())} updates " \
               "skipped so far)"

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale.item(), "good": int(self.good.item()),
                "skipped": int(self.skipped.item())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale.fill_(float(state["scale"]))
        self.good.fill_(int(state["good"]))
        self.skipped.fill_(int(state["skipped"]))
