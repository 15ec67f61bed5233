"""What a frozen causal LM says about each document: gradient estimates, exact leave-one-out losses, and the
per-passage likelihoods the LM baselines use.

L is the mean token NLL of the target given the packed context. For document i (tokens E_i):

- grad x input: ``-<dL/dE_i, E_i>``, the first-order change of L when E_i is replaced by zeros, i.e. the estimated
  rise of L without document i (the GRO-RAG paper's estimator);
- attention gate: an additive bias log(alpha_i) on the attention logits from every later position to the keys of
  document i (alpha = 1 leaves the model unchanged); ``-dL/dlog(alpha_i)`` at alpha = 1 is the first-order rise of
  L as attention to document i is turned down, which is closer to what removing it means;
- reader gate: the same gate, on the attention of the question and the target only. The documents then do not
  depend on alpha, so they are encoded once without gradients (a key/value cache) and the backward pass covers only
  the question and the target: a fraction of the full pass's cost, at the price of ignoring what one document
  changes in the documents after it.

Gate and grad x input come from one forward + backward pass with every model parameter frozen, so the backward
pass only reaches the inputs. Leave-one-out computes L(C without i) - L(C) exactly, with n + 1 forward passes.

The attention scorer (attention.py) reads attention probabilities instead: a pass run under `recording_attention`
computes its attention explicitly and keeps, per layer, how much the chosen query positions attend to each key.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

from gradfuse.lm.models import model_lock
from gradfuse.rerank.packing import ContextPacker, PackedContext

GATED_ATTENTION = "gradfuse_gated_sdpa"
MIN_SHARED = 16  # a shorter shared opening is recomputed with each batch: its cache costs more than it saves
CONTENT_FREE = "N/A"  # the calibration input: a target or a query that says nothing
# While a pass records (`recording_attention`): the rows (query positions of this pass) whose attention is kept,
# and layer index → mean attention of those rows over every key, averaged over heads.
_RECORDING: ContextVar[tuple[slice, dict[int, torch.Tensor]] | None] = ContextVar("gradfuse_recording", default=None)


@contextmanager
def recording_attention(rows: slice):
    """Within the block, every attention layer also stores the attention of the pass's positions `rows` (the
    returned dict: layer index → (keys,) mean over heads and rows)."""
    recorded: dict[int, torch.Tensor] = {}
    token = _RECORDING.set((rows, recorded))
    try:
        yield recorded
    finally:
        _RECORDING.reset(token)


def _gated_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention with an additive float mask that gradients can flow into. torch's SDPA takes the mask's gradient
    and, on a CPU, runs about 2.5 times faster than transformers' eager attention here."""
    mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
    if (recording := _RECORDING.get()) is not None:
        return _recorded_attention(module, query, key, value, mask, scaling, *recording)
    # No mask: a plain causal pass (transformers' SDPA mask function leaves it out where it can), which lets
    # torch take its fastest kernel; a query of one token (decoding) reads every key.
    causal = mask is None and query.shape[2] > 1
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return output.transpose(1, 2).contiguous(), None


def _recorded_attention(module, query, key, value, mask, scaling, rows: slice, recorded: dict):
    """The same attention computed explicitly (SDPA returns no probabilities): only the short query passes of the
    attention scorer run it, so its cost is small."""
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: each key head serves `groups` query heads
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    precision = torch.promote_types(query.dtype, torch.float32)  # softmax in at least float32
    logits = (query @ key.transpose(-1, -2)).to(precision) * scaling
    if mask is not None:
        logits = logits + mask.to(precision)
    elif query.shape[2] > 1:
        logits = logits + torch.full(logits.shape[-2:], float("-inf"), dtype=precision, device=logits.device).triu(
            1 + key.shape[2] - query.shape[2])
    probabilities = torch.softmax(logits, dim=-1)
    recorded[module.layer_idx] = probabilities[0, :, rows].mean(dim=(0, 1)).detach()
    output = probabilities.to(value.dtype) @ value
    return output.transpose(1, 2).contiguous(), None


def _register_gated_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GATED_ATTENTION, _gated_attention)
    AttentionMaskInterface.register(GATED_ATTENTION, sdpa_mask)
    return GATED_ATTENTION


@dataclass
class Attribution:
    loss: float
    grad_x_input: np.ndarray  # (n,) estimated rise of L without each document
    gate: np.ndarray  # (n,) -dL/dlog(alpha_i)
    doc_lengths: np.ndarray  # (n,) tokens per document, for optional length normalisation


class LMScorer:
    """A loaded white-box LM and every pass stage 2 makes with it. One pass at a time (a lock): torch already uses
    every core for one, and the model is shared with the generator."""

    def __init__(self, model, tokenizer, *, doc_tokens: int = 128, batch_tokens: int = 4096, dtype: str | None = None):
        """`dtype` (float32, bfloat16): the precision of the passes; None keeps the model's."""
        if dtype is not None and next(model.parameters()).dtype != getattr(torch, dtype):
            model = copy.deepcopy(model).to(getattr(torch, dtype))  # the generator keeps its own precision
        self.model, self.tokenizer = model, tokenizer
        self.model.requires_grad_(False)
        self.model.eval()
        # The gates need a differentiable additive mask on attention logits; this attention adds it exactly.
        self.model.set_attn_implementation(_register_gated_attention())
        self.packer = ContextPacker(tokenizer, doc_tokens=doc_tokens)
        # Tokens (padding included) of one batched forward pass: UPR's ten passages in one pass took 0.98 s in bf16
        # against 1.43 s in batches of four (larger matrices keep AMX busy); inference keeps no activations.
        self.batch_tokens = batch_tokens
        self.device = next(model.parameters()).device
        self._lock = model_lock(model)  # shared with a transformers generator over the same weights

    # --- the one forward + backward pass

    def attribute(self, packed: PackedContext) -> Attribution:
        ids = packed.input_ids.to(self.device)
        n, length = len(packed.doc_spans), packed.length
        with self._lock, torch.enable_grad():
            embeddings = self.model.get_input_embeddings()(ids).detach().unsqueeze(0).requires_grad_(True)
            log_alpha = torch.zeros(n, device=self.device, requires_grad=True)
            mask = self._gated_causal_mask(length, packed.doc_spans, log_alpha, embeddings.dtype)
            loss = self._target_loss(embeddings, mask, packed)
            grad_embeddings, grad_alpha = torch.autograd.grad(loss, [embeddings, log_alpha])
        per_token = -(grad_embeddings[0].float() * embeddings[0].detach().float()).sum(-1)
        return Attribution(
            loss=float(loss.detach()),
            grad_x_input=np.array([float(per_token[s:e].sum()) for s, e in packed.doc_spans]),
            gate=(-grad_alpha).float().cpu().numpy().astype(np.float64),
            doc_lengths=np.array([e - s for s, e in packed.doc_spans]),
        )

    def encode_documents(self, packed: PackedContext):
        """The key/value cache of everything up to the end of the last document (no gradients)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        split = packed.doc_spans[-1][1]
        with self._lock, torch.no_grad():
            self.model(input_ids=packed.input_ids[None, :split].to(self.device), cache=cache, use_cache=True,
                       logits_to_keep=1)
        return cache

    def attribute_reader(self, packed: PackedContext, documents=None, *,
                         log_alpha: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """(L, reader gate per document): documents encoded once without gradients (or `documents`, their cache
        from `encode_documents` of a context with the same documents, left as it was given), then the question
        and target read them through the gate with gradients. `log_alpha`: the point the gradient is taken at
        (default 0 for every document: the model unchanged)."""
        ids = packed.input_ids.to(self.device)
        split = packed.doc_spans[-1][1]  # every position from here on comes after every document
        dtype = self.model.get_input_embeddings().weight.dtype
        cache = documents if documents is not None else self.encode_documents(packed)
        start_alpha = torch.zeros(len(packed.doc_spans)) if log_alpha is None else torch.as_tensor(log_alpha)
        with self._lock:
            with torch.enable_grad():
                log_alpha = start_alpha.to(self.device, torch.float32).requires_grad_(True)
                mask = self._gated_causal_mask(packed.length, packed.doc_spans, log_alpha, dtype)[:, :, split:]
                start, end = packed.target_span
                logits = self.model(input_ids=ids[None, split:], attention_mask=mask, cache=cache,
                                    use_cache=True, logits_to_keep=packed.length - start + 1).logits[0]
                loss = _nll(logits[: end - start], ids[start:end])
                (grad_alpha,) = torch.autograd.grad(loss, [log_alpha])
            _crop(cache, split)  # back to the documents alone, for the next pass over them
        return float(loss.detach()), (-grad_alpha).float().cpu().numpy().astype(np.float64)

    def calibrated_reader_gate(self, packed: PackedContext, free: PackedContext, documents=None,
                               ) -> tuple[float, np.ndarray, np.ndarray]:
        """(L, reader gate, the gate `free` gives): `free` packs the same documents with the content-free target
        (or query), so both passes share one encoding of the documents. The difference removes what a document's
        position and length alone earn it."""
        documents = documents if documents is not None else self.encode_documents(packed)
        loss, gate = self.attribute_reader(packed, documents)
        _, content_free = self.attribute_reader(free, documents)
        return loss, gate, content_free

    def query_attention(self, packed: PackedContext, documents=None) -> np.ndarray:
        """(layers, documents): the mean attention of the question's tokens to each document's tokens, per layer
        (summed over the document's tokens, averaged over heads and question tokens). The documents are encoded
        once (or `documents`, their cache, left as it was given); only the question and what follows it run with
        explicit attention."""
        split = packed.doc_spans[-1][1]
        start, end = packed.question_span
        dtype = self.model.get_input_embeddings().weight.dtype
        cache = documents if documents is not None else self.encode_documents(packed)
        zeros = torch.zeros(len(packed.doc_spans), device=self.device)
        mask = self._gated_causal_mask(packed.length, packed.doc_spans, zeros, dtype)[:, :, split:]
        with self._lock, torch.no_grad(), recording_attention(slice(start - split, end - split)) as recorded:
            self.model(input_ids=packed.input_ids[None, split:].to(self.device), attention_mask=mask, cache=cache,
                       use_cache=True, logits_to_keep=1)
            _crop(cache, split)
        layers = torch.stack([recorded[i] for i in sorted(recorded)]).float().cpu()
        return np.stack([layers[:, s:e].sum(-1).numpy() for s, e in packed.doc_spans], axis=1).astype(np.float64)

    def _gated_causal_mask(self, length: int, spans, log_alpha: torch.Tensor, dtype) -> torch.Tensor:
        """Causal mask plus log(alpha_i) wherever a position after document i reads one of its keys."""
        causal = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype, device=self.device).triu(1)
        doc_of_key = torch.full((length,), len(spans), dtype=torch.long, device=self.device)  # n = no document
        end_of_key = torch.full((length,), length, dtype=torch.long, device=self.device)
        for i, (start, end) in enumerate(spans):
            doc_of_key[start:end], end_of_key[start:end] = i, end
        key_bias = torch.cat([log_alpha, log_alpha.new_zeros(1)])[doc_of_key].to(dtype)
        reads = torch.arange(length, device=self.device)[:, None] >= end_of_key[None, :]
        return (causal + reads.to(dtype) * key_bias[None, :])[None, None]

    def _target_loss(self, embeddings, mask, packed: PackedContext) -> torch.Tensor:
        start, end = packed.target_span
        keep = packed.length - start + 1  # logits from position start-1 onwards
        logits = self.model(inputs_embeds=embeddings, attention_mask=mask, logits_to_keep=keep).logits[0]
        predicted = logits[: end - start]  # position t-1 predicts token t
        return _nll(predicted, packed.input_ids[start:end].to(self.device))

    # --- forward-only passes, batched: leave-one-out, greedy selection, UPR, the relevance prompt

    def _batches(self, sequences: list[torch.Tensor], keep: int):
        """Batches of `sequences` of similar length, left-padded (which aligns every sequence's end), each yielding
        (the sequences' indices, logits of their last `keep` positions). The opening every sequence shares (the
        prompt's system turn and instruction: 37 of a UPR pass's 182 tokens) is computed once, and its keys and
        values are read by every batch."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        shared = _shared_prefix(sequences, keep)
        with self._lock, torch.inference_mode():
            opening = self._opening(sequences[0][:shared]) if shared else None
        for rows in self._by_length(sequences, shared):
            batch = [sequences[i][shared:] for i in rows]
            width = max(len(s) for s in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            attention = torch.zeros((len(batch), shared + width), dtype=torch.long)
            attention[:, :shared] = 1
            for row, sequence in enumerate(batch):
                ids[row, width - len(sequence) :] = sequence
                attention[row, shared + width - len(sequence) :] = 1
            positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, shared:]
            with self._lock, torch.inference_mode():
                cache = None
                if opening is not None:
                    cache = copy.deepcopy(opening)
                    cache.batch_repeat_interleave(len(batch))
                logits = self._last_logits(ids.to(self.device), attention.to(self.device), positions.to(self.device),
                                           keep, cache)
            yield rows, logits

    def _by_length(self, sequences: list[torch.Tensor], shared: int) -> list[list[int]]:
        """Indices of `sequences` sorted by length, cut into batches of at most `batch_tokens` once padded."""
        batches: list[list[int]] = [[]]
        for i in sorted(range(len(sequences)), key=lambda i: len(sequences[i])):
            if batches[-1] and (len(batches[-1]) + 1) * (len(sequences[i]) - shared) > self.batch_tokens:
                batches.append([])
            batches[-1].append(i)
        return batches

    def _opening(self, ids: torch.Tensor):
        """The keys and values of a shared opening, computed once."""
        return self.model.get_decoder()(input_ids=ids[None].to(self.device), use_cache=True).cache

    def _last_logits(self, ids, attention, positions, keep: int, cache=None) -> torch.Tensor:
        """The logits of the last `keep` positions (after the keys and values in `cache`, if any). The model's own
        `logits_to_keep` hands its output layer a strided slice of the batch, which PyTorch multiplies by copying
        the 49k-token vocabulary's weights once per row (31% of a UPR request's CPU time in bf16); a contiguous
        slice gives the same values without the copies."""
        if getattr(self.model.config, "final_logit_softcapping", None):  # the model's forward does more than this
            return self.model(input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache,
                              logits_to_keep=keep).logits
        hidden = self.model.get_decoder()(input_ids=ids, attention_mask=attention, position_ids=positions,
                                          cache=cache, use_cache=cache is not None).last_hidden_state
        return self.model.get_output_embeddings()(hidden[:, -keep:].contiguous())

    def losses(self, contexts: list[PackedContext]) -> np.ndarray:
        """Mean target NLL of each context."""
        result = np.zeros(len(contexts))
        tail = max((c.length - c.target_span[0] for c in contexts), default=0)  # target start to the end
        for rows, logits in self._batches([c.input_ids for c in contexts], tail + 1):
            for row, index in enumerate(rows):
                c = contexts[index]
                start, end = c.target_span
                offset = (tail + 1) - (c.length - start + 1)  # where this row's position start-1 sits
                predicted = logits[row, offset : offset + end - start]
                result[index] = float(_nll(predicted, c.input_ids[start:end].to(self.device)))
        return result

    def next_token_log_probs(self, prompts: list[torch.Tensor], token_sets: list[list[int]]) -> np.ndarray:
        """(prompts, sets): log of the total probability of each set of tokens as the next token of each prompt."""
        result = np.zeros((len(prompts), len(token_sets)))
        for rows, logits in self._batches(prompts, 1):
            log_probs = torch.log_softmax(logits[:, -1].to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
            for j, tokens in enumerate(token_sets):
                result[rows, j] = torch.logsumexp(log_probs[:, tokens], dim=-1).cpu().numpy()
        return result

    def longest_pass(self, docs: list[str], question: str, settings, *, gold: str | None = None,
                     pointwise: bool = False) -> int:
        """Tokens in the longest sequence a scorer's pass reads: every document with the question and the target
        (a draft counted at its cap), or with `pointwise` one document and the question as UPR packs it."""
        if pointwise:
            return max((self.pack([doc], question, question, target_is_query=True).length for doc in docs), default=0)
        if settings.target == "draft":
            return self.packer.pack(docs, question=question, target=None).length + settings.draft_tokens
        target = question if settings.target == "query" else (gold or "")
        return self.pack(docs, question, target, target_is_query=settings.target == "query").length

    def pack(self, docs: list[str], question: str, target: str, *, target_is_query: bool = False) -> PackedContext:
        return self.packer.pack(docs, question=None if target_is_query else question, target=target)

    def leave_one_out(self, docs: list[str], question: str, target: str, *, target_is_query: bool = False):
        """(L(C), [L(C without i) - L(C) for each i]) with n + 1 forward passes."""
        contexts = [self.pack(docs, question, target, target_is_query=target_is_query)]
        contexts += [
            self.pack(docs[:i] + docs[i + 1 :], question, target, target_is_query=target_is_query)
            for i in range(len(docs))
        ]
        losses = self.losses(contexts)
        return float(losses[0]), losses[1:] - losses[0]

    def greedy_selection(self, docs: list[str], question: str, target: str, k: int, *,
                         target_is_query: bool = False) -> tuple[list[int], float]:
        """Forward selection of k documents, each step adding the one that lowers L most (an expensive oracle)."""
        chosen: list[int] = []
        best_loss = float("nan")
        for _ in range(min(k, len(docs))):
            remaining = [i for i in range(len(docs)) if i not in chosen]
            contexts = [self.pack([docs[j] for j in chosen + [i]], question, target, target_is_query=target_is_query)
                        for i in remaining]
            losses = self.losses(contexts)
            pick = int(np.argmin(losses))
            chosen.append(remaining[pick])
            best_loss = float(losses[pick])
        return chosen, best_loss

    def draft(self, docs: list[str], question: str, *, max_new_tokens: int = 32, documents=None) -> str:
        """The model's own greedy answer from the full context: the target when no answer is known. With
        `documents` (the cache of `encode_documents` for these documents) only the question and the answer are
        computed, and the cache is left as it was given, for the gradient pass to reuse."""
        packed = self.packer.pack(docs, question=question, target=None)
        prompt = packed.input_ids.to(self.device)[None]
        extra = {"cache": documents} if documents is not None else {}
        with self._lock, torch.no_grad():
            output = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                repetition_penalty=1.15,
                pad_token_id=self.tokenizer.eos_token_id,
                **extra,
            )
        if documents is not None:  # back to the documents alone
            _crop(documents, packed.doc_spans[-1][1])
        return self.tokenizer.decode(output[0, prompt.shape[1] :], skip_special_tokens=True).strip()


def _crop(cache, length: int) -> None:
    """Drop what a pass appended to a key/value cache after its first `length` positions."""
    if (extra := cache.get_seq_length() - length) > 0:
        cache.crop(-extra)


def _shared_prefix(sequences: list[torch.Tensor], keep: int) -> int:
    """Tokens every sequence opens with, worth computing once (0 when short or alone), leaving each sequence at
    least its last `keep` positions to compute."""
    if len(sequences) < 2:
        return 0
    first, shortest = sequences[0], min(len(s) for s in sequences)
    shared = shortest - keep
    for other in sequences[1:]:
        differs = (other[:shared] != first[:shared]).nonzero()
        shared = int(differs[0]) if len(differs) else shared
    return shared if shared >= MIN_SHARED else 0


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token NLL, in at least float32 (half-precision logits lose the small differences that matter here)."""
    return torch.nn.functional.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets)


class TargetScorer:
    """The base of the scorers that score a target's likelihood under the LM (gradient, leave-one-out)."""

    def __init__(self, lm: LMScorer):
        self.lm = lm

    def encoded_documents(self, docs: list[str], question: str):
        """The cache of the documents as the question-and-answer prompt packs them: shared by a draft and every
        pass whose target is an answer (their packed contexts are the same up to the last document)."""
        return self.lm.encode_documents(self.lm.packer.pack(docs, question=question, target=None))

    def target(self, settings, question: str, docs: list[str], gold: str | None, documents=None) -> tuple[str, float]:
        """(the text whose likelihood is scored, seconds spent making it): the reference answer, the question
        itself, or the LM's draft (from `documents`, the documents' cache, when the caller has it)."""
        started = time.perf_counter()
        if settings.target == "gold":
            if not gold:
                raise ValueError("target 'gold' needs a reference answer for this question")
            return gold, 0.0
        if settings.target == "query":
            return question, 0.0
        draft = self.lm.draft(docs, question, max_new_tokens=settings.draft_tokens, documents=documents)
        return draft, time.perf_counter() - started
