"""Valid diagnosis documents to start from."""

from __future__ import annotations

import json

from neuron_exporter import diagnosis


def rank_document(rank: str = "0", run_id: str = "run") -> dict:
    return {
        "run_id": run_id,
        "rank": rank,
        "local_rank": rank,
        "pid": 42,
        "steps": 120,
        "graph_cuts": 120,
        "new_graphs": 3,
        "recompilations": 1,
        "cpu_fallback_ops": {"aten::lgamma": 120},
        "cpu_fallback_sites": [
            {"op": "aten::lgamma", "location": "train.py:38", "pass": "forward", "frames": ["forward (train.py:38)"]}
        ],
        "sites": [
            {
                "location": "train.py:42",
                "host_reads": {"item": 120},
                "graph_cuts": {"item": 120},
                "new_graphs": 1,
                "recompilations": 1,
                "frames": ["step (train.py:42)"],
                "recompilation_causes": [
                    {"uploads": {"train.py:30": {"before": "(32, 64)", "now": None}}, "cause": "uploads changed shape"}
                ],
            }
        ],
        "torch_compile": {
            "mode": "full",
            "torch_version": "2.9.0",
            "compilations": 3,
            "recompilations": 1,
            "graph_breaks": 1,
            "recompile_limit_hits": 0,
            "compile_seconds": 1.5,
            "functions": [
                {
                    "location": "train.py:12",
                    "function": "step",
                    "compilations": 2,
                    "recompilations": {"size_mismatch": 1},
                    "recompile_limit_hits": 0,
                    "compile_seconds": 1.2,
                    "failed_guards": [
                        {"reason": "size_mismatch", "compile_id": "0/1", "guard": "tensor 'x' size mismatch"}
                    ],
                }
            ],
            "graph_break_sites": [
                {
                    "location": "train.py:20",
                    "reason": "print",
                    "count": 1,
                    "message": "Failed to trace\n  print",
                    "frames": ["step (train.py:20)"],
                    "compiling": "step",
                }
            ],
            "records_missed": 0,
        },
    }


def document(**rank_fields) -> dict:
    return {"format": diagnosis.FORMAT, "ranks": [{**rank_document(), **rank_fields}]}


def sized_rank_document(rank: str, run_id: str, size: int) -> dict:
    """A valid rank document of about ``size`` bytes of compact JSON (as a rank writes it): sites with long frames."""
    frames = [
        f"function_{k} (/opt/venv/lib/python3.11/site-packages/{'package/' * 8}module_{k}.py:{k})" for k in range(4)
    ]
    site = {
        "host_reads": {"item": 7},
        "graph_cuts": {"item": 7},
        "new_graphs": 1,
        "recompilations": 0,
        "frames": frames,
    }
    one = len(json.dumps({"location": "train.py:100000", **site})) + 2
    count = max(0, (size - len(json.dumps(rank_document(rank, run_id)))) // one)
    sites = [{"location": f"train.py:{n}", **site} for n in range(count)]
    return {**rank_document(rank, run_id), "sites": sites}
