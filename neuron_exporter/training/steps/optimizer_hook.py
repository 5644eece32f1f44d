"""The second hook: ``torch.optim`` optimizers, so that training steps are counted as the user counts them.

The global step hooks of ``torch.optim`` see every optimizer's ``step()``, including ``xm.optimizer_step`` and
optimizers wrapped by accelerate (the Hugging Face ``Trainer``). The creation of an optimizer is seen through
``Optimizer._patch_step_function``, which every optimizer's ``__init__`` calls (a private method, present since
torch 1.x; if it is missing, the first optimizer step is used instead), so that markers between the creation
and the first optimizer step (setup, a first eval, micro-batches) are not taken for steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..dynamo_skip import never_traced
from ..patching import Patch


class OptimizerHook:
    def __init__(
        self,
        on_created: Callable[[], None],
        on_step: Callable[[Any, Any, Any], None],
        on_error: Callable[[BaseException], None],
    ):
        """``on_created()`` runs when an optimizer is made, ``on_step(optimizer, args, kwargs)`` after every optimizer
        step (it is the post hook itself, one call fewer per step), on the thread that made or stepped it; neither may
        raise. ``on_error`` is told why the creation hook could not go in or come out."""
        self._on_created = on_created
        self._on_step = on_step
        self._on_error = on_error
        self._handle: Any = None
        self._patch: Patch | None = None
        self.active = False

    def install(self) -> None:
        from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook

        never_traced(self._on_step)
        self._handle = register_optimizer_step_post_hook(self._on_step)
        self.active = True
        if hasattr(Optimizer, "_patch_step_function"):
            self._patch = self._patch or Patch(Optimizer, "_patch_step_function", self._wrap, self._on_error)
            self._patch.install()

    def _wrap(self, original: Callable) -> Callable:
        hook = self

        def patch_step_function(optimizer, *args, **kwargs):
            if hook.active:
                hook._on_created()
            return original(optimizer, *args, **kwargs)

        never_traced(patch_step_function)
        return patch_step_function

    def uninstall(self) -> None:
        self.active = False  # if someone wrapped ours since, it stays inside theirs, doing nothing
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._patch is not None:
            self._patch.undo()
