"""The `torch` generation engine: a transformers causal LM with its own continuous batching.

Why not `generate()`: it decodes a fixed batch until the longest sequence ends, so slots of short
sequences idle, and it cannot take a weight update mid-sequence. Here up to H sequences live in
H slots; each `step()` runs

1. one batched decode forward over the occupied slots (one new token each), then
2. one batched prefill forward for queued requests placed in the slots that are free now
   (including those freed in phase 1), which also samples their first token.

KV cache: a static per-slot buffer per layer, `[H, kv_heads, max_model_len, head_dim]`, handed to
the model as its `past_key_values` (`_SlotCache` implements the one method the attention layers
call, `update`). Slot i's sequence occupies columns 0..len-1 of row i, so per-row positions
differ and the decode mask is simply `column <= position`; nothing is ever recomputed or moved.
The alternatives were transformers' `StaticCache` (one write position shared by the whole batch)
and `DynamicCache` (grows by concatenation, padded per batch, no per-row reuse). Decode attends
only to the first `max(len)` columns and only to rows up to the highest occupied slot (new
requests take the lowest free slot), so a draining engine gets cheaper.

Weights change only between steps (`update_weights` copies into the parameters in place); the
KV cache of in-flight sequences is kept as it is, so tokens after an update are computed from
new weights over keys/values that older weights wrote (the PipelineRL semantics). Logprobs follow
`engines/sampling.py`. Neighbours: `engines/base.py` (the contract), `engines/vllm_engine.py`
(the other engine), `weight_sync/receiver.py` (update tensors from a broadcast).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from plrl_workers import protocol
from plrl_workers.engines import base, sampling

if TYPE_CHECKING:
    from plrl_workers.weight_sync import receiver as ws_receiver


@dataclasses.dataclass(eq=False)  # identity: abort() looks sequences up in the queue and slots
class _Seq:
    request_id: str
    prompt: tuple[int, ...]
    params: base.SamplingParams
    generator: torch.Generator | None
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)


class _SlotCache:
    """Per-slot static KV buffers, duck-typed as a transformers `Cache` (only `update` is called).

    Before each forward the engine sets `rows`/`cols` (where this forward's new keys go) and
    `span` (decode: how many columns to return; 0 for prefill, which attends only to itself).
    """

    def __init__(self, layers: int, slots: int, kv_heads: int, length: int, head_dim: int, **kw: Any):
        self.k = [torch.zeros(slots, kv_heads, length, head_dim, **kw) for _ in range(layers)]
        self.v = [torch.zeros(slots, kv_heads, length, head_dim, **kw) for _ in range(layers)]
        self.rows = torch.zeros(0, dtype=torch.long)
        self.cols = torch.zeros(0, dtype=torch.long)
        self.span = 0

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.k[layer_idx], self.v[layer_idx]
        if self.span == 0:  # prefill: rows [n, 1], cols [n, T]; new keys are [n, kv, T, d]
            k[self.rows, :, self.cols] = key.transpose(1, 2)
            v[self.rows, :, self.cols] = value.transpose(1, 2)
            return key, value
        n = key.shape[0]  # decode: rows 0..n-1, one new key each at column cols[i]
        k[self.rows, :, self.cols] = key[:, :, 0]
        v[self.rows, :, self.cols] = value[:, :, 0]
        return k[:n, :, : self.span], v[:n, :, : self.span]


class TorchEngine:
    """Continuous batching over H slots with a transformers model; see the module docstring."""

    def __init__(self, options: base.EngineOptions) -> None:
        import transformers

        self._device = torch.device(options.device)
        dtype = getattr(torch, options.dtype)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            options.model_dir, dtype=dtype, attn_implementation="sdpa"
        )
        self._model = model.to(self._device).eval().requires_grad_(False)
        cfg = self._model.config
        if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ["full_attention"]):
            raise ValueError(f"{options.model_dir}: the torch engine supports full-attention layers only")
        self._decoder = self._model.get_decoder()
        self._lm_head = self._model.get_output_embeddings()
        self._params = dict(self._model.named_parameters(remove_duplicate=False))
        self.max_model_len = options.max_model_len or int(cfg.max_position_embeddings)
        eos = self._model.generation_config.eos_token_id or cfg.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self._slots: list[_Seq | None] = [None] * options.max_concurrent
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._live: dict[str, _Seq] = {}
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self._cache = _SlotCache(
            cfg.num_hidden_layers,
            options.max_concurrent,
            cfg.num_key_value_heads,
            self.max_model_len,
            head_dim,
            dtype=dtype,
            device=self._device,
        )
        self._generator = torch.Generator(self._device).manual_seed(options.seed)
        self._version = 0
        self._receiver: ws_receiver.WeightReceiver | None = None

    # ------------------------------------------------------------------ the contract

    @property
    def weight_version(self) -> int:
        return self._version

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: base.SamplingParams) -> None:
        base.validate_request(request_id, prompt_token_ids, params, self.max_model_len, self._live)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(self._device).manual_seed(params.seed)
        seq = _Seq(request_id, tuple(prompt_token_ids), params, gen)
        self._live[request_id] = seq
        self._waiting.append(seq)

    def num_in_flight(self) -> int:
        return len(self._live)

    def abort(self, request_id: str) -> None:
        seq = self._live.pop(request_id, None)
        if seq is None:
            return
        if seq in self._waiting:
            self._waiting.remove(seq)
        self._slots = [None if s is seq else s for s in self._slots]

    @torch.inference_mode()
    def step(self) -> list[base.FinishedSequence]:
        done = self._decode()
        done += self._prefill()
        return done

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        base.check_version(self._version, version, self.num_in_flight())
        for name, tensor in named_tensors:
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"update_weights: unknown parameter {name!r}")
            if param.shape != tensor.shape:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
                )
            param.copy_(tensor)
        self._version = version

    def join_weight_group(self, group: protocol.GroupInfo) -> None:
        from plrl_workers.weight_sync import receiver

        if self._receiver is not None:
            if self._receiver.group == group:
                return
            self.leave_weight_group()
        device = "cpu" if group.backend == "gloo" else str(self._device)
        # update_weights copies every tensor into its parameter before the next version arrives, so
        # the receiver may reuse its buffers (bench/weight_broadcast.py: a shorter pause per update).
        self._receiver = receiver.WeightReceiver(group, device, reuse_buffers=True)

    def receive_weights(self, ann: protocol.Announcement) -> None:
        if self._receiver is None:
            raise RuntimeError("receive_weights: join_weight_group first")
        base.check_version(self._version, ann.version)  # before the handshake commits us to receive
        stream = self._receiver.receive(ann)
        try:
            self.update_weights(stream, ann.version)
        except BaseException:
            base.drain(stream)
            raise

    def leave_weight_group(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    def close(self) -> None:
        self.leave_weight_group()
        self._live.clear()
        self._waiting.clear()
        self._slots = [None] * len(self._slots)
        del self._cache, self._model, self._params, self._decoder, self._lm_head
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ internals

    def _decode(self) -> list[base.FinishedSequence]:
        occupied = [i for i, s in enumerate(self._slots) if s is not None]
        if not occupied:
            return []
        n = occupied[-1] + 1
        # Row i feeds its last sampled token at position len-1 (its KV is not in the cache yet);
        # free rows below n feed a dummy token at position 0 and are ignored.
        last = [0] * n
        pos = [0] * n
        for i in occupied:
            s = self._slots[i]
            assert s is not None
            last[i] = s.tokens[-1]
            pos[i] = len(s.prompt) + len(s.tokens) - 1
        dev = self._device
        pos_t = torch.tensor(pos, device=dev)
        span = max(pos) + 1
        mask = torch.arange(span, device=dev)[None, :] <= pos_t[:, None]
        self._cache.rows, self._cache.cols, self._cache.span = torch.arange(n, device=dev), pos_t, span
        hidden = self._forward(
            torch.tensor(last, device=dev)[:, None], pos_t[:, None], mask[:, None, None, :]
        )[:, 0]
        rows = torch.tensor(occupied, device=dev)
        return self._sample_and_finish(hidden[rows], occupied)

    def _prefill(self) -> list[base.FinishedSequence]:
        free = [i for i, s in enumerate(self._slots) if s is None]
        admitted = []
        while free and self._waiting:
            i = free.pop(0)
            self._slots[i] = self._waiting.popleft()
            admitted.append(i)
        if not admitted:
            return []
        seqs = [self._slots[i] for i in admitted]
        lens = [len(s.prompt) for s in seqs if s is not None]
        width = max(lens)
        # Right padding: pad keys sit after every real query, so the causal mask hides them, and
        # their cache columns are overwritten by decode before any mask exposes them.
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            assert s is not None
            ids[r, : len(s.prompt)] = torch.tensor(s.prompt)
        dev = self._device
        cols = torch.arange(width, device=dev).expand(len(seqs), width)
        self._cache.rows = torch.tensor(admitted, device=dev)[:, None]
        self._cache.cols, self._cache.span = cols, 0
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        hidden = self._forward(ids.to(dev), cols, causal.expand(len(seqs), 1, width, width))
        last = hidden[torch.arange(len(seqs), device=dev), torch.tensor(lens, device=dev) - 1]
        return self._sample_and_finish(last, admitted)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # A 4D boolean mask [rows, 1, queries, keys] is used as given by every transformers decoder
        # (Qwen2, Llama, ...), so the model never inspects our duck-typed cache to build one.
        out = self._decoder(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=self._cache,
            use_cache=True,
        )
        hidden: torch.Tensor = out.last_hidden_state
        return hidden

    def _sample_and_finish(self, hidden: torch.Tensor, slots: list[int]) -> list[base.FinishedSequence]:
        seqs = [s for s in (self._slots[i] for i in slots) if s is not None]
        logits = self._lm_head(hidden)
        dev = self._device
        temp = torch.tensor([s.params.temperature for s in seqs], device=dev)
        top_p = torch.tensor([s.params.top_p for s in seqs], device=dev)
        noise = torch.empty(logits.shape, device=dev, dtype=torch.float32)
        shared = [r for r, s in enumerate(seqs) if s.generator is None]
        if shared:
            noise[shared] = torch.empty(len(shared), logits.shape[1], device=dev).exponential_(
                generator=self._generator
            )
        for r, s in enumerate(seqs):
            if s.generator is not None:
                noise[r].exponential_(generator=s.generator)
        tokens, logprobs = sampling.sample(logits, temp, top_p, noise)
        finished = []
        for slot, s, tok, lp in zip(slots, seqs, tokens.tolist(), logprobs.tolist(), strict=True):
            s.tokens.append(tok)
            s.logprobs.append(lp)
            s.versions.append(self._version)
            reason = None
            if tok in self._eos or tok in s.params.stop_token_ids:
                reason = "stop"
            elif len(s.tokens) >= s.params.max_new_tokens:
                reason = "length"
            if reason is not None:
                self._slots[slot] = None
                del self._live[s.request_id]
                finished.append(
                    base.FinishedSequence(s.request_id, s.prompt, s.tokens, s.logprobs, s.versions, reason)
                )
        return finished
