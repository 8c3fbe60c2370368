"""The real engine for `speedlimit verify`: llama-cpp-python on a GGUF file, timed prefill, greedy decode, and
decode steps of several sequences together (`LlamaRunner.batched_decode`, through llama.cpp's C API).

`LlamaRunner` drives the low-level API (``Llama.eval`` on token lists, greedy argmax over the last logits),
so a decode run generates exactly the requested number of tokens: there is no stop condition, an EOS is just
another token to feed back, and the per-token work is identical. `preflight` loads the model and generates a
few tokens in a child process first, so a llama.cpp crash (e.g. a build with native CPU flags that segfaults
at the first eval) becomes a one-line error instead of killing the caller.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from speedlimit.errors import SpeedlimitError

ENGINE_INSTALL_HINT = 'install with: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir llama-cpp-python==0.3.36'
# Fixed filler text for prompts/contexts: the content does not change the work per token.
_FILLER = (
    "The speed of a language model on a single machine is limited by how fast its weights can be read from "
    "memory. Each generated token streams every parameter once, so tokens per second is bounded by memory "
    "bandwidth divided by the bytes of the model. Prompt processing is different: many tokens share one read "
    "of the weights, so it is bounded by arithmetic throughput instead. "
)


def import_llama_cpp() -> Any:
    """The `llama_cpp` module, or a `SpeedlimitError` saying how to install it."""
    try:
        import llama_cpp
    except ImportError:
        raise SpeedlimitError(f"verify needs the llama-cpp-python engine, which is not installed; {ENGINE_INSTALL_HINT}") from None
    return llama_cpp


def engine_version() -> str:
    return str(getattr(import_llama_cpp(), "__version__", "unknown"))


def engine_system_info() -> str:
    """llama.cpp's own summary of the CPU features it was built for and uses (e.g. ``AVX2 = 1``)."""
    info = import_llama_cpp().llama_print_system_info()
    return (info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)).strip()


class LlamaRunner:
    """One loaded model with a fixed thread count; contexts are built from filler text and timed."""

    def __init__(self, model_path: Path, n_ctx: int, n_threads: int, n_batch: int = 512) -> None:
        llama_cpp = import_llama_cpp()
        self._llama_cpp = llama_cpp
        self.model_path = Path(model_path)
        self.n_threads = n_threads
        self.n_batch = n_batch
        try:
            # flash attention on: llama.cpp's own tools (llama-server, llama-bench, llama-cli) default to
            # `--flash-attn auto`, which turns it on wherever the backend runs it, the CPU backend included
            # (common/common.h, llama-context.cpp); llama-cpp-python's `Llama` defaults to off. verify times llama.cpp
            # as the default engine (llama-server) runs it, the configuration fold C's kernel rates were measured in.
            self.llm = llama_cpp.Llama(
                model_path=str(model_path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                n_batch=n_batch, flash_attn=True, verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as error:
            raise SpeedlimitError(f"llama-cpp-python could not load {model_path} ({error}); pass a valid --model PATH.gguf") from None
        self.n_ctx = int(self.llm.n_ctx())
        self.n_vocab = int(self.llm.n_vocab())
        self._filler: list[int] = []

    @property
    def n_tokens(self) -> int:
        return int(self.llm.n_tokens)

    def filler_tokens(self, count: int) -> list[int]:
        """``count`` tokens of fixed English text (BOS first)."""
        while len(self._filler) < count:
            repeats = max(1, math.ceil(count / 60))
            self._filler = self.llm.tokenize((_FILLER * repeats).encode("utf-8"), add_bos=True)
        return self._filler[:count]

    def reset(self) -> None:
        self.llm.reset()  # n_tokens = 0; the next eval drops the KV cache from position 0

    def _eval(self, tokens: list[int]) -> None:
        if self.n_tokens + len(tokens) > self.n_ctx:
            raise SpeedlimitError(f"context would exceed n_ctx={self.n_ctx}; use shorter --contexts or --decode-tokens")
        self.llm.eval(tokens)

    def prefill(self, prompt_tokens: int) -> float:
        """Seconds to process a fresh prompt of ``prompt_tokens`` tokens (the last token's logits included)."""
        self.reset()
        tokens = self.filler_tokens(prompt_tokens)
        start = time.perf_counter()
        self._eval(tokens)
        return time.perf_counter() - start

    def extend_to(self, context: int) -> float:
        """Append filler tokens until the context holds ``context`` tokens; seconds taken."""
        if context <= self.n_tokens:
            return 0.0
        tokens = self.filler_tokens(context)[self.n_tokens:context]
        start = time.perf_counter()
        self._eval(tokens)
        return time.perf_counter() - start

    def greedy_token(self) -> int:
        pointer = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).argmax())

    def decode(self, count: int) -> tuple[float, list[int]]:
        """Greedy-generate exactly ``count`` tokens after the current context; (seconds, tokens)."""
        if self.n_tokens == 0:
            raise SpeedlimitError("decode needs a context: prefill first")
        if self.n_tokens + count > self.n_ctx:
            raise SpeedlimitError(f"context would exceed n_ctx={self.n_ctx}; use shorter --contexts or --decode-tokens")
        generated = []
        start = time.perf_counter()
        for _ in range(count):
            token = self.greedy_token()
            self.llm.eval([token])
            generated.append(token)
        return time.perf_counter() - start, generated

    def batched_decode(self, sequences: int, context: int, steps: int, warmup: int = 2) -> list[float]:
        """Seconds of each of ``steps`` decode steps in which ``sequences`` sequences, each with ``context`` tokens of
        its own cached, decode one token each: llama-server's slots decoding together.

        Runs in a llama.cpp context of its own on the loaded model (the runner's own context is untouched), set up as
        llama-server sets up its slots: one KV cache shared by the sequences (``kv_unified``) and flash attention at
        llama.cpp's default (auto). Each sequence is prefilled with its own filler text (no shared prefix), then
        ``warmup`` untimed steps. Every sequence's logits are computed in every step, as a server samples each."""
        if sequences < 1 or context < 1 or steps < 1:
            raise SpeedlimitError("a batched decode needs at least one sequence, one token of context and one step")
        lc = self._llama_cpp
        cells = sequences * (context + warmup + steps) + 16
        params = lc.llama_context_default_params()
        params.n_ctx = cells
        params.n_batch = params.n_ubatch = self.n_batch
        params.n_seq_max = sequences
        params.n_threads = params.n_threads_batch = self.n_threads
        params.kv_unified = True
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_AUTO
        ctx = lc.llama_init_from_model(self.llm.model, params)
        if not ctx:
            raise SpeedlimitError(f"llama.cpp could not make a context for {sequences} sequences of {context} tokens "
                                  f"from {self.model_path}; use fewer --batch-sequences or a shorter context")
        batch = lc.llama_batch_init(max(self.n_batch, sequences), 0, 1)
        filler = self.filler_tokens(context + sequences * 7 + warmup + steps + 1)

        def submit(entries: list[tuple[int, int, int, bool]]) -> float:  # (token, position, sequence, logits)
            for i, (token, position, sequence, logits) in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
                batch.seq_id[i][0], batch.logits[i] = sequence, logits
            batch.n_tokens = len(entries)
            start = time.perf_counter()
            status = lc.llama_decode(ctx, batch)
            elapsed = time.perf_counter() - start
            if status != 0:
                raise SpeedlimitError(f"llama.cpp failed a decode of {sequences} sequences (status {status}); use "
                                      "fewer --batch-sequences")
            return elapsed

        try:
            for sequence in range(sequences):  # its own text: the filler from a different offset
                tokens = [filler[0]] + filler[1 + 7 * sequence: context + 7 * sequence]
                for first in range(0, context, self.n_batch):
                    chunk = range(first, min(first + self.n_batch, context))
                    submit([(tokens[i], i, sequence, i == context - 1) for i in chunk])
            times = []
            for step in range(warmup + steps):
                token = filler[context + sequences * 7 + step]
                elapsed = submit([(token, context + step, sequence, True) for sequence in range(sequences)])
                if step >= warmup:
                    times.append(elapsed)
            return times
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if close:
            close()


# --- crash-safe preflight -------------------------------------------------------------------------

_PREFLIGHT_SCRIPT = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle: it stops this child itself
from speedlimit.errors import SpeedlimitError
from speedlimit.verify.engine import LlamaRunner
try:
    runner = LlamaRunner(sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]))
    prefill_s = runner.prefill(16)
    decode_s, tokens = runner.decode(int(sys.argv[4]))
    text = runner.llm.detokenize(tokens).decode("utf-8", "replace")
    print(json.dumps({"tokens": len(tokens), "prefill_s": prefill_s, "decode_s": decode_s, "text": text}))
except SpeedlimitError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(3)
"""


def preflight(model_path: Path, n_threads: int, tokens: int = 16, n_ctx: int = 256, timeout_s: float = 180.0,
              stopped: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """Load the model and greedy-generate ``tokens`` tokens in a child process; its report, or a one-line error.

    ``stopped`` is asked a few times a second: once it says so, the child is killed and the answer is None."""
    import_llama_cpp()
    command = [sys.executable, "-c", _PREFLIGHT_SCRIPT, str(model_path), str(n_ctx), str(n_threads), str(tokens)]
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        while True:
            try:
                stdout, stderr = child.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                stop = stopped is not None and stopped()
                if stop or time.monotonic() > deadline:
                    child.kill()
                    child.communicate()
                    if stop:
                        return None
                    raise SpeedlimitError(f"llama-cpp-python took over {timeout_s:.0f} s to generate {tokens} tokens "
                                          f"from {model_path}; is the machine overloaded?") from None
    done = subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        raise SpeedlimitError(f"llama-cpp-python crashed ({name}) generating from {model_path}: rebuild it without native "
                              f"CPU flags; {ENGINE_INSTALL_HINT}")
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit code {done.returncode}"
        raise SpeedlimitError(last.removeprefix("error: ") if last.startswith("error: ") else
                              f"llama-cpp-python failed on {model_path}: {last}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise SpeedlimitError(f"llama-cpp-python preflight printed no result for {model_path}: {done.stderr.strip()[-200:]}") from None
