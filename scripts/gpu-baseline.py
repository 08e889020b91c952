"""transformers (PyTorch, bf16, CUDA) on the checkpoint and workload of `weft bench profile`: decode steps
of B sequences with `context` cached tokens each (one token per sequence per step, greedy), and one
prefill of `prefill` tokens. Prints a table; --json writes the rows. Run on the GPU host (docs/GPU.md)."""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn, repeats):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", default="1,16,64,256")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--json")
    a = p.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    with torch.inference_mode():
        for b in [int(x) for x in a.batch.split(",")]:
            ids = torch.randint(100, 100000, (b, a.context), device="cuda", generator=gen)
            out = model(ids, use_cache=True)
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

            def step():
                nonlocal tok
                o = model(tok, past_key_values=cache, use_cache=True)
                tok = o.logits[:, -1].argmax(-1, keepdim=True)

            timed(step, 2)  # warm-up
            s = timed(step, a.steps)
            rows.append({"case": f"decode B={b} ctx={a.context}", "tokens_per_step": b, "step_ms": round(s * 1000, 2), "tokens_per_second": round(b / s, 1)})
            del cache, out
            torch.cuda.empty_cache()
        if a.prefill > 0:
            ids = torch.randint(100, 100000, (1, a.prefill), device="cuda", generator=gen)
            fn = lambda: model(ids, use_cache=True).logits[:, -1].argmax(-1)  # noqa: E731
            timed(fn, 1)
            s = timed(fn, 3)
            rows.append({"case": f"prefill {a.prefill}", "tokens_per_step": a.prefill, "step_ms": round(s * 1000, 2), "tokens_per_second": round(a.prefill / s, 1)})
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}, bf16, attention {model.config._attn_implementation}")
    cols = list(rows[0].keys())
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
