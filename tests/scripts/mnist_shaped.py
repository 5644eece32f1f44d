"""A training script in the shape of pytorch/xla's MNIST test (test/test_train_mp_mnist.py), exported with attach():
the initial weights broadcast before the optimizer exists, MpDeviceLoader loops, ``xm.optimizer_step``, a logging
step closure, and after each epoch a test loop that reads the accuracy on the host and averages it with
``xm.mesh_reduce``. Synthetic data of MNIST's shapes.

Usage: python mnist_shaped.py EPOCHS STEPS_PER_EPOCH

Prints one JSON line ({"url", "optimizer_steps": counted by a hook of this script, "xla": torch_xla's own counters})
when training is done, then waits for stdin to close.
"""

from __future__ import annotations

import json
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

import neuron_exporter

epochs, steps_per_epoch = int(sys.argv[1]), int(sys.argv[2])
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp())

import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import torch_xla.distributed.parallel_loader as pl  # noqa: E402

BATCH, TEST_BATCH, TEST_BATCHES = 16, 32, 2


class MNIST(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(4, 8, kernel_size=5)
        self.fc1 = torch.nn.Linear(128, 16)
        self.fc2 = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


def batches(count: int, size: int, seed: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    data = TensorDataset(
        torch.randn(count * size, 1, 28, 28, generator=generator),
        torch.randint(0, 10, (count * size,), generator=generator),
    )
    return DataLoader(data, batch_size=size, drop_last=True)


optimizer_steps = 0


def count_step(optimizer, args, kwargs):
    global optimizer_steps
    optimizer_steps += 1


register_optimizer_step_post_hook(count_step)
torch.manual_seed(1)
device = torch_xla.device()
model = MNIST().to(device)
xm.broadcast_master_param(model)  # setup, before the optimizer exists: not a training step
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
train_loader = pl.MpDeviceLoader(batches(steps_per_epoch, BATCH, 0), device)
test_loader = pl.MpDeviceLoader(batches(TEST_BATCHES, TEST_BATCH, 1), device)
logged = []


def train_loop_fn(loader):
    model.train()
    for step, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        xm.optimizer_step(optimizer)
        if step % 4 == 0:
            xm.add_step_closure(lambda loss=loss: logged.append(loss.item()))


def test_loop_fn(loader) -> float:
    model.eval()
    correct, samples = 0, 0
    with torch.no_grad():
        for data, target in loader:
            pred = model(data).max(1, keepdim=True)[1]
            correct += pred.eq(target.view_as(pred)).sum()
            samples += data.size()[0]
    accuracy = 100.0 * correct.item() / samples  # site: accuracy
    return xm.mesh_reduce("test_accuracy", accuracy, np.mean)  # site: mesh_reduce


for _epoch in range(epochs):
    train_loop_fn(train_loader)
    test_loop_fn(test_loader)

torch_xla._XLAC._xla_wait_device_ops(devices=[])
own = {name: met.counter_value(name) for name in met.counter_names()}
print(json.dumps({"url": handle.url, "optimizer_steps": optimizer_steps, "xla": own}), flush=True)
sys.stdin.read()
