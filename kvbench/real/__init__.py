"""Real decoding on a GPU (or CPU): the model runner behind the engine loop, its decode and
prefill steps, KV copies, sampling, and the collectors that watch the device during a run
(`run.run_real`).
"""
