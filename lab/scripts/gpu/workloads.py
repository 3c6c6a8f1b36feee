"""The MMK paper's Table III workloads, as a worker that `mmk-lab measure` drives.

  python3 lab/scripts/gpu/workloads.py list             -> the workload names, one per line
  python3 lab/scripts/gpu/workloads.py worker           -> the measurement worker (below)
  python3 lab/scripts/gpu/workloads.py time NAME BATCH  -> one workload alone, ms per iteration

Models come from torchvision (CNNs), transformers (BERT-base) and torch.nn (Transformer),
with random weights (the GPU machine has no internet), fp32, built on the GPU. Inference
workloads are online jobs (one iteration = one batch served; its time is the request's
latency); training workloads are offline jobs (one iteration = one optimizer step).

The worker speaks the protocol of docs/measure.md: one JSON object per line on stdin, one
reply per line on stdout; everything else goes to stderr.

  {"op": "prepare", "workload": "resnet50-inf", "batch": 32}
      build the model (kept for later), run 3 iterations; reply
      {"ok": true, "class": "online", "mem_bytes": PEAK}
  {"op": "measure", "workload": ..., "batch": ..., "start": T0, "end": T1}
      run iterations back to back from now until the first one that ends after T1
      (CLOCK_MONOTONIC seconds); reply {"ok": true, "iters": [[END, SECONDS], ...]} with
      every iteration that ended inside [T0, T1]; with "profile": true (mmk-lab measure
      --deep, under ncu --profile-from-start off) the CUDA profiler is started at the
      first iteration that begins inside the window and stopped after the last
  {"op": "drop"}   free every model built so far; reply {"ok": true}
  {"op": "info"}   reply with the software's versions (recorded with the measurements)
                   and the GPU's SM count ("sms")
  {"op": "quit"}   exit
A failure (out of memory, an unknown workload) is replied as {"ok": false, "error": "..."}
and the worker goes on.
"""
import json
import sys
import time

import torch

# name -> (builder, class); the batch sizes are the caller's (Table III lists them).
WORKLOADS = {}


def workload(name, cls):
    def register(fn):
        WORKLOADS[name] = (fn, cls)
        return fn

    return register


def images(batch):
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    return x, y


def cnn_infer(ctor):
    def build(batch):
        model = ctor().cuda().eval()
        x, _ = images(batch)

        def step():
            with torch.inference_mode():
                model(x)

        return step

    return build


def cnn_train(ctor):
    def build(batch):
        model = ctor().cuda().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        x, y = images(batch)

        def step():
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    return build


def tv(name):
    import torchvision

    return getattr(torchvision.models, name)


def bert_train(batch):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig()  # BERT-base shape
    model = BertForMaskedLM(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, 128), device="cuda")

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


class Seq2Seq(torch.nn.Module):
    """The base Transformer of Vaswani et al. (d_model 512, 6 + 6 layers), 32k vocabulary."""

    def __init__(self, vocab=32000, d=512):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.core = torch.nn.Transformer(d_model=d, batch_first=True)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, src, tgt):
        return self.head(self.core(self.embed(src), self.embed(tgt)))


def seq_batch(batch, vocab=32000, length=128):
    src = torch.randint(0, vocab, (batch, length), device="cuda")
    tgt = torch.randint(0, vocab, (batch, length), device="cuda")
    return src, tgt


def transformer_infer(batch):
    model = Seq2Seq().cuda().eval()
    src, tgt = seq_batch(batch)

    def step():
        with torch.inference_mode():
            model(src, tgt)

    return step


def transformer_train(batch):
    model = Seq2Seq().cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    src, tgt = seq_batch(batch)

    def step():
        out = model(src, tgt)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def torchvision_job(kind, name):
    """A builder for torchvision's `name` (imported only when a job is built)."""
    return lambda batch: kind(tv(name))(batch)


for _name, _tv in [("vgg16", "vgg16"), ("mobilenet", "mobilenet_v2"), ("resnet18", "resnet18"),
                   ("densenet121", "densenet121"), ("vgg19", "vgg19"), ("resnet50", "resnet50")]:
    workload(f"{_name}-inf", "online")(torchvision_job(cnn_infer, _tv))
for _name in ["resnet152", "densenet201", "densenet121", "vgg19", "resnet50"]:
    workload(f"{_name}-train", "offline")(torchvision_job(cnn_train, _name))
workload("bert-train", "offline")(bert_train)
workload("transformer-inf", "online")(transformer_infer)
workload("transformer-train", "offline")(transformer_train)


def sync():
    torch.cuda.synchronize()


class Worker:
    def __init__(self):
        self.built = {}

    def get(self, name, batch):
        key = (name, batch)
        if key not in self.built:
            if name not in WORKLOADS:
                raise KeyError(f"unknown workload {name!r}")
            if not isinstance(batch, int) or batch < 1:
                raise ValueError(f"batch must be a positive integer, not {batch!r}")
            self.built[key] = WORKLOADS[name][0](batch)
        return self.built[key]

    def prepare(self, req):
        torch.cuda.reset_peak_memory_stats()
        step = self.get(req["workload"], req["batch"])
        for _ in range(3):
            step()
        sync()
        return {"class": WORKLOADS[req["workload"]][1],
                "mem_bytes": torch.cuda.max_memory_reserved()}

    def measure(self, req):
        step = self.get(req["workload"], req["batch"])
        t0, t1 = float(req["start"]), float(req["end"])
        profile = bool(req.get("profile"))
        profiling = False
        iters = []
        begin = time.monotonic()
        while True:
            if profile and not profiling and begin >= t0:
                # mmk-lab measure --deep: ncu profiles from the window's first iteration.
                torch.cuda.profiler.start()
                profiling = True
            step()
            sync()
            end = time.monotonic()
            if t0 <= end <= t1:
                iters.append([end, end - begin])
            if end > t1:
                break
            begin = end
        if profiling:
            torch.cuda.profiler.stop()
        return {"iters": iters}

    def info(self, _req):
        import platform

        import torchvision

        return {"python": platform.python_version(), "torch": torch.__version__,
                "torchvision": torchvision.__version__, "cuda": str(torch.version.cuda),
                "cudnn": str(torch.backends.cudnn.version()),
                "device": torch.cuda.get_device_name(0), "precision": "fp32",
                "sms": str(torch.cuda.get_device_properties(0).multi_processor_count)}

    def drop(self, _req):
        self.built.clear()
        torch.cuda.empty_cache()
        return {}


def worker():
    w = Worker()
    ops = {"prepare": w.prepare, "measure": w.measure, "drop": w.drop, "info": w.info}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if req.get("op") == "quit":
                break
            reply = ops[req["op"]](req)
            reply["ok"] = True
        except torch.cuda.OutOfMemoryError as e:
            w.drop(None)
            reply = {"ok": False, "error": f"out of GPU memory: {str(e).splitlines()[0]}"}
        except Exception as e:  # noqa: BLE001 - every failure is reported, the worker goes on
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


def main():
    torch.backends.cudnn.benchmark = False
    mode = sys.argv[1] if len(sys.argv) > 1 else "worker"
    if mode == "list":
        for name, (_, cls) in WORKLOADS.items():
            print(name, cls)
    elif mode == "worker":
        worker()
    elif mode == "time":
        step = Worker().get(sys.argv[2], int(sys.argv[3]))
        for _ in range(3):
            step()
        sync()
        t = time.monotonic()
        for _ in range(10):
            step()
        sync()
        print(f"{(time.monotonic() - t) * 100:.2f} ms")
    else:
        sys.exit(f"unknown mode {mode!r}: list, worker or time")


if __name__ == "__main__":
    main()
