"""Packed documents: one row holds several documents, and no document may read another.

A model declares where documents start in one of four conventions: `position_ids` restarting at 0
at each document start (Hugging Face's padding-free convention: `hf_packed`, `hf_chunked` and the
bugs below them), `cu_seqlens` offsets (flash-attn's varlen convention: `varlen_packed`),
`document_ids` (`nano_document_ids`), or an end-of-text token it finds itself (`nano_doc_sep`,
the nanoGPT data layout where `EOS` ends each document).

Correct: `hf_packed`, `hf_chunked`, `varlen_packed`, `nano_document_ids`, `nano_doc_sep`.
Bugs, each on its `# BUG: name` line: `packing_needs_no_mask` (the packing path taken only when no
attention mask is given), `causal_kernel_drops_documents` (a fused kernel's "causal" mask type that
reads no mask), `eos_keyed_mask` (documents keyed on an EOS the input pipeline strips), `positions_reset_only`
(positions restart, attention is not restricted), `chunked_replaces_documents` (a chunked-attention
mask replacing the document mask instead of combining with it), `eos_over_masks` (an EOS inside a
document cuts it: over-masking), `varlen_off_by_one` (the first token of each document counted in the
one before). Bugs in how a mask is built show at the attention call that applies it (`# SITE:`).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import DynamicCache

from leakzoo.stack import (
    GPT,
    Config,
    Decoder,
    GPTConfig,
    LMOutput,
    NanoAttention,
    Projections,
    causal,
    documents_from_positions,
    randomise,
    same_document,
)

EVERYWHERE = torch.ones(1, 1, 1, 1, dtype=torch.bool)  # a mask that restricts nothing


class PackedAttention(Projections):
    def forward(self, x, positions, allowed, cache=None):
        q, k, v = self.project(x, positions)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # SITE: packed-sdpa
        return self.merge(z)


class PackedLM(Decoder):
    """Hugging Face style; documents restart where `position_ids` restart at 0, with or without a cache or a mask."""

    def __init__(self, config: Config):
        super().__init__(config, PackedAttention)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                **kwargs) -> LMOutput:
        batch, n_new = input_ids.shape
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n_new, device=input_ids.device)[None]
        position_ids = position_ids.expand(batch, -1)
        cache = past_key_values if past_key_values is not None else (DynamicCache() if use_cache else None)
        allowed = self.mask(input_ids, attention_mask, position_ids, past)
        logits = self.run(input_ids, position_ids, allowed, cache)
        return LMOutput(logits, cache if use_cache else None)

    def mask(self, input_ids, attention_mask, position_ids, past) -> torch.Tensor:
        """(batch, 1, query, key): causal, inside the query's document, not on a padded key."""
        n_new = input_ids.shape[1]
        allowed = causal(n_new, past + n_new, input_ids.device)[None, None]
        allowed = allowed & self.documents(input_ids, attention_mask, position_ids, past)
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        return allowed

    def documents(self, input_ids, attention_mask, position_ids, past) -> torch.Tensor:
        """(batch, 1, query, key): True where query and key are in the same document."""
        if past:  # decoding continues the last document: the packing layout is the prefill's
            return EVERYWHERE
        return same_document(documents_from_positions(position_ids))


class PackingNeedsNoMask(PackedLM):
    def documents(self, input_ids, attention_mask, position_ids, past):
        if attention_mask is None and not past:  # BUG: packing_needs_no_mask (an all-ones mask takes the plain causal path)
            return same_document(documents_from_positions(position_ids))
        return EVERYWHERE


class EosKeyedMask(PackedLM):
    def documents(self, input_ids, attention_mask, position_ids, past):
        if past:
            return EVERYWHERE
        is_eos = (input_ids == self.config.eos_token_id).long()
        return same_document(is_eos.cumsum(-1) - is_eos)  # BUG: eos_keyed_mask (position_ids ignored; the pipeline strips EOS)


class PositionsResetOnly(PackedLM):
    def documents(self, input_ids, attention_mask, position_ids, past):
        return EVERYWHERE  # BUG: positions_reset_only (rotary positions restart, attention is not restricted)


class EosOverMasks(PackedLM):
    def documents(self, input_ids, attention_mask, position_ids, past):
        if past:
            return EVERYWHERE
        after_eos = F.pad(input_ids[:, :-1] == self.config.eos_token_id, (1, 0))
        starts = (position_ids == 0) | after_eos  # BUG: eos_over_masks (an EOS inside a document cuts it)
        return same_document(starts.long().cumsum(-1))


class ChunkedLM(PackedLM):
    """Chunked local attention (Llama 4 style): a query reads only keys of its own chunk of `attention_chunk_size`."""

    def mask(self, input_ids, attention_mask, position_ids, past):
        return super().mask(input_ids, attention_mask, position_ids, past) & self.chunks(input_ids.shape[1], past)

    def chunks(self, n_new: int, past: int) -> torch.Tensor:
        size = self.config.attention_chunk_size
        query, key = torch.arange(past, past + n_new), torch.arange(past + n_new)
        return (query[:, None] // size == key[None, :] // size)[None, None]


class ChunkedReplacesDocuments(ChunkedLM):
    def mask(self, input_ids, attention_mask, position_ids, past):
        n_new = input_ids.shape[1]
        allowed = causal(n_new, past + n_new, input_ids.device)[None, None]
        return allowed & self.chunks(n_new, past)  # BUG: chunked_replaces_documents (the document mask is dropped)


# ---------------------------------------------------------------------------------------------
# flash-attn's varlen convention: `cu_seqlens` holds each document's start offset, then the total
# ---------------------------------------------------------------------------------------------

class VarlenLM(Decoder):
    def __init__(self, config: Config):
        super().__init__(config, PackedAttention)

    def forward(self, input_ids, cu_seqlens=None, max_seqlen=None, **kwargs) -> LMOutput:
        batch, n_pos = input_ids.shape
        index = torch.arange(n_pos, device=input_ids.device)
        if cu_seqlens is None:
            cu_seqlens = torch.tensor([0, n_pos], device=input_ids.device)
        document = self.document_of(index, cu_seqlens)
        positions = (index - cu_seqlens[document])[None].expand(batch, -1)  # each document from position 0
        allowed = causal(n_pos, n_pos, input_ids.device)[None, None] & same_document(document[None])
        return LMOutput(self.run(input_ids, positions, allowed))

    def document_of(self, index: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """The document of each position: how many document starts after the first are at or before it."""
        return torch.searchsorted(cu_seqlens[1:-1], index, right=True)


class VarlenOffByOne(VarlenLM):
    def document_of(self, index, cu_seqlens):
        return torch.searchsorted(cu_seqlens[1:-1], index)  # BUG: varlen_off_by_one (a start counted in the document before)


# ---------------------------------------------------------------------------------------------
# nanoGPT style: `forward(idx, targets=None, document_ids=None)`, or EOT tokens found in `idx`
# ---------------------------------------------------------------------------------------------

def fused_attention(q, k, v, attention_mask=None, mask_type="causal"):
    """A fused kernel's interface, as TransformerEngine's: `mask_type` "causal" uses the kernel's own triangle and
    reads no `attention_mask`; "arbitrary" applies the mask given."""
    if mask_type == "causal":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SITE: fused-causal
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)  # SITE: fused-arbitrary


class DocumentAttention(NanoAttention):
    def forward(self, x, allowed, cache=None):
        q, k, v = self.split(x)
        y = fused_attention(q, k, v, allowed, mask_type="arbitrary")
        return self.merge(y)


class CausalKernelAttention(DocumentAttention):
    def forward(self, x, allowed, cache=None):
        q, k, v = self.split(x)
        y = fused_attention(q, k, v, allowed, mask_type="causal")  # BUG: causal_kernel_drops_documents
        return self.merge(y)


class DocumentGPT(GPT):
    def __init__(self, config: GPTConfig, attention=DocumentAttention):
        super().__init__(config, attention)

    def forward(self, idx, targets=None, document_ids=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        if document_ids is None:
            document_ids = torch.zeros_like(idx)
        allowed = causal(t, t, idx.device)[None, None] & same_document(document_ids.expand(b, -1))
        logits = self.run(idx, pos, allowed)
        return logits, self.loss(logits, targets)


class SeparatorGPT(GPT):
    """Documents end at the end-of-text token (nanoGPT's data layout appends it to every document)."""

    def __init__(self, config: GPTConfig):
        super().__init__(config, DocumentAttention)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        is_eot = (idx == self.config.eot_token).long()
        allowed = causal(t, t, idx.device)[None, None] & same_document(is_eot.cumsum(-1) - is_eot)
        logits = self.run(idx, pos, allowed)
        return logits, self.loss(logits, targets)


def _hf(model_class=PackedLM, **overrides):
    return randomise(model_class(Config(**overrides)))


def hf_packed():
    return _hf()


def hf_chunked():
    return _hf(ChunkedLM, attention_chunk_size=8)


def varlen_packed():
    return _hf(VarlenLM)


def nano_document_ids():
    return randomise(DocumentGPT(GPTConfig()))


def nano_doc_sep():
    return randomise(SeparatorGPT(GPTConfig()))


def packing_needs_no_mask():
    return _hf(PackingNeedsNoMask)


def causal_kernel_drops_documents():
    return randomise(DocumentGPT(GPTConfig(), CausalKernelAttention))


def eos_keyed_mask():
    return _hf(EosKeyedMask)


def positions_reset_only():
    return _hf(PositionsResetOnly)


def chunked_replaces_documents():
    return _hf(ChunkedReplacesDocuments, attention_chunk_size=8)


def eos_over_masks():
    return _hf(EosOverMasks)


def varlen_off_by_one():
    return _hf(VarlenOffByOne)
