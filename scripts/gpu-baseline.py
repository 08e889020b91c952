"""transformers (PyTorch, bf16, CUDA) on Weft's benchmark checkpoints and workloads, on the GPU host (docs/GPU.md).

--mode steps (the workload of `weft bench profile`): decode steps of B sequences with `context` cached
tokens each (one token per sequence per step, greedy), and one prefill of `prefill` tokens.
--mode serving (the workload of `weft bench`): C random prompts of `prompt-len` tokens, `output-len`
greedy tokens each, through static `generate` (all C in one padded batch) and through continuous
batching (`generate_batch`, paged attention). Output tokens are counted, not assumed.
Prints a table; --json writes the rows."""
import argparse
import contextlib
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


def steps_rows(model, a, gen):
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
    return rows


def static_generate(model, prompts, a):
    """All prompts in one batch; min_new_tokens = output_len, as Weft's bench ignores EOS."""
    ids = torch.tensor(prompts, device="cuda")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.output_len, min_new_tokens=a.output_len, do_sample=False)
    return int(out.shape[0] * (out.shape[1] - ids.shape[1]))


def continuous_batching(model, prompts, a):
    from transformers.generation import GenerationConfig
    cfg = GenerationConfig(max_new_tokens=a.output_len, do_sample=False, eos_token_id=model.config.eos_token_id,
                           pad_token_id=model.config.eos_token_id or 0)
    # The manager is sized for the requests of its first call and kept for the timed second one.
    results = model.generate_batch(inputs=prompts, generation_config=cfg, progress_bar=False, persistent_manager=True)
    return sum(len(r.generated_tokens) for r in results.values())


def measure(kind, run, model, a, prompts_for, mode, reset=lambda: None):
    """Each level runs twice on the same prompts and the second run is timed: the first is its warm-up
    (cuBLAS heuristics; for continuous batching, a manager sized for this level and its CUDA graphs)."""
    rows = []
    with mode():
        for c in [int(x) for x in a.concurrency.split(",")]:
            prompts = prompts_for(c)
            run(model, prompts, a)
            torch.cuda.synchronize()
            start = time.perf_counter()
            generated = run(model, prompts, a)
            torch.cuda.synchronize()
            s = time.perf_counter() - start
            reset()
            rows.append({"case": kind, "concurrency": c, "prompt_len": a.prompt_len, "output_len": a.output_len, "wall_seconds": round(s, 3),
                         "output_tokens": generated, "output_tokens_per_second": round(generated / s, 1)})
            print(rows[-1], flush=True)
    return rows


def serving_rows(model_path, a, gen):
    prompts_for = lambda c: torch.randint(100, 100000, (c, a.prompt_len), generator=gen, device="cuda").tolist()  # noqa: E731
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).cuda().eval()
    rows = measure("static generate", static_generate, model, a, prompts_for, torch.inference_mode)
    del model
    torch.cuda.empty_cache()
    # Continuous batching reads the cache through paged attention; the implementation's name differs between releases.
    for impl in ("paged|sdpa", "sdpa_paged"):
        try:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16, attn_implementation=impl).cuda().eval()
            break
        except Exception as e:  # noqa: BLE001
            print(f"attn_implementation={impl}: {e}")
    print(f"continuous batching: attention {model.config._attn_implementation}", flush=True)
    # Not under inference_mode: the manager's thread updates the tensors it made (it takes no_grad itself).
    return rows + measure("generate_batch", continuous_batching, model, a, prompts_for, contextlib.nullcontext,
                          model.destroy_cached_continuous_batching_manager)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=["steps", "serving"], default="steps")
    p.add_argument("--batch", default="1,16,64,256")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--concurrency", default="1,32,128,512")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--json")
    a = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if a.mode == "serving":
        rows = serving_rows(a.model, a, gen)
    else:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
        rows = steps_rows(model, a, gen)
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}, bf16")
    cols = list(rows[0].keys())
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
