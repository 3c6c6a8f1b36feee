"""The co-location benchmark's two jobs (scripts/gpu/ksched-colocate.sh runs them).

  python3 colocate.py serve --batch 4 --interval-ms 20 --seconds 20 --out serve.json
                           [--stream default|side] [--graph]
      ResNet-50 inference. After a warm-up, requests arrive as a Poisson process; each
      request's latency runs from its arrival to the end of its inference (queueing
      included). Writes the latencies and the measured window (CLOCK_MONOTONIC seconds).
      `--stream side` runs the model on a stream of its own (torch.cuda.Stream(), made at
      the default priority, as serving frameworks do) instead of the legacy default stream;
      the priority the driver reports for it is written as `stream_priority`. `--graph`
      records the forward pass once as a CUDA graph (torch.cuda.graph, global capture mode)
      and replays it per request, as serving engines do: one launch per request, and a
      latency that is GPU time, not Python's launch overhead.
  python3 colocate.py train --seconds 40 --out train.json
      BERT-base masked-LM training steps (batch 8 x 128, AdamW), back to back; writes when
      each step ended (CLOCK_MONOTONIC seconds).

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


def serve(args):
    import torchvision

    model = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda")
    stream = torch.cuda.Stream() if args.stream == "side" else torch.cuda.current_stream()
    torch.cuda.set_stream(stream)
    with torch.no_grad():
        for _ in range(30):
            model(x)
    torch.cuda.synchronize()
    if args.graph:
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            model(x)
        run = graph.replay
    else:
        def run():
            with torch.no_grad():
                model(x)
    for _ in range(30):
        run()
    torch.cuda.synchronize()
    print("serve: warm", file=sys.stderr, flush=True)
    rng = random.Random(args.seed)
    lat = []
    t0 = time.monotonic()
    arrival = t0
    deadline = t0 + args.seconds
    while not stop:
        arrival += rng.expovariate(1000.0 / args.interval_ms)
        if arrival > deadline:
            break
        now = time.monotonic()
        if now < arrival:
            time.sleep(arrival - now)
        run()
        torch.cuda.synchronize()
        lat.append(time.monotonic() - arrival)
    t1 = time.monotonic()
    json.dump({"t0": t0, "t1": t1, "latencies_s": lat, "batch": args.batch,
               "interval_ms": args.interval_ms, "stream": args.stream, "graph": args.graph,
               "stream_priority": stream.priority}, open(args.out, "w"))


def train(args):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig()
    model = BertForMaskedLM(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (8, 128), device="cuda")
    ends = []

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.loss.item()

    for _ in range(5):
        step()
    print("train: warm", file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.seconds
    while not stop and time.monotonic() < deadline:
        step()
        ends.append(time.monotonic())
    json.dump({"step_ends_s": ends}, open(args.out, "w"))


def main():
    signal.signal(signal.SIGINT, on_sigint)
    # mmkd stops a job with SIGTERM (scripts/gpu/ksched-mmkd.py): the same clean exit.
    signal.signal(signal.SIGTERM, on_sigint)
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serve", "train"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stream", choices=["default", "side"], default="default")
    p.add_argument("--graph", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    {"serve": serve, "train": train}[args.mode](args)


if __name__ == "__main__":
    main()
