"""What a batch counts: its samples and its tokens, from the one tensor it is counted by.

That tensor is a mapping's ``input_ids`` (a Hugging Face batch, a ``BatchEncoding``), else the batch's first tensor:
depth first, tuples and lists by position, mappings in their order, dataclasses by field. The walk looks at no more
than ``MAX_ITEMS`` containers and values, so a batch that is a long list, or one that holds itself, costs no more
than a small one.

- samples: the tensor's leading dimension (1 for a 0-dimensional tensor); a batch without a tensor counts none;
- tokens: its elements, when it is an integer tensor (int32 or int64) of two or more dimensions, token ids
  ``[batch, sequence]``: ``input_ids`` and not the mask or the labels beside it, the ids and not the labels of a
  tuple ``(ids, labels)``. Images and other batches (a float tensor first, uint8 pixels, labels of one dimension)
  count no tokens.

Only the tensor's shape and dtype are read, which live on the host for every device (an XLA tensor's too): nothing
waits for a device, and so padding counts as tokens (telling it apart would read the mask's values).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

TOKEN_IDS = "input_ids"
INT32, INT64 = torch.int32, torch.int64  # token ids' dtypes
MAX_ITEMS = 64  # containers and values looked at in one batch


def counted_tensor(batch: object) -> torch.Tensor | None:
    """The tensor ``batch`` is counted by: a mapping's ``input_ids``, else its first tensor; None if it has none
    within ``MAX_ITEMS``."""
    # The most common batches first: a dict with input_ids, a tensor, a tuple or list that starts with a tensor.
    if isinstance(batch, dict):
        ids = batch.get(TOKEN_IDS)
        if isinstance(ids, torch.Tensor):
            return ids
    elif isinstance(batch, torch.Tensor):
        return batch
    elif isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    return _walk(batch)


def _walk(batch: object) -> torch.Tensor | None:
    stack = [batch]
    looked = 0
    while stack and looked < MAX_ITEMS:
        item = stack.pop()
        looked += 1
        if isinstance(item, torch.Tensor):
            return item
        if isinstance(item, (tuple, list)):
            stack.extend(reversed(item[:MAX_ITEMS]))
        elif isinstance(item, Mapping):
            ids = item.get(TOKEN_IDS)
            if isinstance(ids, torch.Tensor):
                return ids
            values = []
            for value in item.values():
                values.append(value)
                if len(values) >= MAX_ITEMS:
                    break
            stack.extend(reversed(values))
        else:
            fields = getattr(type(item), "__dataclass_fields__", None)
            if isinstance(fields, dict) and not isinstance(item, type):
                stack.extend(reversed([getattr(item, name, None) for name in list(fields)[:MAX_ITEMS]]))
    return None


def batch_counts(batch: object) -> tuple[int, int]:
    """(samples, tokens) of ``batch``."""
    tensor = counted_tensor(batch)
    if tensor is None:
        return 0, 0
    dimensions = tensor.ndim
    if dimensions == 0:
        return 1, 0
    dtype = tensor.dtype
    tokens = int(tensor.numel()) if dimensions >= 2 and (dtype is INT64 or dtype is INT32) else 0
    return int(tensor.shape[0]), tokens
