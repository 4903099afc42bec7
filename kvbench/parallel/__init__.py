"""Tensor parallelism across the GPUs of one host: one model split over N processes.

Megatron-style: attention heads (and with them the KV arena) and the MLP's inner width are
split across ranks; the scheduler, the allocator and sampling stay on rank 0, which drives
the other ranks forward by forward. See docs/TENSOR_PARALLEL.md.

    sizes.py     what N must divide (torch-free: config validation uses it)
    layers.py    TensorParallel (a rank's place), column- and row-parallel linears
    shard.py     a rank's slice of the full model's weights (seeded presets, checkpoints)
    channel.py   rank 0 -> workers: commands, a forward's inputs
    launcher.py  spawning the workers and joining the process group
    worker.py    the loop ranks 1..N-1 run
    runner.py    ParallelModel and ParallelRunner: rank 0's model and runner
    session.py   the Session seam real runs build on: LocalSession (one process), or
                 ParallelSession (rank 0's handle on N: arenas, runners, commands, shutdown)
"""
