"""A small client over the generated stubs: numpy arrays in and out.

bf16 travels as its bits: numpy has no bfloat16, so a bf16 tensor is a uint16 array of
bfloat16 bit patterns (float32_to_bf16 rounds to nearest even, bf16_to_float32 widens
exactly)."""
import numpy as np

import grpc
from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2

# attnserve's transport settings (see the README): a whole tensor per socket read.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.experimental.tcp_read_chunk_size", 1 << 20),
    ("grpc.experimental.tcp_min_read_chunk_size", 256 << 10),
    ("grpc.experimental.tcp_max_read_chunk_size", 4 << 20),
]


def float32_to_bf16(values):
    """float32 array -> uint16 bf16 bits, rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded = np.where(nan, (bits >> 16) | 0x40, rounded)
    return rounded.astype("<u2")


def bf16_to_float32(bits):
    """uint16 bf16 bits -> float32 (exact)."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def to_tensor(array, dtype="fp32"):
    """A Tensor message from a float array ([L, d] or [n, L, d]); dtype "fp32", or
    "bf16" (float values are rounded; a uint16 array is taken as bf16 bits)."""
    array = np.asarray(array)
    if dtype == "fp32":
        raw = np.ascontiguousarray(array, dtype="<f4").tobytes()
        kind = tensor_pb2.DATA_TYPE_FP32
    elif dtype == "bf16":
        bits = array if array.dtype == np.uint16 else float32_to_bf16(array)
        raw = np.ascontiguousarray(bits, dtype="<u2").tobytes()
        kind = tensor_pb2.DATA_TYPE_BF16
    else:
        raise ValueError(f"dtype must be 'fp32' or 'bf16', got {dtype!r}")
    return tensor_pb2.Tensor(dtype=kind, shape=list(array.shape), raw=raw)


def from_tensor(tensor):
    """The float32 array of a Tensor message (bf16 widened exactly)."""
    shape = tuple(tensor.shape)
    if tensor.dtype == tensor_pb2.DATA_TYPE_FP32:
        return np.frombuffer(tensor.raw, dtype="<f4").reshape(shape).copy()
    if tensor.dtype == tensor_pb2.DATA_TYPE_BF16:
        return bf16_to_float32(np.frombuffer(tensor.raw, dtype="<u2")).reshape(shape)
    raise ValueError(f"unsupported tensor dtype {tensor.dtype}")


class Client:
    """One channel to attnserve. Thread-safe (as gRPC channels are)."""

    def __init__(self, target="localhost:50051", timeout=30.0, options=()):
        self.channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS + list(options))
        self.stub = attention_pb2_grpc.AttentionServiceStub(self.channel)
        self.timeout = timeout

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def attend(self, query, memory=None, model="", causal=False, head_mask=None,
               return_attention=False, dtype="fp32"):
        """Output (float32, the query's shape) and, when asked, the attention weights
        [h, L, L_k] (or [n, h, L, L_k]). Raises grpc.RpcError with the server's status."""
        request = attention_pb2.AttendRequest(
            model=model, query=to_tensor(query, dtype), causal=causal,
            return_attention=return_attention, head_mask=list(head_mask or []))
        if memory is not None:
            request.memory.CopyFrom(to_tensor(memory, dtype))
        reply = self.stub.Attend(request, timeout=self.timeout)
        output = from_tensor(reply.output)
        if return_attention:
            return output, from_tensor(reply.attention)
        return output

    def encode(self, text=None, input_ids=None, model="", truncate=False,
               return_token_ids=False, head_mask=None):
        """An encoder's embeddings, float32 [n, d], of `text` (a string or a list of
        strings, tokenized by the server) or of `input_ids` (a list of token-id lists).
        truncate: cut texts past the model's max_text_tokens instead of failing. With
        return_token_ids, returns (embeddings, the token ids of each text as lists).
        head_mask: one factor in [0, 1] per layer and head, flattened layer by layer
        (transformers' head_mask). Raises grpc.RpcError with the server's status."""
        if (text is None) == (input_ids is None):
            raise ValueError("pass text or input_ids")
        request = attention_pb2.EncodeRequest(model=model, truncate=truncate,
                                              return_token_ids=return_token_ids,
                                              head_mask=head_mask or [])
        if text is not None:
            request.text.extend([text] if isinstance(text, str) else list(text))
        else:
            rows = [list(row) for row in input_ids]
            longest = max(len(row) for row in rows)
            ids = np.zeros((len(rows), longest), dtype="<i8")
            mask = np.zeros((len(rows), longest), dtype="<i8")
            for i, row in enumerate(rows):
                ids[i, :len(row)] = row
                mask[i, :len(row)] = 1
            request.input_ids.CopyFrom(tensor_pb2.Tensor(
                dtype=tensor_pb2.DATA_TYPE_INT64, shape=list(ids.shape), raw=ids.tobytes()))
            request.attention_mask.CopyFrom(tensor_pb2.Tensor(
                dtype=tensor_pb2.DATA_TYPE_INT64, shape=list(mask.shape),
                raw=mask.tobytes()))
        reply = self.stub.Encode(request, timeout=self.timeout)
        embeddings = from_tensor(reply.embedding)
        if not return_token_ids:
            return embeddings
        ids, start = [], 0
        for length in reply.lengths:
            ids.append(list(reply.token_ids[start:start + length]))
            start += length
        return embeddings, ids

    def classify(self, texts, pairs=None, model="", truncate=False, raw_scores=False):
        """A classification model's (a cross-encoder's) scores, float32 [n, labels], of
        `texts` (a string or a list of strings), each paired with pairs[i] when `pairs`
        is given (as many as texts). raw_scores: the head's logits, without the
        activation the model's recipe applies (sigmoid for one label, else softmax).
        Raises grpc.RpcError with the server's status."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        request = attention_pb2.EncodeRequest(model=model, truncate=truncate,
                                              raw_scores=raw_scores, text=texts)
        if pairs is not None:
            request.text_pair.extend([pairs] if isinstance(pairs, str) else list(pairs))
        reply = self.stub.Encode(request, timeout=self.timeout)
        if not reply.HasField("scores"):
            raise ValueError(f"model {reply.model!r} answered no scores: it embeds, and "
                             f"classify needs a classification model (a cross-encoder)")
        return from_tensor(reply.scores)

    def rerank(self, query, documents, model="", top_n=0, truncate=True,
               raw_scores=False):
        """`documents` ranked for `query` by a one-label cross-encoder (the Rerank RPC):
        [(index, score), ...] best first, the best top_n only (0: all). truncate
        (default, as rerank APIs do): cut a pair past the model's max_text_tokens from
        its longer text instead of failing. Raises grpc.RpcError with the server's
        status."""
        request = attention_pb2.RerankRequest(
            model=model, query=query, documents=list(documents), top_n=top_n or 0,
            truncate=truncate, raw_scores=raw_scores)
        reply = self.stub.Rerank(request, timeout=self.timeout)
        return [(r.index, r.score) for r in reply.results]

    def head_statistics(self, query=None, memory=None, model="", causal=False, text=None,
                        head_mask=None):
        """An attention model's heads over `query` (and `memory`):
        [{head, pruned, mean_entropy, mean_max_weight, mean_output_norm}, ...].
        An encoder's over `text` (a string or a list), under `head_mask` (one factor per
        layer and head, flattened) if given: [{layer, head, pruned, mean_entropy,
        mean_max_weight, mean_distance, share_first, share_last, share_self,
        share_previous}, ...], layer by layer. Raises grpc.RpcError with the server's
        status."""
        if (text is None) == (query is None):
            raise ValueError("pass query (an attention model) or text (an encoder)")
        request = attention_pb2.HeadStatisticsRequest(model=model, causal=causal)
        if text is not None:
            request.encode.text.extend([text] if isinstance(text, str) else list(text))
            request.encode.head_mask.extend(head_mask or [])
            fields = ["layer", "head", "pruned", "mean_entropy", "mean_max_weight",
                      "mean_distance", "share_first", "share_last", "share_self",
                      "share_previous"]
        else:
            request.query.CopyFrom(to_tensor(query))
            if memory is not None:
                request.memory.CopyFrom(to_tensor(memory))
            fields = ["head", "pruned", "mean_entropy", "mean_max_weight",
                      "mean_output_norm"]
        reply = self.stub.HeadStatistics(request, timeout=self.timeout)
        return [{field: getattr(h, field) for field in fields} for h in reply.heads]

    def attention_map(self, text, model="", head_mask=None):
        """An encoder's attention over one text, from one forward pass: (tokens, weights),
        the text's tokens as the tokenizer spells them ([CLS] ... [SEP]) and a float32
        array [layers, heads, L, L] (query rows, key columns; a pruned head's are zero).
        Raises grpc.RpcError with the server's status."""
        request = attention_pb2.HeadStatisticsRequest(model=model, return_attention=True)
        request.encode.text.append(text)
        request.encode.head_mask.extend(head_mask or [])
        reply = self.stub.HeadStatistics(request, timeout=self.timeout)
        return list(reply.token_texts), from_tensor(reply.attention)

    def models(self):
        """The served models' descriptions (ModelInfo messages)."""
        reply = self.stub.ListModels(attention_pb2.ListModelsRequest(), timeout=self.timeout)
        return list(reply.models)
