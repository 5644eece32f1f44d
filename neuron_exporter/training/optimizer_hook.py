"""The second hook: the end of every optimizer step, through ``torch.optim``'s global step hooks.

They see every ``torch.optim`` optimizer's ``step()``, including ``xm.optimizer_step`` and optimizers wrapped by
accelerate (the Hugging Face ``Trainer``), so training steps are counted as the user counts them.
"""

from __future__ import annotations

from collections.abc import Callable


class OptimizerHook:
    def __init__(self, on_step: Callable[[], None]):
        """``on_step`` runs after every optimizer step, on the thread that stepped; it must not raise."""
        self._on_step = on_step
        self._handle = None

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: self._on_step())

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
