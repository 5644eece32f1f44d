"""attach(process_tag=True), then a forked worker: each prints the NEURON_PROCESS_TAG it would start its runtime with.

    process_tag_fork.py SPOOL_DIR

Prints one JSON line {"pid": ..., "tag": ...} from the parent, then one from the forked child, which exits.
"""

from __future__ import annotations

import json
import os
import sys

import neuron_exporter

neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=sys.argv[1], node_view=False, process_tag=True)
print(json.dumps({"pid": os.getpid(), "tag": os.environ.get("NEURON_PROCESS_TAG")}), flush=True)
child = os.fork()
if child == 0:
    print(json.dumps({"pid": os.getpid(), "tag": os.environ.get("NEURON_PROCESS_TAG")}), flush=True)
    os._exit(0)
os.waitpid(child, 0)
