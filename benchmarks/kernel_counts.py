"""Count the kernels llama.cpp launches per decode step, per model family, and compare with speedlimit.

speedlimit charges a fixed cost per kernel a decode step launches (`catalog/efficiency.toml`,
``kernel_overhead_s``) and counts the kernels from the architecture (`speedlimit.architecture.
decode_kernels_per_step`). This script checks those counts against the real engine: for each family
it writes two tiny synthetic GGUFs with the `gguf` package (2 and 4 layers, random f32 weights, no
vocabulary), runs one decode step of each in llama-cpp-python with ``GGML_SCHED_DEBUG=2`` (which
prints every compute node of the graph; views and reshapes launch nothing and are not printed), and
takes the difference: nodes per layer by op, plus the per-step remainder.

Run: ``python benchmarks/kernel_counts.py`` (needs the ``verify`` extra: llama-cpp-python). It prints
one line per family and exits 1 if any count differs from speedlimit's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from speedlimit.catalog import resolve_model

# one decode step of the model at argv[1]; the last graph the scheduler prints is that step's
_DECODE_ONE_TOKEN = """
import sys
from llama_cpp import Llama
Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, verbose=True).eval([1])
"""


@dataclass(frozen=True)
class Family:
    """A tiny model of one llama.cpp architecture, with the features that change its graph."""

    label: str
    arch: str
    qk_norm: bool = False
    attention_bias: tuple[str, ...] = ()  # which of q, k, v, output carry a bias
    experts: int = 0
    experts_used: int = 0
    expert_bias: bool = False  # gpt-oss: expert and router biases
    attention_sinks: bool = False
    extra_kv: dict[str, int] = field(default_factory=dict)


FAMILIES = (
    Family("llama (dense)", "llama"),
    Family("qwen2 (q/k/v bias)", "qwen2", attention_bias=("q", "k", "v")),
    Family("qwen3 (q/k norm)", "qwen3", qk_norm=True),
    Family("mixtral (llama MoE, top-2)", "llama", experts=8, experts_used=2),
    Family("qwen3moe (top-2 of 16)", "qwen3moe", qk_norm=True, experts=16, experts_used=2),
    Family("qwen3moe (top-8 of 16)", "qwen3moe", qk_norm=True, experts=16, experts_used=8),
    Family("gpt-oss (top-4 of 8)", "gpt-oss", attention_bias=("q", "k", "v", "output"), experts=8, experts_used=4,
           expert_bias=True, attention_sinks=True, extra_kv={"gpt-oss.attention.sliding_window": 128}),  # fmt: skip
)

HIDDEN, HEADS, KV_HEADS, FFN, EXPERT_FFN, VOCAB = 64, 4, 2, 64, 64, 64


def write_gguf(path: Path, family: Family, layers: int) -> None:
    """A random-weight GGUF of ``family`` with ``layers`` decoder layers that llama.cpp can load."""
    writer = GGUFWriter(str(path), family.arch)
    head_dim = HIDDEN // HEADS
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if family.experts:
        writer.add_expert_count(family.experts)
        writer.add_expert_used_count(family.experts_used)
        writer.add_expert_feed_forward_length(EXPERT_FFN)
    for key, value in family.extra_kv.items():
        writer.add_uint32(key, value)
    writer.add_tokenizer_model("no_vocab")
    writer.add_vocab_size(VOCAB)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    tensor("token_embd.weight", VOCAB, HIDDEN)
    tensor("output_norm.weight", HIDDEN)
    tensor("output.weight", VOCAB, HIDDEN)
    shapes = {"q": (HEADS * head_dim, HIDDEN), "k": (KV_HEADS * head_dim, HIDDEN), "v": (KV_HEADS * head_dim, HIDDEN), "output": (HIDDEN, HEADS * head_dim)}
    for i in range(layers):
        blk = f"blk.{i}."
        tensor(blk + "attn_norm.weight", HIDDEN)
        for name, shape in shapes.items():
            tensor(f"{blk}attn_{name}.weight", *shape)
            if name in family.attention_bias:
                tensor(f"{blk}attn_{name}.bias", shape[0])
        if family.attention_sinks:
            tensor(blk + "attn_sinks.weight", HEADS)
        if family.qk_norm:
            tensor(blk + "attn_q_norm.weight", head_dim)
            tensor(blk + "attn_k_norm.weight", head_dim)
        tensor(blk + ("post_attention_norm.weight" if family.arch == "gpt-oss" else "ffn_norm.weight"), HIDDEN)
        if family.experts:
            n = family.experts
            tensor(blk + "ffn_gate_inp.weight", n, HIDDEN)
            tensor(blk + "ffn_gate_exps.weight", n, EXPERT_FFN, HIDDEN)
            tensor(blk + "ffn_up_exps.weight", n, EXPERT_FFN, HIDDEN)
            tensor(blk + "ffn_down_exps.weight", n, HIDDEN, EXPERT_FFN)
            if family.expert_bias:
                tensor(blk + "ffn_gate_inp.bias", n)
                tensor(blk + "ffn_gate_exps.bias", n, EXPERT_FFN)
                tensor(blk + "ffn_up_exps.bias", n, EXPERT_FFN)
                tensor(blk + "ffn_down_exps.bias", n, HIDDEN)
        else:
            tensor(blk + "ffn_gate.weight", FFN, HIDDEN)
            tensor(blk + "ffn_up.weight", FFN, HIDDEN)
            tensor(blk + "ffn_down.weight", HIDDEN, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def decode_graph_ops(path: Path) -> Counter[str]:
    """Op counts of the compute nodes of one llama.cpp decode step of the GGUF at ``path``."""
    result = subprocess.run(
        [sys.executable, "-c", _DECODE_ONE_TOKEN, str(path)],
        env=dict(os.environ, GGML_SCHED_DEBUG="2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    nodes = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("node #")]
    starts = [i for i, line in enumerate(nodes) if re.match(r"node #\s*0 ", line)]
    if result.returncode or not starts:
        tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
        raise RuntimeError(f"llama.cpp did not run {path.name}: {' | '.join(tail)}")
    return Counter(re.search(r"\(\s*(\w+)\)", line).group(1) for line in nodes[starts[-1] :])


@dataclass(frozen=True)
class Count:
    family: Family
    per_layer: Counter[str]  # the engine's compute nodes per decoder layer, by op
    per_step: int  # the engine's nodes that do not repeat per layer
    speedlimit_per_layer: float
    speedlimit_per_step: float

    @property
    def agrees(self) -> bool:
        """Per-layer counts equal; the per-step gathers may differ by one (gpt-oss has 5, not 6)."""
        return sum(self.per_layer.values()) == self.speedlimit_per_layer and abs(self.per_step - self.speedlimit_per_step) <= 1


def count_family(family: Family, workdir: Path) -> Count:
    """The engine's per-layer and per-step kernel counts for ``family`` next to speedlimit's."""
    graphs = {}
    for layers in (2, 4):
        path = workdir / f"{family.arch}-{layers}.gguf"
        write_gguf(path, family, layers)
        graphs[layers] = decode_graph_ops(path)
    per_layer = Counter({op: (graphs[4][op] - graphs[2][op]) // 2 for op in graphs[4] if graphs[4][op] != graphs[2][op]})
    ours = {layers: resolve_model(str(workdir / f"{family.arch}-{layers}.gguf")).decode_kernels for layers in (2, 4)}
    return Count(
        family=family,
        per_layer=per_layer,
        per_step=sum(graphs[4].values()) - 4 * sum(per_layer.values()),
        speedlimit_per_layer=(ours[4] - ours[2]) / 2,
        speedlimit_per_step=ours[4] - 2 * (ours[4] - ours[2]),
    )


def main() -> int:
    status = 0
    print(f"{'family':28} {'llama.cpp per layer / step':>26} {'speedlimit per layer / step':>28}  llama.cpp ops per layer")
    with tempfile.TemporaryDirectory() as workdir:
        for family in FAMILIES:
            count = count_family(family, Path(workdir))
            status |= 0 if count.agrees else 1
            ops = " ".join(f"{op.lower()} {n}" for op, n in sorted(count.per_layer.items()))
            flag = "" if count.agrees else "  <-- differs"
            engine = f"{sum(count.per_layer.values())} / {count.per_step}"
            ours = f"{count.speedlimit_per_layer:g} / {count.speedlimit_per_step:g}"
            print(f"{family.label:28} {engine:>26} {ours:>28}  {ops}{flag}")
    return status


if __name__ == "__main__":
    sys.exit(main())
