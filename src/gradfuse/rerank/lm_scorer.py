"""What a frozen causal LM says about each document: gradient estimates and exact leave-one-out losses.

L is the mean token NLL of the target given the packed context. For document i (tokens E_i):

- grad x input: ``-<dL/dE_i, E_i>``, the first-order change of L when E_i is replaced by zeros, i.e. the estimated
  rise of L without document i (the GRO-RAG paper's estimator);
- attention gate: an additive bias log(alpha_i) on the attention logits from every later position to the keys of
  document i (alpha = 1 leaves the model unchanged); ``-dL/dlog(alpha_i)`` at alpha = 1 is the first-order rise of
  L as attention to document i is turned down, which is closer to what removing it means.

Both come from the same single forward + backward pass, with every model parameter frozen so the backward pass
only reaches the inputs. Leave-one-out computes L(C without i) - L(C) exactly, with n + 1 forward passes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from gradfuse.rerank.packing import ContextPacker, PackedContext


GATED_ATTENTION = "gradfuse_gated_eager"


def _gated_eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention with the additive mask, and softmax in the query's precision (at least float32):
    transformers' eager softmax is always float32, which would hide float64 finite-difference checks."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _register_gated_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GATED_ATTENTION, _gated_eager_attention)
    AttentionMaskInterface.register(GATED_ATTENTION, eager_mask)
    return GATED_ATTENTION


@dataclass
class Attribution:
    loss: float
    grad_x_input: np.ndarray  # (n,) estimated rise of L without each document
    gate: np.ndarray  # (n,) -dL/dlog(alpha_i)
    doc_lengths: np.ndarray  # (n,) tokens per document, for optional length normalisation


class LMScorer:
    def __init__(self, model, tokenizer, *, doc_tokens: int = 128, batch_size: int = 4):
        self.model, self.tokenizer = model, tokenizer
        self.model.requires_grad_(False)
        self.model.eval()
        # The gate needs a differentiable additive mask on attention logits; this eager attention adds it exactly.
        self.model.set_attn_implementation(_register_gated_attention())
        self.packer = ContextPacker(tokenizer, doc_tokens=doc_tokens)
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self._lock = threading.Lock()  # one pass at a time on a shared model

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
        per_token = -(grad_embeddings[0] * embeddings[0].detach()).sum(-1)
        return Attribution(
            loss=float(loss.detach()),
            grad_x_input=np.array([float(per_token[s:e].sum()) for s, e in packed.doc_spans]),
            gate=(-grad_alpha).cpu().numpy().astype(np.float64),
            doc_lengths=np.array([e - s for s, e in packed.doc_spans]),
        )

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

    # --- forward-only losses, batched: exact leave-one-out and greedy selection

    @torch.inference_mode()
    def losses(self, contexts: list[PackedContext]) -> np.ndarray:
        """Mean target NLL of each context. Left padding aligns every target at the end of the batch."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        result = []
        for first in range(0, len(contexts), self.batch_size):
            batch = contexts[first : first + self.batch_size]
            width = max(c.length for c in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for row, c in enumerate(batch):
                ids[row, width - c.length :] = c.input_ids
                attention[row, width - c.length :] = 1
            tail = max(c.length - c.target_span[0] for c in batch)  # positions from target start to the end
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            with self._lock:
                logits = self.model(
                    input_ids=ids.to(self.device),
                    attention_mask=attention.to(self.device),
                    position_ids=positions.to(self.device),
                    logits_to_keep=tail + 1,
                ).logits
            for row, c in enumerate(batch):
                start, end = c.target_span
                offset = (tail + 1) - (c.length - start + 1)  # where this row's position start-1 sits
                predicted = logits[row, offset : offset + end - start]
                result.append(float(_nll(predicted, c.input_ids[start:end].to(self.device))))
        return np.array(result)

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

    def greedy_selection(self, docs: list[str], question: str, target: str, k: int) -> tuple[list[int], float]:
        """Forward selection of k documents, each step adding the one that lowers L most (an expensive oracle)."""
        chosen: list[int] = []
        best_loss = float("nan")
        for _ in range(min(k, len(docs))):
            remaining = [i for i in range(len(docs)) if i not in chosen]
            contexts = [self.pack([docs[j] for j in chosen + [i]], question, target) for i in remaining]
            losses = self.losses(contexts)
            pick = int(np.argmin(losses))
            chosen.append(remaining[pick])
            best_loss = float(losses[pick])
        return chosen, best_loss

    @torch.inference_mode()
    def draft(self, docs: list[str], question: str, *, max_new_tokens: int = 32) -> str:
        """The model's own greedy answer from the full context: the target when no answer is known."""
        prompt = self.packer.pack(docs, question=question, target=None).input_ids.to(self.device)[None]
        with self._lock:
            output = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                repetition_penalty=1.15,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        return self.tokenizer.decode(output[0, prompt.shape[1] :], skip_special_tokens=True).strip()


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token NLL, in at least float32 (half-precision logits lose the small differences that matter here)."""
    return torch.nn.functional.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets)
