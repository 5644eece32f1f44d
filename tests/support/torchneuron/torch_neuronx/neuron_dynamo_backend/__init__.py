"""``torch.compile(backend="neuron")``, emulated: the backend is registered with dynamo on import."""

from . import backend  # noqa: F401
