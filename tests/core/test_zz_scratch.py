import time, torch, cProfile, pstats
from spyglass.core.sampling_params import SamplingParams

def test_scratch(make_tiny_engine, run_engine, count_preemptions, tiny_llama_checkpoint):
    tok = tiny_llama_checkpoint.tokenizer
    texts = ["Hello world", "The quick brown fox jumps over the lazy dog. " * 8, "def f(x):\n    return x", "你好，世界！今天天气很好。", "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 3, "1 2 3 4"]
    prompts = [tok.encode(t) for t in texts]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)
    eng = make_tiny_engine(num_kv_blocks=16, block_size=8, max_num_batched_tokens=32)
    c = count_preemptions(eng)
    pr = cProfile.Profile(); pr.enable()
    t = time.time()
    out = run_engine(eng, prompts, params)
    pr.disable()
    print(time.time() - t, len(c.req_ids), eng.scheduler._step_id, torch.get_num_threads())
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
