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

from .dynamo_skip import never_compiled


class OptimizerHook:
    def __init__(self, on_created: Callable[[], None], on_step: Callable[[Any, Any, Any], None]):
        """``on_created()`` runs when an optimizer is made, ``on_step(optimizer, args, kwargs)`` after every optimizer
        step (it is the post hook itself, one call fewer per step), on the thread that made or stepped it; neither may
        raise."""
        self._on_created = on_created
        self._on_step = on_step
        self._handle: Any = None
        self._original_patch: Any = None

    def install(self) -> None:
        from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook

        never_compiled(self._on_step)
        self._handle = register_optimizer_step_post_hook(self._on_step)
        original = getattr(Optimizer, "_patch_step_function", None)
        if original is None:
            return
        hook = self

        def patch_step_function(optimizer, *args, **kwargs):
            hook._on_created()
            return original(optimizer, *args, **kwargs)

        never_compiled(patch_step_function)
        self._original_patch = original
        setattr(Optimizer, "_patch_step_function", patch_step_function)  # noqa: B010 (typed as a method)

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._original_patch is not None:
            from torch.optim.optimizer import Optimizer

            setattr(Optimizer, "_patch_step_function", self._original_patch)  # noqa: B010 (typed as a method)
            self._original_patch = None
