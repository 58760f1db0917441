"""The `vllm` generation engine: vLLM's V1 `LLMEngine`, driven one step at a time.

The engine core runs in this process (`multiprocess_mode=False`, vLLM's `InprocClient`), so each
`step()` here is exactly one scheduler step plus one model execution, and `update_weights` /
`receive_weights` run between two steps through `collective_rpc`, while every running request
keeps its KV blocks. For that to hold, three vLLM defaults are changed:

- `async_scheduling=False`: with async scheduling the next batch is already launched when a step
  returns, so an update would land under a running forward. (On CPU vLLM forces it off anyway; on
  GPU this costs the CPU/GPU overlap of scheduling.)
- `enable_prefix_caching=False`: cached prompt blocks would outlive an update and be reused by
  requests that start later, whose prompts would then be read through old keys/values.
- `logprobs_mode="processed_logprobs"`: the logprob of the sampled token after temperature and
  top-p, the definition in `engines/sampling.py`; vLLM's default is the raw model distribution.

Where the model runs is vLLM's choice: the uni-process executor (worker in this process) on a
GPU with tensor_parallel_size 1, or on CPU with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (what the
tests use: faster start, no extra process); otherwise worker processes, which `update_weights`
reaches by pickling the tensors, and `receive_weights` avoids by receiving inside each worker.
vLLM also initialises torch.distributed's default group in its worker's process, so nothing else
in that process may use the default group.

Neighbours: `engines/base.py` (the contract), `weight_sync/vllm_extension.py` (the methods
`collective_rpc` calls inside vLLM's workers), `engines/torch_engine.py` (the other engine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from plrl_workers import protocol
from plrl_workers.engines import base

if TYPE_CHECKING:
    import torch


EXTENSION = "plrl_workers.weight_sync.vllm_extension.WeightSyncExtension"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass
class _Seq:
    prompt: tuple[int, ...]
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)


def _text_config(model_dir: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    text: dict[str, Any] = cfg.get("text_config", cfg)
    return text


def cpu_kv_cache_bytes(options: base.EngineOptions, max_model_len: int) -> int:
    """KV bytes for H sequences of max_model_len tokens, doubled for block rounding, >= 64 MiB."""
    cfg = _text_config(options.model_dir)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    per_token = (
        2 * int(cfg["num_hidden_layers"]) * int(kv_heads) * int(head_dim) * _DTYPE_BYTES[options.dtype]
    )
    return max(64 << 20, 2 * per_token * options.max_concurrent * max_model_len)


class VllmEngine:
    """`GenerationEngine` over vLLM's `LLMEngine`; see the module docstring."""

    def __init__(self, options: base.EngineOptions) -> None:
        # vLLM's usage statistics are on by default: a background thread that probes the CPU in a
        # child process and posts to the internet, from every generator of every job. Off unless
        # the user's environment asks for them.
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        from vllm import sampling_params
        from vllm.engine.arg_utils import EngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor import Executor

        self._sampling_params = sampling_params
        kv_bytes = options.kv_cache_memory_bytes
        if kv_bytes is None and current_platform.is_cpu():
            model_len = options.max_model_len or int(
                _text_config(options.model_dir)["max_position_embeddings"]
            )
            kv_bytes = cpu_kv_cache_bytes(options, model_len)
        args = EngineArgs(
            model=options.model_dir,
            dtype=options.dtype,
            seed=options.seed,
            max_model_len=options.max_model_len,
            max_num_seqs=options.max_concurrent,
            gpu_memory_utilization=options.gpu_memory_utilization,
            kv_cache_memory_bytes=kv_bytes,
            tensor_parallel_size=options.tensor_parallel_size,
            enforce_eager=options.enforce_eager,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            async_scheduling=False,
            enable_prefix_caching=False,
            disable_log_stats=True,
        )
        config = args.create_engine_config()
        self._engine: Any = LLMEngine(
            vllm_config=config,
            executor_class=Executor.get_class(config),
            log_stats=False,
            multiprocess_mode=False,
        )
        self.max_model_len = int(config.model_config.max_model_len)
        self._live: dict[str, _Seq] = {}
        self._version = 0
        self._closed = False

    @property
    def weight_version(self) -> int:
        return self._version

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: base.SamplingParams) -> None:
        base.validate_request(request_id, prompt_token_ids, params, self.max_model_len, self._live)
        sp = self._sampling_params.SamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop_token_ids=list(params.stop_token_ids),
            logprobs=0,
            detokenize=False,
            output_kind=self._sampling_params.RequestOutputKind.DELTA,
        )
        self._engine.add_request(request_id, {"prompt_token_ids": list(prompt_token_ids)}, sp)
        self._live[request_id] = _Seq(tuple(prompt_token_ids))

    def num_in_flight(self) -> int:
        return len(self._live)

    def abort(self, request_id: str) -> None:
        if self._live.pop(request_id, None) is not None:
            self._engine.abort_request([request_id])

    def step(self) -> list[base.FinishedSequence]:
        if not self._live:
            return []
        finished = []
        for out in self._engine.step():
            seq = self._live.get(out.request_id)
            if seq is None:  # aborted between steps
                continue
            comp = out.outputs[0]
            for tok, lp in zip(comp.token_ids, comp.logprobs or [], strict=True):
                seq.tokens.append(tok)
                seq.logprobs.append(lp[tok].logprob)
                seq.versions.append(self._version)
            if out.finished:
                del self._live[out.request_id]
                reason = "length" if comp.finish_reason == "length" else "stop"
                finished.append(
                    base.FinishedSequence(
                        out.request_id, seq.prompt, seq.tokens, seq.logprobs, seq.versions, reason
                    )
                )
        return finished

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        base.check_version(self._version, version, self.num_in_flight())
        # A list, not an iterator: with worker processes the argument is pickled.
        self._engine.collective_rpc("plrl_load_weights", args=(list(named_tensors),))
        self._version = version

    def join_weight_group(self, group: protocol.GroupInfo) -> None:
        self._engine.collective_rpc("plrl_join_group", args=(group,))

    def receive_weights(self, ann: protocol.Announcement) -> None:
        base.check_version(self._version, ann.version)
        self._engine.collective_rpc("plrl_receive_weights", args=(ann,))
        self._version = ann.version

    def leave_weight_group(self) -> None:
        self._engine.collective_rpc("plrl_leave_group")

    def close(self) -> None:
        """Shut the engine core down (workers, torch.distributed state, memory); idempotent."""
        if self._closed:
            return
        self._closed = True
        for request_id in list(self._live):
            self.abort(request_id)
        self._engine.engine_core.shutdown()
        del self._engine
