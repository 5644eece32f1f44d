"""A real Hugging Face Trainer run on the XLA CPU device, exported with attach(): a tiny Llama, randomly
initialized from a config (nothing is downloaded), trained for STEPS optimizer steps on fixed-length batches with an
attention mask, logging every LOGGING_STEPS steps.

Usage: python hf_trainer.py STEPS LOGGING_STEPS [fixed|dynamic] [--detached]

With ``dynamic``, sequences have different lengths and each batch is padded to its longest ("dynamic padding"); the
batches, taken in order, are LENGTHS long in turn, so the step's graphs compile once for each of LENGTHS and find
their graphs in the cache from then on.

Prints one JSON line ({"url", "versions", "xla": torch_xla's own counters, "global_step": the Trainer's count,
"expected_flops": a fixed-length step's FLOPs by ``FlopCounterMode`` on a copy of the model on the CPU, times the
steps}) when training is done, then waits for stdin to close. With ``--detached``, the same run without the
exporter (its url is None), to compare.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile

import torch

import neuron_exporter

steps, logging_steps = int(sys.argv[1]), int(sys.argv[2])
dynamic = "dynamic" in sys.argv[3:]
detached = "--detached" in sys.argv[3:]
handle = None if detached else neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp())

import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

import torch_xla.debug.metrics as met  # noqa: E402

SEQUENCE = 32
LENGTHS = (16, 24, 32)
BATCH = 4
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=SEQUENCE,
)
model = LlamaForCausalLM(config)
reference = copy.deepcopy(model)  # stays on the CPU
# FlopCounterMode has no formula for the CPU's fused attention kernel: the reference attends by matmuls, as the
# XLA device does (torch_xla lowers scaled_dot_product_attention to them)
reference.set_attn_implementation("eager")


def step_flops() -> int:
    """A fixed-length step's forward and backward, counted by torch's FlopCounterMode on the CPU copy."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(1, config.vocab_size, (BATCH, SEQUENCE))
    with FlopCounterMode(display=False) as counter:
        reference(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss.backward()
    return counter.get_total_flops()


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4 * steps

    def __getitem__(self, index):
        longest = LENGTHS[index // BATCH % len(LENGTHS)]
        length = (longest - 4 * (index % BATCH) if index % 2 else longest) if dynamic else SEQUENCE
        ids = torch.randint(1, config.vocab_size, (length,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "attention_mask": torch.ones(length, dtype=torch.long), "labels": ids}


def pad_to_longest(items: list[dict]) -> dict:
    """Dynamic padding: the batch is as long as its longest sequence (labels padded with -100, ignored)."""
    longest = max(len(item["input_ids"]) for item in items)

    def padded(key, fill):
        return torch.stack(
            [torch.nn.functional.pad(item[key], (0, longest - len(item[key])), value=fill) for item in items]
        )

    return {
        "input_ids": padded("input_ids", 0),
        "attention_mask": padded("attention_mask", 0),
        "labels": padded("labels", -100),
    }


arguments = TrainingArguments(
    output_dir=tempfile.mkdtemp(),
    max_steps=steps,
    per_device_train_batch_size=BATCH,
    logging_steps=logging_steps,
    save_strategy="no",
    report_to=[],
    dataloader_drop_last=True,
    disable_tqdm=True,
    learning_rate=1e-3,
    optim="adamw_torch",
)  # the fused default has no XLA kernel


class InOrder(Trainer):
    def _get_train_sampler(self, *args, **kwargs):
        return torch.utils.data.SequentialSampler(self.train_dataset)


trainer = (InOrder if dynamic else Trainer)(
    model=model, args=arguments, train_dataset=Tokens(), data_collator=pad_to_longest if dynamic else None
)
trainer.train()  # site: train

import torch_xla  # noqa: E402

torch_xla._XLAC._xla_wait_device_ops(devices=[])
own = {name: met.counter_value(name) for name in met.counter_names()}
versions = {"transformers": transformers.__version__, "torch": torch.__version__}
print(
    json.dumps(
        {
            "url": None if handle is None else handle.url,
            "versions": versions,
            "xla": own,
            "global_step": trainer.state.global_step,
            "device": str(trainer.args.device),
            "expected_flops": step_flops() * trainer.state.global_step,
        }
    ),
    flush=True,
)
sys.stdin.read()
