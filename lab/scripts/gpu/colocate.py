"""The co-location benchmark's two jobs (lab/scripts/gpu/ksched-colocate.sh runs them).

  python3 colocate.py serve --batch 4 --interval-ms 20 --seconds 20 --out serve.json
                           [--model resnet50|bert|llm] [--load F]
                           [--stream default|side] [--graph] [--gpu-time]
                           [--warm-seconds S]
      ResNet-50 inference (`--model bert`: BERT-base, sequences of 128; `--model llm`: a
      350M-parameter GPT-2-style decoder generating 8 tokens after a 32-token prompt on a
      static KV cache; all with random weights). `--load F` measures a request alone after the warm-up and sets
      the mean arrival interval so that the service is busy F of the time. After a warm-up, requests arrive as a Poisson process; each
      request's latency runs from its arrival to the end of its inference (queueing
      included). Writes the latencies and the measured window (CLOCK_MONOTONIC seconds).
      `--stream side` runs the model on a stream of its own (torch.cuda.Stream(), made at
      the default priority, as serving frameworks do) instead of the legacy default stream;
      the priority the driver reports for it is written as `stream_priority`. `--graph`
      records the forward pass once as a CUDA graph (torch.cuda.graph, global capture mode)
      and replays it per request, as serving engines do: one launch per request, and a
      latency that is GPU time, not Python's launch overhead. `--gpu-time` records a CUDA
      event before and after each request's work on its stream and writes the time between
      them (`gpu_s`): the latency less that is the wait before the work started on the GPU
      (Python, the launch, and another context's time slice or its switch).
      `--warm-seconds S`: S seconds of the same arrivals before the measured window, not
      recorded (time for mmkd's SLO control to settle on the service).
  python3 colocate.py train --seconds 40 --out train.json
                           [--kind bert|resnet152|spin|copy|idle] [--kernel-us US] [--sync-each]
      BERT-base masked-LM training steps (batch 8 x 128, AdamW), back to back
      (`--kind resnet152`: ResNet-152, batch 32, SGD); writes when
      each step ended (CLOCK_MONOTONIC seconds). `--kind spin` and `--kind copy` replace it
      with a synthetic offline job of one kernel, repeated, of about US us each (measured
      at warm-up and written as `kernel_us`): `spin` is torch.cuda._sleep (one thread that
      waits on the clock: no memory traffic, no SMs to speak of), `copy` an elementwise
      multiply over two fp32 buffers sized to take US us (HBM traffic; at 160 us the
      buffers are several times the L2, at 10 us they fit in it).
      A step is as many kernels as make about 25 ms (a BERT step is 26.6 ms of GPU time),
      queued as fast as the CPU launches them, then a synchronize; `--sync-each`
      synchronizes after every kernel instead, so at most one is queued or running.
      `--kind idle` makes its CUDA context and a buffer, then only sleeps: a second context
      on the GPU that never runs (its steps are 25 ms sleeps).

Both print one line to stderr when their warm-up is done, and exit on SIGINT or SIGTERM
cleanly (writing what they measured).
"""
import argparse
import json
import random
import signal
import sys
import time

import torch

stop = False


def on_sigint(*_):
    global stop
    stop = True


def service(args):
    """The request of `--model`: a function that runs one on the current stream."""
    if args.model == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().cuda().eval()
        x = torch.randn(args.batch, 3, 224, 224, device="cuda")
        return lambda: model(x)
    if args.model == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig()
        model = BertModel(config).cuda().eval()
        ids = torch.randint(0, config.vocab_size, (args.batch, 128), device="cuda")
        return lambda: model(input_ids=ids)
    # llm: a GPT-2-medium-sized decoder (24 layers, 1024 wide, 16 heads, about 350M
    # parameters) with random weights in fp16; a request is a 32-token prompt (one forward
    # pass) and 7 more tokens one by one, greedy, each one forward pass on a static KV cache
    # (as production engines keep it), so that a request's shapes never change and the
    # whole request can be captured as one CUDA graph.
    return decoder(args.batch)


def decoder(batch, layers=24, width=1024, heads=16, vocab=50257, prompt_len=32, new=8):
    """A decoder request on a static KV cache: a function that runs prefill and `new - 1`
    decode steps on the current stream and returns the last logits."""
    import torch.nn.functional as F
    from torch import nn

    dt, dev = torch.float16, "cuda"
    hd, total = width // heads, prompt_len + new
    emb = nn.Embedding(vocab, width).to(dev, dt)
    pos = nn.Embedding(total, width).to(dev, dt)
    blocks = [nn.ModuleDict({"ln1": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width),
                             "proj": nn.Linear(width, width), "ln2": nn.LayerNorm(width),
                             "up": nn.Linear(width, 4 * width), "down": nn.Linear(4 * width, width)})
              .to(dev, dt).eval() for _ in range(layers)]
    ln_f = nn.LayerNorm(width).to(dev, dt)
    k_cache = torch.zeros(layers, batch, heads, total, hd, device=dev, dtype=dt)
    v_cache = torch.zeros_like(k_cache)
    prompt = torch.randint(0, vocab, (batch, prompt_len), device=dev)

    def forward(ids, start):
        n = ids.shape[1]
        x = emb(ids) + pos.weight[start:start + n]
        for i, b in enumerate(blocks):
            q, k, v = b["qkv"](b["ln1"](x)).view(batch, n, 3, heads, hd).permute(2, 0, 3, 1, 4)
            k_cache[i, :, :, start:start + n] = k
            v_cache[i, :, :, start:start + n] = v
            keys, values = k_cache[i, :, :, :start + n], v_cache[i, :, :, :start + n]
            a = F.scaled_dot_product_attention(q, keys, values, is_causal=(n > 1))
            x = x + b["proj"](a.transpose(1, 2).reshape(batch, n, width))
            x = x + b["down"](F.gelu(b["up"](b["ln2"](x))))
        return ln_f(x[:, -1:]) @ emb.weight.t()

    def generate():
        logits = forward(prompt, 0)
        for t in range(prompt_len, total - 1):
            logits = forward(logits.argmax(-1), t)
        return logits
    return generate


def serve(args):
    request = service(args)
    stream = torch.cuda.Stream() if args.stream == "side" else torch.cuda.current_stream()
    torch.cuda.set_stream(stream)
    warm = 5 if args.model == "llm" else 30
    with torch.no_grad():
        for _ in range(warm):
            request()
    torch.cuda.synchronize()
    if args.graph:
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            request()
        run = graph.replay
        for _ in range(warm):
            run()
    else:
        def run():
            with torch.no_grad():
                request()
    torch.cuda.synchronize()
    if args.load:
        # The mean time of a request alone, with the service busy `--load` of the time (a
        # pause after each request; a GPU left idle between requests runs them slower than
        # back to back), and the mean arrival interval that keeps it so.
        took = 0.0
        for _ in range(2):
            n, busy = 10 if args.model == "llm" else 40, 0.0
            for _ in range(n):
                t = time.monotonic()
                run()
                torch.cuda.synchronize()
                busy += time.monotonic() - t
                time.sleep(took * (1 - args.load) / args.load)
            took = busy / n
        args.interval_ms = took * 1e3 / args.load
    print(f"serve: warm ({args.model}, a request every {args.interval_ms:.2f} ms)",
          file=sys.stderr, flush=True)
    rng = random.Random(args.seed)
    if args.warm_seconds > 0:
        # Requests as measured below, for this long first, unrecorded: what serves
        # beside it (mmkd's SLO control) settles on this service before it is measured.
        arrival = time.monotonic()
        deadline = arrival + args.warm_seconds
        while not stop:
            arrival += rng.expovariate(1000.0 / args.interval_ms)
            if arrival > deadline:
                break
            now = time.monotonic()
            if now < arrival:
                time.sleep(arrival - now)
            run()
            torch.cuda.synchronize()
    lat, gpu = [], []
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if args.gpu_time else None
    t0, t0_unix = time.monotonic(), time.time()
    arrival = t0
    deadline = t0 + args.seconds
    while not stop:
        arrival += rng.expovariate(1000.0 / args.interval_ms)
        if arrival > deadline:
            break
        now = time.monotonic()
        if now < arrival:
            time.sleep(arrival - now)
        if ev:
            ev[0].record(stream)
        run()
        if ev:
            ev[1].record(stream)
        torch.cuda.synchronize()
        lat.append(time.monotonic() - arrival)
        if ev:
            gpu.append(ev[0].elapsed_time(ev[1]) / 1e3)
    t1 = time.monotonic()
    json.dump({"t0": t0, "t1": t1, "t0_unix": t0_unix, "t1_unix": t0_unix + (t1 - t0), "latencies_s": lat, "batch": args.batch,
               "model": args.model, "interval_ms": args.interval_ms, "stream": args.stream, "graph": args.graph,
               "stream_priority": stream.priority, **({"gpu_s": gpu} if ev else {})},
              open(args.out, "w"))


def train(args):
    if args.kind == "resnet152":
        import torchvision

        model = torchvision.models.resnet152().cuda().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(32, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (32,), device="cuda")

        def loss():
            return torch.nn.functional.cross_entropy(model(x), y)
    else:
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig()
        model = BertForMaskedLM(config).cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, config.vocab_size, (8, 128), device="cuda")

        def loss():
            return model(input_ids=ids, labels=ids).loss
    ends = []

    def step():
        out = loss()
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.item()

    for _ in range(5):
        step()
    print("train: warm", file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.seconds
    while not stop and time.monotonic() < deadline:
        step()
        ends.append(time.monotonic())
    json.dump({"step_ends_s": ends}, open(args.out, "w"))


def synthetic(args):
    """The synthetic offline job: kernels of a known length (see the module's text)."""
    def timed(fn, n):
        fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / n  # us per kernel

    if args.kind == "spin":
        cycles = 100_000
        per_us = cycles / timed(lambda: torch.cuda._sleep(cycles), 50)
        cycles = max(1, round(args.kernel_us * per_us))

        def kernel():
            torch.cuda._sleep(cycles)
    else:
        n = 16 << 20
        a = torch.ones(n, device="cuda")
        b = torch.empty_like(a)
        n = max(1024, round(n * args.kernel_us / timed(lambda: torch.mul(a, 1.0001, out=b), 20)))
        a = torch.ones(n, device="cuda")
        b = torch.empty_like(a)

        def kernel():
            torch.mul(a, 1.0001, out=b)
    kernel_us = timed(kernel, 50)
    per_step = max(1, round(25_000 / kernel_us))
    return kernel, kernel_us, per_step


def train_synthetic(args):
    if args.kind == "idle":
        torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()

        def kernel():
            time.sleep(0.025)
        kernel_us, per_step = 0.0, 1
    else:
        kernel, kernel_us, per_step = synthetic(args)
    ends = []

    def step():
        for _ in range(per_step):
            kernel()
            if args.sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()

    for _ in range(5):
        step()
    print(f"train: warm ({args.kind}, {kernel_us:.1f} us per kernel, {per_step} per step)",
          file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.seconds
    while not stop and time.monotonic() < deadline:
        step()
        ends.append(time.monotonic())
    json.dump({"step_ends_s": ends, "kind": args.kind, "kernel_us": kernel_us,
               "kernels_per_step": per_step, "sync_each": args.sync_each}, open(args.out, "w"))


def main():
    signal.signal(signal.SIGINT, on_sigint)
    # mmkd stops a job with SIGTERM (lab/scripts/gpu/ksched-mmkd.py): the same clean exit.
    signal.signal(signal.SIGTERM, on_sigint)
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serve", "train"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stream", choices=["default", "side"], default="default")
    p.add_argument("--graph", action="store_true")
    p.add_argument("--warm-seconds", type=float, default=0.0)
    p.add_argument("--gpu-time", action="store_true")
    p.add_argument("--model", choices=["resnet50", "bert", "llm"], default="resnet50")
    p.add_argument("--load", type=float, default=0.0)
    p.add_argument("--kind", choices=["bert", "resnet152", "spin", "copy", "idle"],
                   default="bert")
    p.add_argument("--kernel-us", type=float, default=100.0)
    p.add_argument("--sync-each", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if not 0 <= args.load < 1:
        p.error("--load must be in [0, 1)")
    if args.mode == "train" and args.kind not in ("bert", "resnet152"):
        if args.kernel_us <= 0:
            p.error("--kernel-us must be > 0")
        train_synthetic(args)
    else:
        {"serve": serve, "train": train}[args.mode](args)


if __name__ == "__main__":
    main()
