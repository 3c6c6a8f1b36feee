"""Run inside an offline job under the interposer, with a gate that cuts GEMMs
(lab/scripts/gpu/ksched-slice-check.sh starts it so):

  python3 ksched-slice-check.py INTERPOSER_SO OUT_JSON

For the three GEMMs of BERT-base's masked-LM head at batch 8 x 128 (fp32; the forward
projection with its bias, and the two gradients), the same shapes once more in fp16 or
bf16, and one accumulating GEMM (beta = 1), it runs each op with the interposer
paused (every hook passes through: the GEMM runs whole) and resumed (cut into pieces), and
writes whether the results are equal bit for bit, the largest difference, the kernel
launches of one cut call, and the time of each (CUDA events, median of 20). Then it runs three BERT training steps resumed, so the
interposer's stats (MMK_KSCHED_STATS) say which cuBLAS entry points a real training step
uses and how many calls were cut.
"""
import ctypes
import json
import statistics
import sys

import torch
import torch.nn.functional as F

so, out = sys.argv[1], sys.argv[2]
lib = ctypes.CDLL(so)
lib.mmk_interposer_set_enabled.argtypes = [ctypes.c_bool]
lib.mmk_interposer_launches.restype = ctypes.c_uint64

torch.manual_seed(0)
dev = "cuda"
tokens, hidden, vocab = 8 * 128, 768, 30522
x = torch.randn(tokens, hidden, device=dev)
w = torch.randn(vocab, hidden, device=dev) * 0.02
b = torch.randn(vocab, device=dev) * 0.02
gy = torch.randn(tokens, vocab, device=dev) * 0.01

c0 = torch.randn(tokens, hidden, device=dev)
x16, w16, b16, gy16 = (t.half() for t in (x, w, b, gy))
xb, wb, gyb = (t.bfloat16() for t in (x, w, gy))

ops = {
    # column-major m x n x k: 30522 x 1024 x 768, cublasLtMatmul with a bias epilogue
    "forward_linear_bias": lambda: F.linear(x, w, b),
    # grad of the input: 768 x 1024 x 30522
    "grad_input_mm": lambda: gy @ w,
    # grad of the weight: 768 x 30522 x 1024
    "grad_weight_mm": lambda: gy.t() @ x,
    # the same shapes in half and bfloat16 precision
    "forward_linear_bias_fp16": lambda: F.linear(x16, w16, b16),
    "grad_input_mm_bf16": lambda: gyb @ wb,
    "grad_weight_mm_fp16": lambda: gy16.t() @ x16,
    # an accumulating GEMM (beta = 1): C + gy @ w, 768 x 1024 x 30522
    "grad_input_addmm_beta1": lambda: torch.addmm(c0, gy, w),
}


def timed(f, reps=20):
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


result = {"tf32": torch.backends.cuda.matmul.allow_tf32, "ops": {}}
for name, f in ops.items():
    lib.mmk_interposer_set_enabled(False)
    whole = f()
    torch.cuda.synchronize()
    t_whole = timed(f)
    lib.mmk_interposer_set_enabled(True)
    before = lib.mmk_interposer_launches()
    cut = f()
    torch.cuda.synchronize()
    launches = lib.mmk_interposer_launches() - before
    t_cut = timed(f)
    result["ops"][name] = {
        "shape": list(whole.shape),
        "bitwise_equal": bool(torch.equal(whole, cut)),
        "dtype": str(whole.dtype),
        # kernel launches of one call resumed: one or two whole, one or more a piece cut
        "launches_cut": launches,
        "max_abs_diff": float((whole.float() - cut.float()).abs().max()),
        "max_abs": float(whole.float().abs().max()),
        "ms_whole": round(t_whole, 4),
        "ms_cut": round(t_cut, 4),
    }
    print(name, result["ops"][name], file=sys.stderr, flush=True)

from transformers import BertConfig, BertForMaskedLM  # noqa: E402

config = BertConfig()
model = BertForMaskedLM(config).cuda().train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, config.vocab_size, (8, 128), device=dev)
losses = []
for _ in range(3):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(float(loss.item()))
result["train_losses"] = losses
json.dump(result, open(out, "w"), indent=1)
