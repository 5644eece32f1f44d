"""A real Hugging Face Trainer run on the XLA CPU device, exported with attach(): a tiny Llama, randomly
initialized from a config (nothing is downloaded), trained for STEPS optimizer steps on fixed-length batches with an
attention mask, logging every LOGGING_STEPS steps.

Usage: python hf_trainer.py STEPS LOGGING_STEPS

Prints one JSON line ({"url", "versions", "xla": torch_xla's own counters, "global_step": the Trainer's count})
when training is done, then waits for stdin to close.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch

import neuron_exporter

steps, logging_steps = int(sys.argv[1]), int(sys.argv[2])
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp())

import torch_xla.debug.metrics as met  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

SEQUENCE = 32
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQUENCE)
model = LlamaForCausalLM(config)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4 * steps

    def __getitem__(self, index):
        ids = torch.randint(0, config.vocab_size, (SEQUENCE,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "attention_mask": torch.ones(SEQUENCE, dtype=torch.long), "labels": ids}


arguments = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=4,
                              logging_steps=logging_steps, save_strategy="no", report_to=[],
                              dataloader_drop_last=True, disable_tqdm=True, learning_rate=1e-3,
                              optim="adamw_torch")  # the fused default has no XLA kernel
trainer = Trainer(model=model, args=arguments, train_dataset=Tokens())
trainer.train()  # site: train

import torch_xla  # noqa: E402

torch_xla._XLAC._xla_wait_device_ops(devices=[])
own = {name: met.counter_value(name) for name in met.counter_names()}
versions = {"transformers": transformers.__version__, "torch": torch.__version__}
print(json.dumps({"url": handle.url, "versions": versions, "xla": own, "global_step": trainer.state.global_step,
                  "device": str(trainer.args.device)}), flush=True)
sys.stdin.read()
